"""`EngineAPI`: what an embedded `psoup.Engine` and a networked `psoup.Client` both offer.

Code written against this protocol runs embedded or against a server by changing the
one line that makes the object (docs/api.md). The server's operation table
(psoup.server.ops) calls exactly these methods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, overload

import numpy as np
from numpy.typing import NDArray

from psoup.options import ColumnTypeName

if TYPE_CHECKING:
    from psoup.results.result import Changes, Result


class EngineAPI(Protocol):
    """The engine's public methods (psoup.engine.Engine documents each)."""

    def execute(self, sql: str) -> str | Result | None: ...

    def streams(self) -> list[str]: ...

    def describe(self, name: str) -> dict[str, Any]: ...

    def drop_stream(self, name: str, cascade: bool = False) -> None: ...

    def create_stream(self, name: str, columns: Mapping[str, ColumnTypeName]
                      | Sequence[tuple[str, ColumnTypeName]],
                      retain: str | None = None) -> None: ...

    def insert(self, stream: str, rows: Any, ts: Any = None, *, producer: str | None = None,
               seq: int | None = None) -> NDArray[np.int64]: ...

    def last_seq(self, producer: str) -> int: ...

    def register(self, sql: str) -> str: ...

    @overload
    def invoke(self, handle: str, now: float | None = None, since: None = None) -> Result: ...

    @overload
    def invoke(self, handle: str, now: float | None = None, *, since: str) -> Changes: ...

    @overload
    def invoke(self, handle: str, now: float | None = None,
               since: str | None = None) -> Result | Changes: ...

    def unregister(self, handle: str) -> None: ...

    def queries(self) -> list[tuple[str, str]]: ...

    def stats(self) -> dict[str, Any]: ...

    def history(self, handles: Sequence[str] | None = None) -> str: ...

    def history_status(self, job: str | None = None) -> dict[str, Any]: ...

    def history_cancel(self, job: str) -> dict[str, Any]: ...

    def evaluate_history(self, handles: Sequence[str] | None = None) -> dict[str, int]: ...

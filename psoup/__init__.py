"""psoup: streaming queries over streaming data, after PSoup (Chandrasekaran & Franklin,
VLDB Journal 2003).

Queries and data are two streams that the engine joins: a new query is applied to the
data already stored, a new tuple to every query already stored, and the matches are kept
so that invoking a query's handle is a lookup over its window.

Example:
    >>> import psoup
    >>> eng = psoup.Engine()
    >>> eng.execute("CREATE STREAM R (a INT, name TEXT)")
    >>> h = eng.register("SELECT name FROM R WHERE a > 1")
    >>> _ = eng.insert("R", [(1, "x"), (3, "y")], ts=[100.0, 101.0])
    >>> eng.invoke(h, now=102.0).rows
    [('y',)]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from psoup.errors import (
    ApplyFailed,
    Busy,
    CursorExpired,
    CursorInvalid,
    DiskFull,
    HistoryPending,
    LimitError,
    PSoupError,
    QueryError,
    SchemaError,
    SequenceError,
    UnknownHandle,
)
from psoup.version import __version__

if TYPE_CHECKING:
    from psoup.client import Client
    from psoup.engine import MODES, Engine
    from psoup.results.result import Result

#: Imported on first use (PEP 562), so that `import psoup` (every CLI command) does not
#: load the engine: name -> module.
_LAZY = {"Engine": "psoup.engine", "MODES": "psoup.engine", "Client": "psoup.client",
         "Result": "psoup.results.result"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'psoup' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

__all__ = ["Engine", "Client", "MODES", "Result", "PSoupError", "QueryError", "SchemaError",
           "LimitError", "UnknownHandle", "CursorExpired", "CursorInvalid", "ApplyFailed",
           "SequenceError", "HistoryPending", "Busy", "DiskFull", "__version__"]

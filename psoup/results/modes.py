"""The engine modes of PSoup Sect. 5, by name: what each materializes.

* "partial", PSoup-P (the default): WHERE clauses materialized in a bitmap, windows
  applied at invocation;
* "complete", PSoup-C: each query's results in its own ordered list, join entries
  ordered as they arrive (fastest invocation, slowest ingest);
* "nomat", NoMat: nothing materialized; every invocation runs its query.

A new mode is a new entry here: its selection structure (a psoup.results.base
ResultsStructure) and how its join groups order their entries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from psoup.results.base import ResultsStructure
from psoup.results.complete import CompleteResults
from psoup.results.nomat import NoMatResults
from psoup.results.partial import PartialResults


@dataclass(frozen=True)
class Mode:
    """One engine mode.

    Attributes:
        name: what `Engine(mode=...)` takes.
        paper: its name in the paper.
        selections: the selection structure for a given storage chunk size.
        eager_joins: join entries are ordered as they arrive (else at the next read).
        materializes: matches are kept as queries and data arrive (else every
            invocation evaluates its query, and the eddy probes nothing).
    """

    name: str
    paper: str
    selections: Callable[[int], ResultsStructure]
    eager_joins: bool
    materializes: bool = True


#: Every mode, by name, the default first.
MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("partial", "PSoup-P", PartialResults, eager_joins=False),
    Mode("complete", "PSoup-C", lambda chunk_rows: CompleteResults(), eager_joins=True),
    Mode("nomat", "NoMat", lambda chunk_rows: NoMatResults(), eager_joins=False,
         materializes=False),
)}

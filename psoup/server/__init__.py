"""The psoup network service: one Engine behind the msgpack-over-TCP protocol of
docs/protocol.md, for clients that register a query, disconnect, and invoke it later.

`Server` serves an Engine (in a thread, or on a running asyncio loop); `run_server` is
what `psoup serve` runs; `protocol` holds the framing and encodings shared with
`psoup.client`.
"""

from typing import TYPE_CHECKING, Any

from psoup.server.ops import Limits

if TYPE_CHECKING:
    from psoup.server.server import Server, run_server

__all__ = ["Limits", "Server", "run_server"]


def __getattr__(name: str) -> Any:
    """Server and run_server on first use: a client imports this package's protocol
    and ops, and need not load the engine (PEP 562)."""
    if name in ("Server", "run_server"):
        from psoup.server import server
        return getattr(server, name)
    raise AttributeError(f"module 'psoup.server' has no attribute {name!r}")

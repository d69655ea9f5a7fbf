"""The psoup network service: one Engine behind the msgpack-over-TCP protocol of
docs/protocol.md, for clients that register a query, disconnect, and invoke it later.

`Server` serves an Engine (in a thread, or on a running asyncio loop); `run_server` is
what `psoup serve` runs; `protocol` holds the framing and encodings shared with
`psoup.client`.
"""

from psoup.server.ops import Limits
from psoup.server.server import Server, run_server

__all__ = ["Limits", "Server", "run_server"]

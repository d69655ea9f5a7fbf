"""Where psoup keeps client-side state, and the service's defaults.

The config directory holds the handles a user named (`psoup register --name`) and the
tokens of servers started on this machine, so the command line works from a new shell
days later. `PSOUP_CONFIG_DIR` overrides the platform's user config directory.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7070

#: The engine modes by name (psoup.engine.MODES, here so that the command line need not
#: load the engine to offer them; a test keeps the two equal).
ENGINE_MODES = ("partial", "complete", "nomat")

#: Rows per replayed slice by default (psoup.spark.replay, here for the same reason).
REPLAY_SLICE_ROWS = 1 << 19


def config_dir() -> Path:
    """The user's psoup config directory (created on demand by writers, not here)."""
    override = os.environ.get("PSOUP_CONFIG_DIR")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "psoup"


def token_path(host: str, port: int) -> Path:
    """Where a server on this machine leaves its generated token for local clients."""
    return config_dir() / "tokens" / f"{host}_{port}"


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by the owner only (mode 0600), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def parse_address(address: str) -> tuple[str, int]:
    """'host:port', 'host' or ':port' -> (host, port), with the defaults filled in.

    Example:
        >>> parse_address("127.0.0.1:7071")
        ('127.0.0.1', 7071)
        >>> parse_address(":8000")
        ('127.0.0.1', 8000)
    """
    host, sep, port = address.rpartition(":")
    if not sep:
        return address or DEFAULT_HOST, DEFAULT_PORT
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"bad server address {address!r}: the port must be a number") from None
    if not 0 < number < 65536:
        raise ValueError(f"bad server address {address!r}: port {number} out of range")
    return host or DEFAULT_HOST, number

"""The client-side handle store: names a user gave to handles, and the last cursor of each
handle, so `psoup invoke slow-lane3 --changes` works days later from a new shell.

PSoup's disconnected clients (Sect. 1) hold nothing but a handle; this file is where the
command line keeps it. One small JSON document under the user's config directory::

    {"version": 1,
     "names":   {"slow-lane3": {"server": "127.0.0.1:7070", "handle": "...",
                                "sql": "SELECT ...", "created": 1767225600.0}},
     "cursors": {"127.0.0.1:7070": {"<handle>": "<cursor>"}}}

Every change is a read-modify-write under an exclusive `flock` on a lock file next to it,
and the new document replaces the old one atomically with owner-only permissions, so
concurrent `psoup` processes neither lose each other's updates nor leave half a file. A
corrupt file is reported, never silently replaced: it may hold names the user still needs.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from psoup.config import config_dir, write_private
from psoup.errors import PSoupError

VERSION = 1


class HandleStoreError(PSoupError):
    """The handle store cannot be read or holds something it should not."""

    code = "handle_store"


def name_taken(name: str, entry: dict[str, Any]) -> HandleStoreError:
    """The error for naming a handle with a name that `entry` already holds."""
    return HandleStoreError(f"the name '{name}' is taken (handle {entry['handle']} "
                            f"on {entry['server']}); choose another or pass --replace")


class HandleStore:
    """Names and cursors of handles, persisted in `path` (default: config_dir()/handles.json).

    Each method reads the file afresh, so two stores on the same path (two shells) see
    each other's changes.

    Example:
        >>> import tempfile
        >>> store = HandleStore(Path(tempfile.mkdtemp()) / "handles.json")
        >>> store.remember("slow", "127.0.0.1:7070", "h1", "SELECT a FROM R")["handle"]
        'h1'
        >>> store.set_cursor("127.0.0.1:7070", "h1", "c1")
        >>> store.cursor("127.0.0.1:7070", "h1"), store.lookup("slow")["sql"]
        ('c1', 'SELECT a FROM R')
    """

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path is not None else config_dir() / "handles.json"
        self._lock_path = self.path.with_name(self.path.name + ".lock")

    # ------------------------------------------------------------------ names

    def lookup(self, name: str) -> dict[str, Any] | None:
        """The entry of `name` ({"server", "handle", "sql", "created"}), or None."""
        entry: dict[str, Any] | None = self._read()["names"].get(name)
        return entry

    def names(self) -> dict[str, dict[str, Any]]:
        """Every named handle: name -> entry."""
        names: dict[str, dict[str, Any]] = self._read()["names"]
        return names

    def remember(self, name: str, server: str, handle: str, sql: str,
                 replace: bool = False) -> dict[str, Any]:
        """Name `handle` on `server`; returns the new entry.

        Raises:
            HandleStoreError: `name` is taken and `replace` is False (checked under the
                lock, so of two processes taking the same name one fails).
        """
        entry = {"server": server, "handle": handle, "sql": sql, "created": time.time()}
        with self._update() as doc:
            old = doc["names"].get(name)
            if old is not None and not replace:
                raise name_taken(name, old)
            doc["names"][name] = entry
        return entry

    def forget_handle(self, server: str, handle: str) -> list[str]:
        """Drop every name of `handle` on `server` and its cursor; returns the names."""
        with self._update() as doc:
            gone = [n for n, e in doc["names"].items()
                    if e["server"] == server and e["handle"] == handle]
            for name in gone:
                del doc["names"][name]
            cursors = doc["cursors"].get(server, {})
            cursors.pop(handle, None)
            if not cursors:
                doc["cursors"].pop(server, None)
        return gone

    # ------------------------------------------------------------------ cursors

    def cursor(self, server: str, handle: str) -> str | None:
        """The cursor of the last invocation of `handle` on `server`, or None."""
        cursor: str | None = self._read()["cursors"].get(server, {}).get(handle)
        return cursor

    def set_cursor(self, server: str, handle: str, cursor: str | None) -> None:
        """Remember `cursor` as the last one of `handle` on `server` (None forgets it)."""
        with self._update() as doc:
            cursors = doc["cursors"].setdefault(server, {})
            if cursor is None:
                cursors.pop(handle, None)
            else:
                cursors[handle] = cursor

    # ------------------------------------------------------------------ the file

    def _read(self) -> dict[str, Any]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {"version": VERSION, "names": {}, "cursors": {}}
        except OSError as exc:
            raise HandleStoreError(f"cannot read the handle store {self.path}: "
                                   f"{exc.strerror or exc}") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise HandleStoreError(
                f"the handle store {self.path} is corrupt (line {exc.lineno}, column "
                f"{exc.colno}: {exc.msg}); repair or move it away (it may hold names you "
                "still need)") from None
        if not (isinstance(doc, dict) and isinstance(doc.get("names"), dict)
                and isinstance(doc.get("cursors"), dict)):
            raise HandleStoreError(
                f"the handle store {self.path} is not a psoup handle store (expected an "
                "object with 'names' and 'cursors'); repair or move it away")
        if doc.get("version", VERSION) > VERSION:
            raise HandleStoreError(f"the handle store {self.path} was written by a newer "
                                   f"psoup (version {doc['version']}); upgrade psoup")
        return doc

    @contextmanager
    def _update(self) -> Iterator[dict[str, Any]]:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            doc = self._read()
            yield doc
            doc["version"] = VERSION
            write_private(self.path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
        finally:
            os.close(fd)        # closing the descriptor releases the lock

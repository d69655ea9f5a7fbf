"""psoup's version, in a module of its own: the server's hello and the CLI's --version
read it without importing the package root (`psoup/__init__.py` re-exports it).

It is the `version` of pyproject.toml.
"""

from __future__ import annotations

__version__ = "0.1.0"

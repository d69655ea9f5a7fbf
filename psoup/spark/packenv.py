"""A packed Python environment for Spark executors whose Python lacks psoup's
dependencies: `psoup spark pack-env` builds it, `--spark-env` ships it.

psoup's own modules reach a cluster's executors as a zip (`session.package_zip`), but
the code they run there (import's and reshape's writers, history's Query SteM, replay's
readers, pyspark's Arrow exchange) also imports numpy, pyarrow, numba, pandas and the
rest. `build` makes a fresh virtual environment holding exactly those distributions, at
the versions installed here (so the driver and the executors compute with the same
code), and writes it as a .tar.gz. `settings` are the Spark settings that give it to
the executors: `spark.archives` unpacks it as the folder `psoup_env` in each executor's
working directory and `spark.pyspark.python` runs their Python workers from it.

The environment is a virtual environment, not a whole Python: its `bin/python` links to
the interpreter it was made from, as with venv-pack and the environments Spark's own
documentation packs. So every worker needs that interpreter at the same path (the same
Python image on every machine); what it no longer needs is any installed package.
Building it runs pip, which downloads the wheels (or takes them from pip's cache):
minutes, never on a query's path.
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from psoup.errors import PSoupError
from psoup.fsync import write_whole

#: The folder Spark unpacks the archive as, in each executor's working directory.
ENV_NAME = "psoup_env"

#: The distributions the executors import, besides psoup (shipped as a zip) and pyspark
#: (which each worker's Spark puts on its Python path): psoup's own dependencies that
#: executor code reaches (click is the command line's only) and pandas, which pyspark's
#: Arrow exchange (`mapInArrow`) requires. Their dependencies follow (`requirements`).
EXECUTOR_DISTRIBUTIONS = ("numpy", "pyarrow", "numba", "msgpack", "sortedcontainers",
                          "pandas")

#: What pip says when it cannot reach the package index.
_OFFLINE = re.compile(r"NewConnectionError|Failed to establish a new connection|"
                      r"Temporary failure in name resolution|Network is unreachable|"
                      r"ConnectTimeout|ProxyError")

#: The name of a requirement (PEP 508), before its version, extras and markers.
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class Packed:
    """What `build` wrote: the archive, its size, how many distributions it holds, and
    the seconds it took."""

    path: Path
    size: int
    distributions: int
    seconds: float


def _normal(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(roots: Iterable[str] = EXECUTOR_DISTRIBUTIONS) -> list[str]:
    """`name==version` of `roots` and everything they need, at the versions installed in
    this Python, sorted by name. A requirement that only an extra asks for is left out,
    and so is one not installed here (its marker excludes this platform).

    Raises:
        PSoupError: one of `roots` is not installed here.

    Example:
        >>> [r for r in requirements(["numba"]) if r.startswith(("numba", "llvmlite"))] \\
        ...     == [f"llvmlite=={metadata.version('llvmlite')}",
        ...         f"numba=={metadata.version('numba')}"]
        True
    """
    pinned: dict[str, str] = {}
    todo = list(roots)
    for root in todo[:]:
        try:
            metadata.distribution(root)
        except metadata.PackageNotFoundError:
            raise PSoupError(f"{root} is not installed in this Python ({sys.executable}): "
                             "the executors' environment is pinned to what the driver "
                             "runs, so pip install 'psoup[spark]' here first") from None
    while todo:
        try:
            dist = metadata.distribution(todo.pop())
        except metadata.PackageNotFoundError:
            continue
        name = _normal(dist.metadata["Name"])
        if name in pinned:
            continue
        pinned[name] = dist.version
        for requirement in dist.requires or []:
            head, _, marker = requirement.partition(";")
            match = _NAME.match(head)
            if match and "extra" not in marker:
                todo.append(match.group(1))
    return [f"{name}=={version}" for name, version in sorted(pinned.items())]


def settings(archive: str | Path) -> dict[str, str]:
    """The Spark settings that run the executors' Python from the packed environment
    `archive` (made absolute: the driver serves it to the executors).

    Raises:
        PSoupError: `archive` is not a file, or not a .tar.gz, .tgz or .zip.

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile(suffix=".tar.gz") as f:
        ...     got = settings(f.name)
        >>> got["spark.archives"] == f"{f.name}#psoup_env", got["spark.pyspark.python"]
        (True, './psoup_env/bin/python')
    """
    path = Path(archive).expanduser().absolute()
    if not path.name.endswith((".tar.gz", ".tgz", ".zip")):
        raise PSoupError(f"{archive}: not a packed environment (a .tar.gz from "
                         "`psoup spark pack-env`)")
    if not path.is_file():
        raise PSoupError(f"{archive}: no such file (build one with `psoup spark pack-env`)")
    return {"spark.archives": f"{path}#{ENV_NAME}",
            "spark.pyspark.python": f"./{ENV_NAME}/bin/python"}


def build(output: str | Path, python: str | None = None,
          progress: Callable[[str], None] | None = None,
          pip_line: Callable[[str], None] | None = None) -> Packed:
    """Build the packed environment as the file `output` (.tar.gz): a virtual
    environment made from `python` (default: this interpreter) holding `requirements()`.
    The archive holds the environment's folder's contents (`bin/python`, `lib/...`), as
    `spark.archives` expects. All or nothing: it is written under a temporary name and
    renamed at the end, and the environment is built in a temporary folder, removed
    whatever happens.

    `progress` hears each phase ("installing N distributions…") and `pip_line` each line
    pip prints (a download, an install).

    Raises:
        PSoupError: `python` is not a Python of this one's version (the executors' and
            the driver's must agree, as pyspark checks), `venv` or pip failed (the error
            says whether the package index could not be reached), or `output` is not a
            .tar.gz.
    """
    began = time.perf_counter()
    out = Path(output).expanduser().absolute()
    if not out.name.endswith((".tar.gz", ".tgz")):
        raise PSoupError(f"{output}: the packed environment is a .tar.gz; name it so")
    pins = requirements()
    base = _check_python(python or sys.executable)
    say = progress or (lambda message: None)
    work = Path(tempfile.mkdtemp(prefix="psoup-pack-env-"))
    try:
        env = work / ENV_NAME
        say(f"making a virtual environment from {base}…")
        _run([base, "-m", "venv", "--without-pip", str(env)], "venv")
        say(f"installing {len(pins)} distributions with pip…")
        _install(env / "bin" / "python", pins, work, pip_line)
        say(f"writing {out}…")
        _pack(env, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Packed(out, out.stat().st_size, len(pins), time.perf_counter() - began)


def _check_python(python: str) -> str:
    """`python` as a path, checked to be an interpreter of this one's major.minor."""
    found = shutil.which(python)
    if found is None:
        raise PSoupError(f"{python}: no such Python")
    try:
        said = subprocess.run([found, "-c", "import sys; print(*sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise PSoupError(f"{python} does not run as a Python: {exc}") from None
    theirs, ours = tuple(said.split()), (str(sys.version_info[0]), str(sys.version_info[1]))
    if theirs != ours:
        raise PSoupError(f"{python} is Python {'.'.join(theirs)}, and the driver's is "
                         f"{'.'.join(ours)}: pyspark needs the same version on both")
    return found


def _pip(env_python: Path) -> list[str]:
    """The command that runs pip on `env_python`'s environment: this Python's pip
    (--python points it at the environment, which then needs no pip of its own), or,
    where this Python has none, a pip bootstrapped into the environment (ensurepip)."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip", "--python", str(env_python)]
    _run([str(env_python), "-m", "ensurepip", "--default-pip"], "ensurepip")
    return [str(env_python), "-m", "pip"]


def _install(env_python: Path, pins: list[str], work: Path,
             pip_line: Callable[[str], None] | None) -> None:
    """pip install `pins` (wheels only: an executor cannot be expected to compile numba)
    into the environment, its lines passed to `pip_line` as they come."""
    listed = work / "requirements.txt"
    listed.write_text("".join(f"{pin}\n" for pin in pins))
    command = [*_pip(env_python), "install", "--disable-pip-version-check", "--no-input",
               "--only-binary=:all:", "--progress-bar=off", "-r", str(listed)]
    lines: list[str] = []
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    except OSError as exc:
        raise PSoupError(f"cannot run pip: {exc}") from None
    assert proc.stdout is not None
    with proc:
        for line in proc.stdout:
            lines.append(line.rstrip())
            if pip_line is not None and line.strip():
                pip_line(line.strip())
    if proc.returncode != 0:
        raise PSoupError(pip_failure(lines))


def pip_failure(lines: list[str]) -> str:
    """One line saying why pip failed, from what it printed.

    Example:
        >>> pip_failure(["Collecting numpy==2.4.6", "  WARNING: Retrying ... "
        ...     "NewConnectionError(...)", "ERROR: Could not find a version that "
        ...     "satisfies the requirement numpy==2.4.6 (from versions: none)",
        ...     "ERROR: No matching distribution found for numpy==2.4.6"])
        'pip could not download the packages (is the package index reachable from here? \
pip uses its cache when it holds them): ERROR: No matching distribution found for \
numpy==2.4.6'
    """
    errors = [line.strip() for line in lines if line.strip().startswith("ERROR")]
    said = errors[-1] if errors else next((line.strip() for line in reversed(lines)
                                           if line.strip()), "no output")
    if any(_OFFLINE.search(line) for line in lines):
        return ("pip could not download the packages (is the package index reachable "
                f"from here? pip uses its cache when it holds them): {said}")
    return f"pip failed to install the executors' packages: {said}"


def _pack(env: Path, out: Path) -> None:
    """`env`'s contents as the .tar.gz `out`, written whole (`write_whole`): `out` is the
    whole archive or is not touched. Symbolic links stay links (`bin/python` names the
    interpreter the environment was made from)."""
    def write(f: IO[bytes]) -> None:
        with tarfile.open(fileobj=f, mode="w:gz", compresslevel=6) as archive:
            for path in sorted(env.iterdir()):
                archive.add(path, arcname=path.name)
    write_whole(out, write)


def _run(command: list[str], what: str) -> None:
    """Run `command`; its failure as a PSoupError naming `what` and its last words."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        raise PSoupError(f"{what} failed: {exc}") from None
    if done.returncode != 0:
        words = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise PSoupError(f"{what} failed: {words[-1] if words else done.returncode}")

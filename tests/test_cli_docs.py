"""The command lines README.md and docs/cli.md show are ones `psoup` accepts: every
subcommand exists and every option shown is an option of that command (or of `psoup`
itself), so a documented option the CLI lacks fails here. Every code block of README.md
and docs/*.md runs, page by page, as printed, on the sample files `psoup demo
--write-samples` writes (a block that cannot run says why in a `<!-- docs-test: skip
(why) -->` comment, and pytest reports it skipped). Also two ways a command ends: `psoup
watch | head` exits quietly, and a `psoup serve` that cannot bind leaves no data
directory behind."""

from __future__ import annotations

import ast
import doctest
import io
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
import tokenize
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from itertools import dropwhile
from pathlib import Path
from typing import Any
from unittest import mock

import click
import numpy as np
import pytest
from click.testing import CliRunner

import psoup
from psoup.cli.demo import write_samples
from psoup.cli.main import main
from tests.support import free_port

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "docs" / "cli.md"]
PSOUP = [sys.executable, "-m", "psoup.cli.main"]


# ---------------------------------------------------------------------- reading the docs

def code_blocks(text: str) -> list[str]:
    return [textwrap.dedent(indent + body) for indent, body in
            re.findall(r"^( *)```[^\n]*\n(.*?)^ *```", text, re.MULTILINE | re.DOTALL)]


def shown_commands(text: str) -> list[list[str]]:
    """Every `psoup ...` command line of the fenced blocks, as words: in a console block
    only the lines after a `$ ` prompt; a pipe into psoup, a quoted argument spanning
    lines and a trailing # comment allowed."""
    commands = []
    for block in code_blocks(text):
        prompted = any(line.startswith("$ ") for line in block.splitlines())
        pending = ""
        for line in block.splitlines():
            if pending:
                line = pending + "\n" + line
            else:
                if prompted and not line.startswith("$ "):
                    continue                # a console block: the rest is output
                line = line.removeprefix("$ ")
                start = 0 if line.startswith("psoup ") else line.find("| psoup ") + 2
                if start < 2 and not line.startswith("psoup "):
                    continue
                line = line[start:]
            try:
                words = shlex.split(line, comments=True)
            except ValueError:          # an open quote: the argument goes on below
                pending = line
                continue
            pending = ""
            commands.append(words)
        assert not pending, f"unclosed quote in a shown command: {pending!r}"
    return commands


def heading_commands(text: str) -> list[tuple[list[list[str]], str]]:
    """Each `### `psoup ...`` section: the commands its heading names and its prose."""
    sections = []
    for head, body in re.findall(r"^### ([^\n]*)\n(.*?)(?=^##|\Z)", text, re.MULTILINE | re.DOTALL):
        spans = [s for s in re.findall(r"`([^`]+)`", head) if s.startswith("psoup ")]
        if spans:
            sections.append(([shlex.split(s) for s in spans], body))
    return sections


def resolve(words: list[str]) -> tuple[list[click.Command], list[str]]:
    """The command path the words name (psoup first) and the words after it."""
    assert words[0] == "psoup", words
    path: list[click.Command] = [main]
    rest = words[1:]
    ctx = click.Context(main)
    while rest and isinstance(path[-1], click.Group):
        word = rest[0]
        if word.startswith("-"):
            assert path[-1] is main, f"{words}: an option between subcommands"
            option = next((p for p in main.params if word in p.opts), None)
            assert option is not None, f"{words}: psoup has no option {word}"
            assert isinstance(option, click.Option)     # psoup's own params are all options
            rest = rest[1 if option.is_flag else 2:]
            continue
        command = path[-1].get_command(ctx, word)
        if command is None:
            break
        path.append(command)
        rest = rest[1:]
    return path, rest


def options_shown(words: list[str]) -> set[str]:
    """The options in words, synopsis notation ([-o|--format table|csv]) included."""
    found = set()
    for word in words:
        for part in word.strip("[]").split("|"):
            part = part.strip("[]").split("=")[0]
            if re.fullmatch(r"--?[A-Za-z][\w-]*", part):
                found.add(part)
    return found


def options_of(path: list[click.Command]) -> set[str]:
    return {o for p in path[-1].params + main.params for o in p.opts + p.secondary_opts
            if o.startswith("-")} | {"-h", "--help"}


def all_shown() -> list[tuple[str, list[str]]]:
    found = []
    for doc in DOCS:
        text = doc.read_text()
        found += [(doc.name, words) for words in shown_commands(text)]
        for commands, _ in heading_commands(text):
            found += [(doc.name, words) for words in commands]
    return found


def test_the_docs_show_commands_of_every_kind() -> None:
    shown = {resolve(words)[0][-1].name for _, words in all_shown()}
    assert {"serve", "create", "ingest", "register", "invoke", "watch", "shell", "history",
            "replay", "import", "unregister", "stats"} <= shown


@pytest.mark.parametrize("doc,words", all_shown(), ids=lambda v: " ".join(v)[:60]
                         if isinstance(v, list) else v)
def test_every_shown_command_exists_with_the_options_shown(doc: str, words: list[str]) -> None:
    path, rest = resolve(words)
    command = path[-1]
    assert not isinstance(command, click.Group) or not rest or rest[0].startswith("-"), \
        f"{doc}: {' '.join(words)}: {command.name} has no subcommand {rest[0]!r}"
    assert path[-1] is not main or not rest, f"{doc}: {' '.join(words)}: no such command"
    missing = options_shown(rest) - options_of(path)
    assert not missing, f"{doc}: {' '.join(words)}: no option {sorted(missing)}"
    names: list[str] = []
    for c in path[1:]:
        assert c.name is not None       # resolve() found each by its name
        names.append(c.name)
    helped = CliRunner().invoke(main, [*names, "--help"])
    assert helped.exit_code == 0, helped.output


def test_every_option_a_command_section_names_exists() -> None:
    """An option in the prose of `### psoup CMD` is an option of CMD itself, or one of
    psoup's that the section writes before the command (`psoup --server ... CMD`)."""
    for doc in DOCS:
        for commands, body in heading_commands(doc.read_text()):
            paths = [resolve(words)[0] for words in commands]
            known = {o for p in paths for param in p[-1].params for o in param.opts}
            known |= set(re.findall(r"`psoup (--[a-z-]+)", body))
            for span in re.findall(r"`([^`\n]+)`", body):
                first = span.split()[0]
                if re.fullmatch(r"--?[A-Za-z][\w-]*", first):
                    assert first in known, \
                        f"{doc.name}: section {paths[0][-1].name} names {first}, which it lacks"


def test_example_handles_look_like_real_ones() -> None:
    """What `psoup register` prints in the examples, and the handles of the handle store
    example, are 40 hexadecimal digits, as real handles are."""
    text = (ROOT / "docs" / "cli.md").read_text()
    printed = re.findall(r"--name slow-lane3\n(\S+)\n", text)
    stored = (re.findall(r'"handle": "([^"]+)"', text) +
              re.findall(r'"127.0.0.1:7070": \{\s+"(\w+)":', text))
    assert len(printed) == 1 and len(stored) == 2
    for handle in printed + stored:
        assert re.fullmatch(r"[0-9a-f]{40}", handle), handle


# ---------------------------------------------------------------------- servers for the tests

def _env(config: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PSOUP_SERVER", "PSOUP_TOKEN")}
    env.update(PSOUP_CONFIG_DIR=str(config), PYTHONPATH=str(ROOT), **more)
    return env


def _serve(args: list[str], cwd: Path, env: dict[str, str],
           port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(PSOUP + args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120            # a hang, not a slow start, fails
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "psoup serve did not start listening"
            time.sleep(0.05)


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out: str
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return out


# ---------------------------------------------------------------------- how commands end

def test_serve_takes_a_token_that_clients_must_present(tmp_path: Path) -> None:
    port = free_port()
    env = _env(tmp_path / "config")
    serve = _serve(["serve", "--port", str(port), "--token", "s3cret"], tmp_path, env, port)
    try:
        server = ["--server", f"127.0.0.1:{port}"]
        wrong = subprocess.run(PSOUP + server + ["--token", "guess", "queries"], env=env,
                               capture_output=True, text=True, timeout=60)
        right = subprocess.run(PSOUP + server + ["--token", "s3cret", "queries"], env=env,
                               capture_output=True, text=True, timeout=60)
    finally:
        out = _stop(serve)
    assert wrong.returncode == 1 and "refused the connection" in wrong.stderr
    assert right.returncode == 0 and "(0 standing queries)" in right.stdout
    assert "token as given" in out


def test_watch_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    port = free_port()
    env = _env(tmp_path / "config", PSOUP_SERVER=f"127.0.0.1:{port}")
    serve = _serve(["serve", "--port", str(port)], tmp_path, env, port)
    try:
        for words in (["stream", "create", "r", "a INT"],
                      ["register", "SELECT a FROM r", "--name", "all"]):
            subprocess.run(PSOUP + words, env=env, check=True, capture_output=True, timeout=60)
        watch = subprocess.Popen(PSOUP + ["watch", "all", "--every", "50ms"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert watch.stdout is not None and watch.stderr is not None
        watch.stdout.readline()             # the first poll arrived: `head -1` is done
        watch.stdout.close()
        code = watch.wait(timeout=120)
        err = watch.stderr.read().decode()
    finally:
        _stop(serve)
    assert code == 0 and err == ""


def test_serve_that_cannot_bind_leaves_no_data_dir(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(PSOUP + ["serve", "--port", str(port), "--data-dir",
                                       str(tmp_path / "new" / "state")],
                              env=_env(tmp_path / "config"), capture_output=True, text=True,
                              timeout=60)
    assert done.returncode == 1 and "address already in use" in done.stderr.lower()
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "new").exists()


def test_serve_that_cannot_bind_keeps_an_existing_data_dir(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "mine").write_text("keep")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = subprocess.run(PSOUP + ["serve", "--port", str(taken.getsockname()[1]),
                                       "--data-dir", str(tmp_path / "state")],
                              env=_env(tmp_path / "config"), capture_output=True, text=True,
                              timeout=60)
    assert done.returncode == 1
    assert (tmp_path / "state" / "mine").read_text() == "keep"


# ---------------------------------------------------------------------- every block runs

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELLS = {"sh", "bash", "console"}
SHOWN = {"text", "json"}          # displays: synopses, layouts, frames; json must parse
RUNS = SHELLS | {"python", "sql"}
PROGRAMS = {"psoup", "cat", "ls", "head", "tail", "wc", "printf", "echo"}
MARKER = re.compile(r"^\s*<!-- docs-test: (.*?) -->\s*$")
SERVED = "127.0.0.1", 7070       # the address python blocks marked `server` connect to


@dataclass(frozen=True)
class Block:
    page: str
    line: int                     # of the opening fence, from 1
    lang: str
    body: str
    marker: str                   # the `<!-- docs-test: ... -->` just above, or ""

    @property
    def skip(self) -> str | None:
        """Why the block does not run, from `<!-- docs-test: skip (why) -->`."""
        found = re.fullmatch(r"skip \((.+)\)", self.marker)
        return found.group(1) if found else None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def page_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a page, in order, each with the marker comment on the
    nearest non-blank line above its fence."""
    lines = path.read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        opening = re.fullmatch(r"( *)```(\S*)\s*", lines[i])
        if not opening:
            i += 1
            continue
        above = next((line for line in reversed(lines[:i]) if line.strip()), "")
        found = MARKER.match(above)
        end = next(j for j in range(i + 1, len(lines)) if re.fullmatch(r" *```\s*", lines[j]))
        body = textwrap.dedent("\n".join(lines[i + 1:end]) + "\n")
        blocks.append(Block(path.name, i + 1, opening.group(2), body,
                            found.group(1) if found else ""))
        i = end + 1
    return blocks


ALL_BLOCKS = [b for page in PAGES for b in page_blocks(page)]


def test_every_block_says_what_it_is() -> None:
    """A block is code the test runs (python, sh, bash, console, sql) or a display
    (text, json); the only markers are `skip (why)` and `server`."""
    for block in ALL_BLOCKS:
        assert block.lang in RUNS | SHOWN, f"{block}: a block needs a language: " \
            f"one of {sorted(RUNS)}, or text for a synopsis or a layout"
        assert block.marker in ("", "server") or block.skip, \
            f"{block}: unknown marker {block.marker!r}; skip (why) or server"
        assert block.lang in RUNS or not block.marker, f"{block}: a marker on a display"
        if block.lang == "json":
            json.loads(block.body)


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.skip], ids=str)
def test_blocks_marked_skip(block: Block) -> None:
    """Each block that does not run, named and counted by pytest, with the page's why."""
    pytest.skip(f"{block} ({block.lang}): {block.skip}")


# python blocks: one namespace per page, a statement's printed value checked ----------

def comments(code: str) -> dict[int, str]:
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string[1:].strip()
    return found


def shown_value(comment: str) -> tuple[bool, Any]:
    """The value a comment shows, if it is a Python literal (or one before a `: `
    that explains it); `{"a": 1, ...}` shows some of a dict's keys."""
    for text in (comment, comment.split(": ", 1)[0]):
        try:
            return True, ast.literal_eval(text.replace(", ...}", ', "...": ...}'))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return False, None


def matches(actual: Any, shown: Any) -> bool:
    if isinstance(actual, np.ndarray):
        actual = actual.tolist()
    if isinstance(shown, dict):
        keys = set(shown) - {"..."}
        return (isinstance(actual, dict) and keys <= set(actual)
                and (shown.get("...") is Ellipsis or keys == set(actual))
                and all(matches(actual[k], shown[k]) for k in keys))
    if isinstance(shown, (list, tuple)):
        return (isinstance(actual, (list, tuple)) and len(actual) == len(shown)
                and all(matches(a, s) for a, s in zip(actual, shown, strict=True)))
    return bool(type(actual) is type(shown) and actual == shown) or \
        (isinstance(actual, float) and isinstance(shown, float) and actual == shown)


def run_python(block: Block, namespace: dict[str, Any]) -> None:
    """The block as printed, statement by statement; an expression statement whose
    comment shows a literal must evaluate to it. `>>>` blocks run as doctests."""
    if ">>>" in block.body:
        test = doctest.DocTestParser().get_doctest(block.body, namespace, str(block),
                                                   block.page, block.line)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        runner.run(test, clear_globs=False)
        assert not runner.failures, f"{block}: {runner.failures} doctest failures"
        return
    shown = comments(block.body)
    for statement in ast.parse(block.body).body:
        where = f"{block.page}:{block.line + statement.lineno}"
        found, value = shown_value(shown.get(statement.end_lineno or 0, ""))
        try:
            if isinstance(statement, ast.Expr) and found:
                actual = eval(compile(ast.Expression(statement.value), where, "eval"),
                              namespace)
                assert matches(actual, value), f"{where}: shows {value!r}, is {actual!r}"
            else:
                exec(compile(ast.Module([statement], []), where, "exec"), namespace)
        except AssertionError:
            raise
        except Exception as exc:
            raise AssertionError(f"{where}: {ast.unparse(statement)[:80]}: {exc!r}") from exc


# shell blocks: psoup and a few simple programs, in the page's directory --------------

@dataclass
class Command:
    line: str                     # as shown, without the prompt
    shown: list[str]              # the output lines a console block shows after it


def shell_commands(block: Block) -> list[Command]:
    """A console block's `$ ` lines (the lines after each, up to the next, are its
    output); every line of an sh block. A quoted argument may span lines."""
    prompted = block.lang == "console"
    commands: list[Command] = []
    pending = ""
    for line in block.body.splitlines():
        if not pending:
            if prompted and not line.startswith("$ "):
                if commands:
                    commands[-1].shown.append(line)
                continue
            line = line.removeprefix("$ ")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
        line = pending + "\n" + line if pending else line
        try:
            shlex.split(line, comments=True)
        except ValueError:              # an open quote: the argument goes on below
            pending = line
            continue
        pending = ""
        commands.append(Command(line, []))
    assert not pending, f"{block}: unclosed quote in {pending!r}"
    return commands


def pipeline(line: str) -> list[list[str]]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.commenters = "#"
    lexer.whitespace_split = True
    stages: list[list[str]] = [[]]
    for word in lexer:
        if word == "|":
            stages.append([])
        else:
            stages[-1].append(word)
    return stages


class Page:
    """What a page's blocks share: a directory holding the sample files, a server
    when the page starts one, a Python namespace."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.env = _env(directory / "config")
        self.server: subprocess.Popen[str] | None = None
        self.served: list[str] = []
        self.namespace: dict[str, Any] = {"__name__": "__docs__"}
        self.engine = psoup.Engine()            # the SQL blocks' when no server runs
        bin_dir = directory / "bin"
        bin_dir.mkdir()
        (bin_dir / "psoup").write_text(
            f'#!/bin/sh\nexec {sys.executable} -m psoup.cli.main "$@"\n')
        (bin_dir / "psoup").chmod(0o755)
        self.env["PATH"] = f"{bin_dir}{os.pathsep}{self.env.get('PATH', '')}"
        write_samples(directory)

    def serve(self, args: list[str]) -> None:
        """`psoup serve ARGS` in the background, on a free port that PSOUP_SERVER then
        names; an absolute --data-dir is moved under the page's directory."""
        self.stop()
        port = free_port()
        kept: list[str] = []
        for word, before in zip(args, ["", *args], strict=False):
            if "--port" in (word, before):
                continue
            absolute = before == "--data-dir" and word.startswith("/")
            kept.append(str(self.dir / word.lstrip("/")) if absolute else word)
        self.server = _serve(kept + ["--port", str(port)], self.dir, self.env, port)
        self.env["PSOUP_SERVER"] = f"127.0.0.1:{port}"

    def stop(self) -> None:
        if self.server is not None:
            self.served.append(_stop(self.server))
            self.server = None

    def run(self, block: Block, command: Command) -> None:
        stages = [list(dropwhile(lambda w: re.fullmatch(r"\w+=.*", w), words))
                  for words in pipeline(command.line)]       # VAR=value cmd: the cmd
        for words in stages:
            assert words and words[0] in PROGRAMS, (
                f"{block}: `{command.line}`: the test runs only {sorted(PROGRAMS)}; "
                "mark the block <!-- docs-test: skip (why) -->")
        words = stages[-1]
        if words[0] == "psoup" and command.line.startswith("psoup"):
            verb = resolve(words)[0][-1].name
            if verb == "serve":
                self.serve(words[1:])
                return
            if verb == "watch" and "--count" not in words:
                words = words + ["--count", "1"]         # one poll, not until Ctrl-C
            line = shlex.join(words)
        else:
            line = command.line
        shell = words[0] == "psoup" and resolve(words)[0][-1].name == "shell"
        script = shell_script(command.shown) if shell and len(stages) == 1 else ""
        env = dict(self.env)
        if shell and "--server" not in words:
            env.pop("PSOUP_SERVER", None)         # `psoup shell` alone is embedded
        done = subprocess.run(["/bin/sh", "-c", line], cwd=self.dir, env=env, input=script,
                              capture_output=True, text=True, timeout=120)
        check_output(block, command, done)


def shell_script(shown: list[str]) -> str:
    """What a console block types at `psoup> ` and `...> ` prompts."""
    typed = [re.sub(r"^\s*(psoup|\s*\.\.\.)> ?", "", line) for line in shown
             if re.match(r"^\s*(psoup|\.\.\.)>", line.lstrip())]
    return "".join(line + "\n" for line in typed if line.strip())


def check_output(block: Block, command: Command, done: subprocess.CompletedProcess[str]) -> None:
    """The exit code the shown output implies (1 when it shows `error:` lines, as many
    as it shows), and a shown answer with rows is not empty."""
    errors = sum(line.startswith("error:") for line in command.shown)
    got = sum(line.startswith("error:") for line in (done.stdout + done.stderr).splitlines())
    what = f"{block}: `{command.line}` exited {done.returncode}:\n{done.stdout}{done.stderr}"
    assert done.returncode == (1 if errors else 0) and got == errors, what
    shown_rows = re.search(r"^\((\d[\d,]*) rows?\b", "\n".join(command.shown), re.MULTILINE)
    if shown_rows and shown_rows.group(1) != "0":
        rows = re.findall(r"^\((\d[\d,]*) rows?\b", done.stdout, re.MULTILINE)
        assert rows and rows[-1] != "0", f"{what}\nshows {shown_rows.group(0)}"


def run_sql(block: Block, page: Page) -> None:
    """The statements, one per line or ended by `;`: against the page's server when it
    started one (a `psoup shell` script), else the page's own embedded engine."""
    statements = [s.strip() for s in re.split(r";\s*$|\n(?=\S)", block.body, flags=re.M)]
    statements = [s for s in statements if s and not s.startswith("--")]
    if page.server is None:
        for statement in statements:
            try:
                page.engine.execute(statement)
            except psoup.PSoupError as exc:
                raise AssertionError(f"{block}: {statement}: {exc}") from exc
        return
    script = "".join(s + ";\n" for s in statements)
    done = subprocess.run(PSOUP + ["shell"], cwd=page.dir, env=page.env, input=script,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{block}:\n{script}{done.stdout}{done.stderr}"


def test_a_wrong_shown_value_fails() -> None:
    block = Block("page.md", 1, "python", "x = 2\nx + 1  # 3\nx * 2  # 5: a wrong value\n", "")
    with pytest.raises(AssertionError, match=r"page.md:4: shows 5, is 4"):
        run_python(block, {})
    doctest_block = Block("page.md", 1, "python", ">>> 1 + 1\n3\n", "")
    with pytest.raises(AssertionError, match="1 doctest failures"):
        run_python(doctest_block, {})
    assert matches({"a": 1, "b": [2]}, {"b": (2,), "...": ...})
    assert not matches({"a": 1, "b": 2}, {"b": 2})


@contextmanager
def served_here(page: Page) -> Iterator[None]:
    """For a python block marked `server`: `psoup serve --data-dir state/` in the page's
    directory, and the block's connections to 127.0.0.1:7070 go to it."""
    page.serve(["serve", "--data-dir", "state/"])
    port = int(page.env["PSOUP_SERVER"].rsplit(":", 1)[1])
    connect = socket.create_connection

    def redirect(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        return connect(("127.0.0.1", port) if tuple(address) == SERVED else address,
                       *args, **kwargs)
    with mock.patch("socket.create_connection", redirect):
        yield


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_every_block_of_the_page_runs(path: Path, tmp_path: Path) -> None:
    """The page's blocks in order, in a directory where `psoup demo --write-samples .`
    wrote the sample files; blocks marked skip are left out (test_blocks_marked_skip
    names them). Python blocks share one namespace, shell blocks the server the page
    started (PSOUP_SERVER names it; `psoup watch` stops after one poll, `psoup shell`
    reads what the block types at its prompts)."""
    page = Page(tmp_path)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for block in page_blocks(path):
            if block.skip or block.lang in SHOWN:
                continue
            if block.lang == "python":
                with served_here(page) if block.marker == "server" else nullcontext():
                    run_python(block, page.namespace)
            elif block.lang == "sql":
                run_sql(block, page)
            else:
                for command in shell_commands(block):
                    page.run(block, command)
    finally:
        os.chdir(cwd)
        for value in page.namespace.values():
            if isinstance(value, psoup.Engine):
                value.close()
        page.stop()
    assert all("serving on" in out for out in page.served)

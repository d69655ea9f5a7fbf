"""The command lines README.md and docs/cli.md show are ones `psoup` accepts: every
subcommand exists and every option shown is an option of that command (or of `psoup`
itself), so a documented option the CLI lacks fails here. README's quick start runs for
real, against a `psoup serve` process. Also two ways a command ends: `psoup watch | head`
exits quietly, and a `psoup serve` that cannot bind leaves no data directory behind."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from psoup.cli.main import main
from tests.support import free_port, write

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


# ---------------------------------------------------------------------- README's quick start

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


def quick_start() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    block = next(b for b in code_blocks(text) if b.startswith("psoup serve"))
    return shown_commands(block.join(["```\n", "```\n"]))


def test_readme_quick_start_runs(tmp_path: Path) -> None:
    """README's commands as shown, from a directory holding readings.csv: the server on
    a free port (PSOUP_SERVER tells the others), `watch` stopped after one poll and the
    shell fed a script."""
    port = free_port()
    env = _env(tmp_path / "config", PSOUP_SERVER=f"127.0.0.1:{port}")
    now = time.time()
    write(tmp_path / "readings.csv",
          [{"lane": 3, "stationid": i, "speed": 10.0 + i, "ts": now - 60 + i} for i in range(5)])
    commands = quick_start()
    assert [c[1] for c in commands] == ["serve", "stream", "ingest", "register", "invoke",
                                        "watch", "shell"]
    serve = _serve(commands[0][1:] + ["--port", str(port)], tmp_path, env, port)
    outputs = []
    try:
        for words in commands[1:]:
            extra = {"watch": ["--count", "1"]}.get(words[1], [])
            done = subprocess.run(PSOUP + words[1:] + extra, cwd=tmp_path, env=env,
                                  input="SHOW STREAMS;\n", capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, (words, done.stderr)
            outputs.append(done.stdout)
    finally:
        served = _stop(serve)
    assert f"serving on 127.0.0.1:{port}" in served and (tmp_path / "state").is_dir()
    assert outputs[1].startswith("5 rows into traffic")
    assert re.fullmatch(r"[0-9a-f]{40}\n", outputs[2])
    assert "(5 inserted, 0 deleted)" in outputs[3]
    assert "5 rows" in outputs[4] and "traffic" in outputs[5]


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
    assert done.returncode == 1 and "address already in use" in done.stderr
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

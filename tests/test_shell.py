"""`psoup shell`, driven through a pseudo-terminal as a user would type at it."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from click.testing import CliRunner, Result

from psoup.cli.handles import HandleStore
from psoup.cli.main import main
from psoup.engine import Engine
from psoup.server import Server

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "psoup> "
TIMEOUT = 60
#: The shell on an in-memory engine, whatever listens at the default address.
SHELL = ("shell", "--in-memory")


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PSOUP_SERVER", "PSOUP_TOKEN")}
    return {**env, "PSOUP_CONFIG_DIR": str(tmp_path / "config"), "TERM": "xterm",
            "PYTHONPATH": str(ROOT), "INPUTRC": "/dev/null"}


def _spawn(tmp_path: Path, *args: str, banner: str = "",
           env: dict[str, str] | None = None) -> pexpect.spawn[str]:
    # Ctrl-C must reach the shell even when the test runner was started in the
    # background (a shell's `cmd &` ignores SIGINT and SIGQUIT, and a child inherits that)
    child = pexpect.spawn(sys.executable, ["-m", "psoup.cli.main", *args], cwd=str(ROOT),
                          env={**_env(tmp_path), **(env or {})}, encoding="utf-8",
                          timeout=TIMEOUT,
                          dimensions=(40, 200), preexec_fn=_default_signals)
    if banner:
        child.expect_exact(banner)
    child.expect_exact(PROMPT)
    return child


def _piped(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`psoup ARGS` (the in-memory shell by default) run on `script` as its standard
    input, not a terminal."""
    return subprocess.run([sys.executable, "-m", "psoup.cli.main", *(args or SHELL)],
                          input=script, capture_output=True, text=True, env=_env(tmp_path),
                          cwd=ROOT, timeout=TIMEOUT)


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _run(child: pexpect.spawn[str], line: str, *expected: str) -> str:
    """Type `line`, wait for each of `expected` in order and the next prompt; returns
    what was printed in between."""
    child.sendline(line)
    seen = ""
    for text in expected:
        child.expect_exact(text)
        seen += _before(child) + text
    child.expect_exact(PROMPT)
    return seen + _before(child)


def _before(child: pexpect.spawn[str]) -> str:
    """What the child printed before the text it was last expected to print."""
    assert child.before is not None
    return child.before


@pytest.fixture
def readings(tmp_path: Path) -> Path:
    rows = tmp_path / "rows.csv"
    rows.write_text("ts,lane,speed\n100,3,12.5\n101,4,70.0\n102,3,8.0\n")
    return rows


def test_a_session_creates_ingests_registers_and_invokes(tmp_path: Path, readings: Path) -> None:
    child = _spawn(tmp_path, *SHELL)
    _run(child, "CREATE STREAM traffic (lane INT, speed FLOAT);", "CREATE STREAM")
    _run(child, f"\\ingest traffic {readings}", "3 rows into traffic")
    out = _run(child, "SELECT speed FROM traffic WHERE lane = 3;")
    assert len([w for w in out.split() if len(w) == 40]) == 1, out
    _run(child, "\\invoke", "12.5", "8.0", "(2 rows)")
    _run(child, "\\streams", "traffic", "lane INT, speed FLOAT", "(1 stream)")
    _run(child, "\\describe traffic", "rows_total", "3")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_a_statement_may_span_lines(tmp_path: Path) -> None:
    child = _spawn(tmp_path, *SHELL)
    _run(child, "CREATE STREAM r (a INT);", "CREATE STREAM")
    child.sendline("SELECT a")
    child.expect_exact("...> ")
    child.sendline("  FROM r")
    child.expect_exact("...> ")
    _run(child, "  WHERE a > 1;")
    _run(child, "\\queries", "SELECT a", "(1 standing query)")
    child.sendline("\\quit")
    child.expect(pexpect.EOF)


def test_an_error_is_one_line_and_the_shell_goes_on(tmp_path: Path) -> None:
    child = _spawn(tmp_path, *SHELL)
    _run(child, "SELECT a FROM nowhere;", "error: ", "nowhere")
    _run(child, "\\nonsense", "error: unknown command \\nonsense")
    _run(child, "CREATE STREAM r (a INT);", "CREATE STREAM")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_format_and_timing_change_the_output(tmp_path: Path) -> None:
    child = _spawn(tmp_path, *SHELL)
    _run(child, "CREATE STREAM r (a INT, b TEXT);", "CREATE STREAM")
    _run(child, "\\format csv", "format csv")
    _run(child, "SHOW STREAMS;", "stream,columns,retain", 'r,"a INT, b TEXT"')
    _run(child, "\\timing", "timing on")
    _run(child, "DESCRIBE r;", "stream,columns", "time: ", " ms")
    child.sendeof()
    child.expect(pexpect.EOF)


def test_tab_completes_stream_and_column_names(tmp_path: Path) -> None:
    child = _spawn(tmp_path, *SHELL)
    _run(child, "CREATE STREAM traffic (lane INT, speed FLOAT);", "CREATE STREAM")
    child.send("SELECT spe\tFROM tra\t;\r")
    child.expect_exact("SELECT speed FROM traffic ;")
    child.expect(r"[0-9a-f]{40}")
    child.expect_exact(PROMPT)
    _run(child, "\\queries", "SELECT speed FROM traffic ;")
    child.sendeof()
    child.expect(pexpect.EOF)


def test_history_is_kept_across_sessions_for_the_owner_only(tmp_path: Path) -> None:
    child = _spawn(tmp_path, *SHELL)
    _run(child, "SHOW STREAMS;", "(0 streams)")
    child.sendeof()
    child.expect(pexpect.EOF)
    history = tmp_path / "config" / "shell_history"
    assert "SHOW STREAMS;" in history.read_text()
    assert stat.S_IMODE(history.stat().st_mode) == 0o600
    again = _spawn(tmp_path, *SHELL)
    again.send("\x1b[A")                    # up arrow: the last line of the last session
    again.sendline("")
    again.expect_exact("(0 streams)")
    again.sendeof()
    again.expect(pexpect.EOF)


def test_plain_psoup_on_a_terminal_is_the_shell(tmp_path: Path, server: str) -> None:
    # PSOUP_SERVER: the shell talks to the server it names, not to whatever may listen
    # at the default address of this machine
    child = _spawn(tmp_path, env={"PSOUP_SERVER": server, "PSOUP_TOKEN": "t0k3n"},
                   banner=f"psoup shell on the server at {server};")
    _run(child, "\\help", "\\watch")
    child.sendeof()
    child.expect(pexpect.EOF)


def test_a_data_dir_keeps_streams_and_queries_between_shells(tmp_path: Path) -> None:
    state = tmp_path / "state"
    script = "CREATE STREAM r (a INT);\nSELECT a FROM r;\n"
    first = _piped(tmp_path, script, "shell", "--data-dir", str(state))
    assert first.returncode == 0, first.stderr
    handle = first.stdout.split()[-1]
    child = _spawn(tmp_path, "shell", "--data-dir", str(state))
    _run(child, f"\\invoke {handle}", "(0 rows)")
    child.sendeof()
    child.expect(pexpect.EOF)


def test_a_script_on_stdin_runs_and_a_failure_sets_the_exit_code(tmp_path: Path) -> None:
    script = "CREATE STREAM r (a INT);\nSELECT b FROM r;\n\\streams\n"
    done = _piped(tmp_path, script)
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and "unknown column 'b'" in done.stderr
    assert "(1 stream)" in done.stdout and "CREATE STREAM" in done.stdout


def test_plain_psoup_without_a_terminal_prints_its_help(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "psoup.cli.main"], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=_env(tmp_path), cwd=ROOT,
                          timeout=TIMEOUT)
    assert "Commands:" in done.stdout + done.stderr and "shell" in done.stdout + done.stderr


def test_watch_shows_the_answer_until_ctrl_c(tmp_path: Path, readings: Path) -> None:
    child = _spawn(tmp_path, *SHELL)
    _run(child, "CREATE STREAM traffic (lane INT, speed FLOAT);", "CREATE STREAM")
    _run(child, "SELECT speed FROM traffic WHERE lane = 3;")
    child.sendline("\\watch 0.2s")
    child.expect(r"\] 0 rows")
    child.expect_exact("no changes")
    child.sendintr()
    child.expect_exact(PROMPT)
    _run(child, f"\\ingest traffic {readings}", "3 rows into traffic")
    _run(child, "\\changes", "+", "12.5", "(2 inserted, 0 deleted)")
    child.sendeof()
    child.expect(pexpect.EOF)


def test_against_a_server_names_from_the_handle_store_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PSOUP_CONFIG_DIR", str(tmp_path / "config"))
    server = Server(Engine(), port=0, token="t0k3n")
    host, port = server.start_in_thread()
    address = f"{host}:{port}"
    try:
        def psoup(*args: str, input: str | None = None) -> Result:
            return CliRunner().invoke(main, ["--server", address, "--token", "t0k3n", *args],
                                      input=input)
        assert psoup("stream", "create", "r", "a INT").exit_code == 0
        assert psoup("register", "SELECT a FROM r WHERE a > 1", "--name", "big").exit_code == 0
        done = psoup("shell", input="\\queries\n\\invoke big\nDROP STREAM r CASCADE;\n")
        assert done.exit_code == 0, (done.stdout, done.stderr)
        assert re.search(r"^big\s+[0-9a-f]{40}\s+SELECT a FROM r", done.stdout, re.M)
        assert "(0 rows)" in done.stdout and "DROP STREAM" in done.stdout
        assert HandleStore().lookup("big") is None
    finally:
        server.stop()


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A server in this process with a stream r and a query named 'big' on it."""
    monkeypatch.setenv("PSOUP_CONFIG_DIR", str(tmp_path / "config"))
    running = Server(Engine(), port=0, token="t0k3n")
    host, port = running.start_in_thread()
    address = f"{host}:{port}"
    try:
        runner = CliRunner()
        for args in (["stream", "create", "r", "a INT"],
                     ["register", "SELECT a FROM r WHERE a > 1", "--name", "big"]):
            done = runner.invoke(main, ["--server", address, "--token", "t0k3n", *args])
            assert done.exit_code == 0, done.output
        yield address
    finally:
        running.stop()


def test_the_shell_says_which_server_and_takes_server_on_the_subcommand(
        tmp_path: Path, server: str) -> None:
    child = _spawn(tmp_path, "--token", "t0k3n", "shell", "--server", server,
                   banner=f"psoup shell on the server at {server};")
    _run(child, "\\invoke big", "(0 rows)")
    child.sendeof()
    child.expect(pexpect.EOF)


def test_the_shell_uses_the_default_server_when_one_answers(server: str) -> None:
    done = CliRunner().invoke(main, ["--token", "t0k3n", "shell", "-c", "\\streams"],
                              default_map={"server": server})
    assert done.exit_code == 0, done.output
    assert "(1 stream)" in done.stdout


def test_without_a_server_the_shell_runs_an_in_memory_engine(tmp_path: Path) -> None:
    with socket.socket() as probe:          # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    done = CliRunner().invoke(main, ["shell", "-c", "CREATE STREAM s (a INT)", "-c",
                                     "\\streams"], default_map={"server": address})
    assert done.exit_code == 0, done.output
    assert "CREATE STREAM" in done.stdout and "(1 stream)" in done.stdout
    child = _spawn(tmp_path, *SHELL, banner="psoup shell on an in-memory engine;")
    child.sendline("\\quit")
    child.expect(pexpect.EOF)


def test_c_and_f_run_commands_then_leave(tmp_path: Path) -> None:
    script = tmp_path / "script.sql"
    script.write_text("SELECT a\nFROM r;\n\\queries\n")
    done = _piped(tmp_path, "", *SHELL, "-c", "CREATE STREAM r (a INT);", "-f", str(script))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("CREATE STREAM\n") and "(1 standing query)" in done.stdout
    failed = _piped(tmp_path, "", *SHELL, "-c", "SELECT a FROM nowhere")
    assert failed.returncode == 1 and failed.stderr.startswith("error: ")


def test_help_quit_and_exit_need_no_backslash(tmp_path: Path) -> None:
    child = _spawn(tmp_path, *SHELL)
    _run(child, "help", "\\watch", "(or quit, exit, Ctrl-D)")
    child.sendline("exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    done = _piped(tmp_path, "CREATE STREAM r (a INT);\nQUIT;\nSHOW STREAMS;\n")
    assert done.returncode == 0 and done.stdout == "CREATE STREAM\n", done


def test_invoke_limits_and_pages_a_table_on_a_terminal_as_psoup_invoke_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    import click

    import psoup.cli.shell as shell

    printed: list[str] = []
    paged: list[str] = []
    monkeypatch.setattr(click, "echo_via_pager", paged.append)
    monkeypatch.setattr(shutil, "get_terminal_size", lambda: os.terminal_size((80, 40)))
    with Engine() as engine:
        session = shell.Session(engine, None, printed.append, printed.append, terminal=True)
        session.run(iter(["CREATE STREAM r (a INT);", "SELECT a FROM r;"]))
        engine.insert("r", [(i,) for i in range(150)], ts=[float(i) for i in range(150)])
        session.run_one("\\invoke")
        assert "(150 rows, first 100 shown; --limit 0 for all)" in paged.pop()
        session.run_one("\\invoke --limit 5")
        assert printed[-1].endswith("(150 rows, first 5 shown; --limit 0 for all)")
        session.run_one("\\invoke --limit 0")
        assert paged.pop().endswith("(150 rows)\n")
        session.run_one("\\invoke --limit many")
        assert printed[-1] == "error: --limit takes a number of rows (0: all)"
        session.terminal = False
        session.run_one("\\invoke")
        assert printed[-1].endswith("(150 rows)") and not paged


def test_show_queries_prints_sql_on_one_line(tmp_path: Path) -> None:
    child = _spawn(tmp_path, *SHELL)
    _run(child, "CREATE STREAM r (a INT);", "CREATE STREAM")
    child.sendline("SELECT a")
    child.expect_exact("...> ")
    _run(child, "  FROM r  WHERE a > 1;")
    _run(child, "SHOW QUERIES;", "SELECT a FROM r WHERE a > 1", "(1 standing query)")
    child.sendeof()
    child.expect(pexpect.EOF)


def test_a_caret_points_at_the_error(tmp_path: Path) -> None:
    script = "CREATE STREAM r (a INT);\nSELECT a\n  FROM r WHERE b = 1;\n\\describe nowhere\n"
    done = _piped(tmp_path, script)
    errors = done.stderr.splitlines()
    assert errors[0].startswith("error: line 2, column 16: unknown column 'b'"), errors
    assert errors[1:3] == ["  FROM r WHERE b = 1;", " " * 15 + "^"]
    assert errors[3].startswith("error: ") and len(errors) == 4   # no caret for \\describe


def test_ctrl_c_during_a_registration_still_prints_the_handle(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import psoup.cli.shell as shell

    printed: list[str] = []
    with Engine() as engine:
        session = shell.Session(engine, None, printed.append, printed.append)
        session.run_one("CREATE STREAM r (a INT);")
        register = engine.execute

        def interrupted(sql: str) -> object:
            os.kill(os.getpid(), signal.SIGINT)     # Ctrl-C while the engine works
            return register(sql)

        monkeypatch.setattr(engine, "execute", interrupted)
        assert session.run_one("SELECT a FROM r;")
        assert printed[-2] == "note: finishing this command; it cannot stop half way"
        assert printed[-1] == session.last_handle
        assert [h for h, _ in engine.queries()] == [session.last_handle]
    with pytest.raises(KeyboardInterrupt):      # Ctrl-C works again after it
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)


def test_tab_completes_streams_after_from_and_files_after_ingest(
        tmp_path: Path, readings: Path) -> None:
    child = _spawn(tmp_path, *SHELL)
    _run(child, "CREATE STREAM traffic (lane INT, speed FLOAT);", "CREATE STREAM")
    child.send("SELECT lane FROM tr\t;\r")          # not `true`
    child.expect_exact("SELECT lane FROM traffic ;")
    child.expect(r"[0-9a-f]{40}")
    child.expect_exact(PROMPT)
    (tmp_path / "more").mkdir()
    child.send(f"\\ingest traffic {tmp_path}/mo\t")    # a directory: no space after it
    child.expect_exact(f"{tmp_path}/more/")
    child.send("\x15")                                 # Ctrl-U: start the line again
    child.send(f"\\ingest traffic {tmp_path}/ro\t\r")
    child.expect_exact(f"{readings} ")
    child.expect_exact("3 rows into traffic")
    child.expect_exact(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)


def test_o_sends_answers_to_a_file_i_runs_one_and_x_shows_records(tmp_path: Path) -> None:
    import psoup.cli.shell as shell

    printed: list[str] = []
    script = tmp_path / "script.sql"
    script.write_text("CREATE STREAM r (a INT, b TEXT);\nSELECT a, b\n FROM r;\n\\quit\n")
    out = tmp_path / "out.txt"
    with Engine() as engine:
        session = shell.Session(engine, None, printed.append, printed.append)
        assert not session.run_one(f"\\i {script}")         # its \quit leaves the shell
        engine.insert("r", [(1, "x"), (2, "y")], ts=[0.0, 1.0])
        session.run(iter([f"\\o {out}", "\\invoke", "\\x", "\\invoke", "\\o", "\\streams"]))
        assert printed[:3] == ["CREATE STREAM", session.last_handle,
                               f"output to {out}"]
        assert printed[3:5] == ["expanded display on", "output here"]
        assert re.match(r"-\[ RECORD 1 \]-\nstream +r\ncolumns +a INT, b TEXT\n", printed[5])
        assert printed[5].endswith("\n(1 stream)")
        assert out.read_text() == (
            "ts                        a  b\n"
            "--                        -  -\n"
            "1970-01-01T00:00:00.000Z  1  x\n"
            "1970-01-01T00:00:01.000Z  2  y\n"
            "(2 rows)\n"
            "-[ RECORD 1 ]-\n"
            "ts  1970-01-01T00:00:00.000Z\na   1\nb   x\n"
            "-[ RECORD 2 ]-\n"
            "ts  1970-01-01T00:00:01.000Z\na   2\nb   y\n"
            "(2 rows)\n")
        session.run_one(f"\\i {tmp_path / 'missing.sql'}")
        assert printed[-1] == "error: No such file or directory"
        script.write_text(f"\\i {script}\n")
        session.run_one(f"\\i {script}")
        assert printed[-1] == "error: \\i nested 16 deep: does a file include itself?"


def test_ingest_checks_the_columns_before_sending_any_row(tmp_path: Path) -> None:
    import psoup.cli.shell as shell

    printed: list[str] = []
    stray = tmp_path / "stray.csv"
    stray.write_text("ts,lane,colour\n100,3,red\n")
    timed = tmp_path / "timed.csv"
    timed.write_text("time,lane\n100,3\n101,4\n")
    with Engine() as engine:
        session = shell.Session(engine, None, printed.append, printed.append)
        session.run_one("CREATE STREAM traffic (lane INT, speed FLOAT);")
        session.run_one(f"\\ingest traffic {stray}")
        assert printed[-1] == (
            "error: the input has column 'colour', which stream 'traffic' does not have "
            "(its columns: lane, speed; it lacks speed); remove it from the input or add "
            "it to the stream")
        session.run_one(f"\\ingest traffic {timed}")
        assert printed[-1].endswith("if it holds the timestamps, pass --ts-column time")
        assert engine.stats()["streams"]["traffic"]["rows"] == 0
        session.run_one("CREATE STREAM lanes (lane INT);")
        session.run_one(f"\\ingest lanes {timed} --ts-column time")
        assert printed[-1].startswith("2 rows into lanes")
        session.run_one(f"\\ingest lanes {timed} --ts-col time")
        assert printed[-1] == "error: usage: \\ingest STREAM FILE [--ts-column COL]"


def test_a_name_of_another_server_says_where_it_lives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import psoup.cli.shell as shell

    monkeypatch.setenv("PSOUP_CONFIG_DIR", str(tmp_path / "config"))
    HandleStore().remember("slow-lane3", "127.0.0.1:7070", "ab" * 20, "SELECT a FROM r")
    printed: list[str] = []
    with Engine() as engine:
        session = shell.Session(engine, None, printed.append, printed.append)
        session.run_one("\\invoke slow-lane3")
    assert printed == ["error: 'slow-lane3' names a handle on the server at 127.0.0.1:7070, "
                       "and this shell talks to an embedded engine (psoup shell --server "
                       "127.0.0.1:7070)"]


@pytest.mark.parametrize(("large", "said"), [(3, True), (4, False)])
def test_a_registration_over_a_large_store_says_so_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, large: int, said: bool) -> None:
    import psoup.cli.progress as progress
    monkeypatch.setattr(progress, "LARGE_STORE", large)  # as many retained tuples as "many"
    rows = tmp_path / "a.csv"
    rows.write_text("a\n1\n2\n3\n")
    done = CliRunner().invoke(main, ["shell", "--in-memory", "-c", "CREATE STREAM s (a INT)",
                                     "-c", f"\\ingest s {rows}",
                                     "-c", "SELECT a FROM s WHERE a > 1"])
    assert done.exit_code == 0, done.output
    note = "applying the query to 3 retained tuples…\n"
    assert (note in done.stderr) is said, done.stderr

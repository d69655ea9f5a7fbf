"""The write-ahead log: framing, replay, torn tails, corruption, sync modes, checkpoints."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgpack
import pytest

import psoup
from psoup.errors import PSoupError
from psoup.journal.wal import WriteAheadLog
from psoup.options import SyncName

RECORDS = [
    {"op": "create", "sql": "CREATE STREAM R (a INT)"},
    {"op": "insert", "stream": "R", "cols": {"a": {"dtype": "<i8", "data": b"\x01" * 8}}},
    {"op": "register", "handle": "h1", "sql": "SELECT a FROM R"},
]


def opened(directory: Path, sync: SyncName = "always") -> tuple[WriteAheadLog, list[Any]]:
    """A log replayed to its end, and what the replay yielded."""
    wal = WriteAheadLog(directory, sync=sync)
    return wal, list(wal.replay())


def written(directory: Path, records: Sequence[Any] = RECORDS) -> list[int]:
    """Write `records` into a fresh log; returns the byte offset where each one starts."""
    wal, _ = opened(directory)
    offsets = []
    for record in records:
        offsets.append(wal.size)
        wal.append(record)
    wal.close()
    return offsets


def segment(directory: Path, seq: int = 1) -> Path:
    return directory / f"wal-{seq:08d}.log"


# ---------------------------------------------------------------------- round trip

def test_records_round_trip_with_bytes_and_nested_maps(tmp_path: Path) -> None:
    record = {"op": "insert", "blob": b"\x00\xff" * 100, "nested": {"a": [1, 2.5, None],
              "b": {"c": True, "d": "é"}}, 7: "int key"}
    wal, _ = opened(tmp_path)
    wal.append(record)
    wal.close()
    assert opened(tmp_path)[1] == [record]


def test_replay_after_reopen_returns_records_in_order(tmp_path: Path) -> None:
    written(tmp_path)
    assert opened(tmp_path)[1] == RECORDS


def test_appends_after_reopen_extend_the_log(tmp_path: Path) -> None:
    written(tmp_path)
    wal, _ = opened(tmp_path)
    wal.append({"op": "unregister", "handle": "h1"})
    wal.close()
    assert opened(tmp_path)[1] == RECORDS + [{"op": "unregister", "handle": "h1"}]


def test_empty_directory_replays_nothing_and_starts_segment_one(tmp_path: Path) -> None:
    directory = tmp_path / "new" / "wal"
    wal, records = opened(directory)
    assert records == []
    assert [p.name for p in directory.iterdir()] == ["wal-00000001.log"]
    wal.close()


def test_frame_is_length_crc_then_msgpack_payload(tmp_path: Path) -> None:
    written(tmp_path, [{"op": "x"}])
    payload = msgpack.packb({"op": "x"}, use_bin_type=True)
    header = struct.pack(">II", len(payload), zlib.crc32(payload))
    assert segment(tmp_path).read_bytes() == header + payload


def test_size_is_the_current_segment_in_bytes(tmp_path: Path) -> None:
    wal, _ = opened(tmp_path)
    for record in RECORDS:
        wal.append(record)
    assert wal.size == segment(tmp_path).stat().st_size > 0
    wal.close()


def test_append_before_replay_is_refused(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    with pytest.raises(RuntimeError, match="replay"):
        wal.append({"op": "x"})


def test_append_before_replay_is_exhausted_is_refused(tmp_path: Path) -> None:
    written(tmp_path)
    wal = WriteAheadLog(tmp_path)
    next(wal.replay())
    with pytest.raises(RuntimeError, match="replay"):
        wal.append({"op": "x"})


def test_replay_runs_once(tmp_path: Path) -> None:
    wal, _ = opened(tmp_path)
    with pytest.raises(RuntimeError, match="already replayed"):
        wal.replay()
    wal.close()


def test_append_after_close_is_refused_and_close_is_idempotent(tmp_path: Path) -> None:
    wal, _ = opened(tmp_path)
    wal.close()
    wal.close()
    with pytest.raises(RuntimeError, match="closed"):
        wal.append({"op": "x"})


def test_unpackable_record_is_rejected_and_nothing_is_written(tmp_path: Path) -> None:
    wal, _ = opened(tmp_path)
    wal.append(RECORDS[0])
    with pytest.raises(TypeError):
        wal.append({"op": object()})
    assert wal.size == segment(tmp_path).stat().st_size
    wal.close()
    assert opened(tmp_path)[1] == RECORDS[:1]


# ---------------------------------------------------------------------- torn tails

def test_torn_tail_at_every_offset_of_the_last_record_is_truncated(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = tmp_path / "source"
    last = written(source)[-1]
    full = segment(source).read_bytes()
    for cut in range(last + 1, len(full)):
        directory = tmp_path / f"cut{cut}"
        directory.mkdir()
        segment(directory).write_bytes(full[:cut])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="psoup.archive"):
            wal, records = opened(directory)
        assert records == RECORDS[:-1], cut
        assert segment(directory).stat().st_size == last == wal.size
        assert f"{segment(directory)}" in caplog.text and f"byte {last}" in caplog.text
        wal.close()


def test_appending_after_a_torn_tail_works(tmp_path: Path) -> None:
    last = written(tmp_path)[-1]
    path = segment(tmp_path)
    path.write_bytes(path.read_bytes()[:last + 5])
    wal, _ = opened(tmp_path)
    wal.append({"op": "after"})
    wal.close()
    assert opened(tmp_path)[1] == RECORDS[:-1] + [{"op": "after"}]


def test_bad_checksum_on_the_last_record_is_a_torn_tail(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    last = written(tmp_path)[-1]
    path = segment(tmp_path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="psoup.archive"):
        wal, records = opened(tmp_path)
    assert records == RECORDS[:-1]
    assert path.stat().st_size == last
    assert "torn tail" in caplog.text
    wal.close()


def test_zero_filled_tail_is_a_torn_tail(tmp_path: Path) -> None:
    # After a power loss a filesystem may show the file's new length before its data.
    written(tmp_path)
    path = segment(tmp_path)
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(bytes(40))
    wal, records = opened(tmp_path)
    assert records == RECORDS
    assert path.stat().st_size == size
    wal.close()


def test_intact_log_is_not_touched_and_logs_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    written(tmp_path)
    before = segment(tmp_path).read_bytes()
    with caplog.at_level(logging.WARNING, logger="psoup.archive"):
        wal, _ = opened(tmp_path)
    wal.close()
    assert segment(tmp_path).read_bytes() == before
    assert caplog.text == ""


# ---------------------------------------------------------------------- corruption

def corrupt_middle(directory: Path) -> int:
    """Flip a payload byte of the second of three records; returns that record's offset."""
    offsets = written(directory)
    path = segment(directory)
    data = bytearray(path.read_bytes())
    data[offsets[1] + 8 + 3] ^= 0xFF
    path.write_bytes(bytes(data))
    return offsets[1]


def test_corrupt_record_in_the_middle_raises_naming_file_and_offset(tmp_path: Path) -> None:
    offset = corrupt_middle(tmp_path)
    wal = WriteAheadLog(tmp_path)
    with pytest.raises(PSoupError, match="corrupt") as info:
        list(wal.replay())
    assert str(segment(tmp_path)) in str(info.value)
    assert f"byte {offset}" in str(info.value)


def test_corrupt_log_keeps_every_byte(tmp_path: Path) -> None:
    corrupt_middle(tmp_path)
    before = segment(tmp_path).read_bytes()
    with pytest.raises(PSoupError):
        list(WriteAheadLog(tmp_path).replay())
    assert segment(tmp_path).read_bytes() == before


def test_corrupt_log_is_not_opened_for_append(tmp_path: Path) -> None:
    corrupt_middle(tmp_path)
    wal = WriteAheadLog(tmp_path)
    with pytest.raises(PSoupError):
        list(wal.replay())
    with pytest.raises(RuntimeError):
        wal.append({"op": "x"})


def test_records_before_the_corruption_are_yielded_first(tmp_path: Path) -> None:
    corrupt_middle(tmp_path)
    seen = []
    with pytest.raises(PSoupError):
        for record in WriteAheadLog(tmp_path).replay():
            seen.append(record)
    assert seen == RECORDS[:1]


def test_record_with_good_checksum_that_does_not_decode_is_corrupt(tmp_path: Path) -> None:
    payload = b"\xc1"   # a msgpack byte that is never valid
    segment(tmp_path).write_bytes(struct.pack(">II", 1, zlib.crc32(payload)) + payload)
    with pytest.raises(PSoupError, match="does not decode"):
        list(WriteAheadLog(tmp_path).replay())


# ---------------------------------------------------------------------- sync modes

@pytest.mark.parametrize("sync", ["always", "group", "off"])
def test_sync_modes_are_accepted_and_round_trip(tmp_path: Path, sync: SyncName) -> None:
    wal, _ = opened(tmp_path, sync)
    for record in RECORDS:
        wal.append(record)
    wal.commit()
    wal.close()
    assert opened(tmp_path, sync)[1] == RECORDS


@pytest.mark.parametrize("sync", ["sometimes", "ALWAYS", "", None])
def test_unknown_sync_mode_is_rejected(tmp_path: Path, sync: Any) -> None:  # not only str
    with pytest.raises(ValueError, match="sync mode"):
        WriteAheadLog(tmp_path / "wal", sync=sync)
    assert not (tmp_path / "wal").exists()


@pytest.mark.parametrize("sync, per_append, on_commit", [
    ("always", 1, 0), ("group", 0, 1), ("off", 0, 0)])
def test_fsyncs_follow_the_sync_mode(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: SyncName, per_append: int,
        on_commit: int) -> None:
    wal, _ = opened(tmp_path, sync)
    calls: list[int] = []
    real_fsync = os.fsync

    def counted_fsync(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", counted_fsync)
    wal.append({"op": "x"})
    assert len(calls) == per_append
    calls.clear()
    wal.commit()
    assert len(calls) == on_commit
    calls.clear()
    wal.commit()
    assert calls == []   # nothing written since the last fsync
    wal.close()


# ---------------------------------------------------------------------- checkpoints

def test_rotate_replaces_the_log_with_exactly_the_new_records(tmp_path: Path) -> None:
    wal, _ = opened(tmp_path)
    for record in RECORDS:
        wal.append(record)
    wal.rotate([{"op": "state", "next_tid": 9}, {"op": "create", "sql": "S"}])
    wal.close()
    assert opened(tmp_path)[1] == [{"op": "state", "next_tid": 9}, {"op": "create", "sql": "S"}]


def test_appends_after_rotate_go_to_the_new_segment(tmp_path: Path) -> None:
    wal, _ = opened(tmp_path)
    wal.append(RECORDS[0])
    wal.rotate(iter([{"op": "state"}]))
    wal.append({"op": "after"})
    assert wal.size == segment(tmp_path, 2).stat().st_size
    wal.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wal-00000002.log"]
    assert opened(tmp_path)[1] == [{"op": "state"}, {"op": "after"}]


def test_rotate_to_no_records_empties_the_log(tmp_path: Path) -> None:
    wal, _ = opened(tmp_path)
    wal.append(RECORDS[0])
    wal.rotate([])
    assert wal.size == 0
    wal.close()
    assert opened(tmp_path)[1] == []


def test_failed_rotate_keeps_the_old_log_in_use(tmp_path: Path) -> None:
    def records() -> Iterator[dict[str, str]]:
        yield {"op": "state"}
        raise OSError("disk gone")

    wal, _ = opened(tmp_path)
    wal.append(RECORDS[0])
    with pytest.raises(OSError, match="disk gone"):
        wal.rotate(records())
    wal.append(RECORDS[1])
    wal.close()
    assert [p.name for p in tmp_path.iterdir()] == ["wal-00000001.log"]
    assert opened(tmp_path)[1] == RECORDS[:2]


def test_crash_before_the_checkpoint_rename_replays_the_old_log(tmp_path: Path) -> None:
    written(tmp_path)
    (tmp_path / "wal-00000002.log.tmp").write_bytes(b"half a checkpoint")
    wal, records = opened(tmp_path)
    wal.close()
    assert records == RECORDS
    assert [p.name for p in tmp_path.iterdir()] == ["wal-00000001.log"]


def test_leftover_older_segment_is_removed(tmp_path: Path) -> None:
    # A crash after the checkpoint's rename but before the old segment's deletion.
    old, new = tmp_path / "old", tmp_path / "new"
    written(old)
    wal, _ = opened(new)
    wal.rotate([{"op": "state", "next_tid": 3}])
    wal.close()
    shutil.copy(segment(old), segment(new, 1))
    wal, records = opened(new)
    wal.close()
    assert records == [{"op": "state", "next_tid": 3}]
    assert [p.name for p in new.iterdir()] == ["wal-00000002.log"]


def test_switch_keeps_the_older_segments_until_dropped(tmp_path: Path) -> None:
    """A checkpoint beside the writer switches the log at its cut: the records after it
    go to the next segment, replay from a segment reads it and every later one in order,
    and the segments before a valid checkpoint's are dropped."""
    wal, _ = opened(tmp_path)
    wal.append(RECORDS[0])
    assert wal.switch() == 2
    wal.append(RECORDS[1])
    assert wal.switch() == 3                      # a checkpoint that failed, then another
    wal.append(RECORDS[2])
    assert wal.seq == 3 and wal.total > wal.size > 0
    wal.close()
    again = WriteAheadLog(tmp_path)
    assert list(again.replay(first=1)) == RECORDS          # no checkpoint valid yet
    again.append({"op": "unregister", "handle": "h1"})
    again.drop_before(3)                                   # checkpoint 3 is valid
    assert again.total == again.size
    again.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wal-00000003.log"]
    newest = WriteAheadLog(tmp_path)
    assert list(newest.replay(first=3)) == [RECORDS[2], {"op": "unregister", "handle": "h1"}]
    newest.close()


def test_replay_from_a_segment_drops_the_ones_before_it(tmp_path: Path) -> None:
    """A crash after a checkpoint's manifest but before its log was dropped: replay from
    the segment it names, the older ones deleted; a segment not there yet is begun."""
    wal, _ = opened(tmp_path)
    wal.append(RECORDS[0])
    wal.switch()
    wal.append(RECORDS[1])
    wal.close()
    again = WriteAheadLog(tmp_path)
    assert list(again.replay(first=2)) == [RECORDS[1]]
    again.close()
    assert [p.name for p in tmp_path.iterdir()] == ["wal-00000002.log"]
    later = WriteAheadLog(tmp_path)
    assert list(later.replay(first=5)) == []
    later.append(RECORDS[2])
    later.close()
    assert [p.name for p in tmp_path.iterdir()] == ["wal-00000005.log"]


# ---------------------------------------------------------------------- a real crash

CHILD = textwrap.dedent("""
    import sys
    from psoup.journal.wal import WriteAheadLog
    wal = WriteAheadLog(sys.argv[1], sync="off")
    for _ in wal.replay():
        pass
    i = 0
    while True:
        wal.append({"i": i, "pad": b"x" * (i * 37 % 3000)})
        print(i, flush=True)
        i += 1
""")


def test_sigkill_loses_no_acknowledged_record(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(psoup.__file__).parents[1]))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None
    acked = -1
    for line in child.stdout:
        acked = int(line)
        if acked == 1500:
            child.send_signal(signal.SIGKILL)
            break
    child.wait(timeout=10)
    # Lines still in the pipe were acknowledged before the kill too.
    acked = max([acked, *(int(line) for line in child.stdout.read().split())])
    child.stdout.close()
    assert child.returncode == -signal.SIGKILL

    wal, records = opened(tmp_path)
    wal.close()
    assert len(records) > acked
    assert records == [{"i": i, "pad": b"x" * (i * 37 % 3000)} for i in range(len(records))]

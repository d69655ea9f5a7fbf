"""Write the latest results into bench/README.md: one table per report in bench/results/
(the same columns the script printed), its verdicts, and its plot, between the README's
`<!-- results -->` markers. `psoup bench` runs it after a full run; by hand:

    python bench/summary.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (bench/ is put on sys.path just above)

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"

#: Reports in the order the README shows them, with a title each.
ORDER = [
    ("ingest", "Fig. 9: arrival rate vs standing queries"),
    ("register", "The query stream: registrations interleaved with data"),
    ("invoke", "Fig. 7a/7b: response time vs window"),
    ("invoke_table2", "Table 2: response time vs interval factors (W = 2^15)"),
    ("invoke_find", "The find alone against the C floor (W = 2^16)"),
    ("invoke_polls", "Polls of a sliding window while tuples arrive (W = 2^15)"),
    ("joins_fig8", "Fig. 8: join response time vs window per stream"),
    ("joins_fig11", "Fig. 11: composite tuples"),
    ("joins_sharing", "Sect. 5.4: one join per group of queries (single data, multiple queries)"),
    ("joins_routing", "Adaptive vs fixed routing"),
    ("aggregates", "Sect. 6: aggregates vs window"),
    ("traffic_response", "Sect. 5.5, Fig. 12: traffic trace, response time vs window"),
    ("traffic_arrival", "Sect. 5.5, Fig. 13: traffic trace, arrival rate vs queries"),
    ("manyq", "10^4 and 10^5 standing queries vs per-query numpy"),
    ("peers", "Peers: Spark Structured Streaming and Pathway on Fig. 9's queries"),
    ("server_poll", "The service: polling clients"),
    ("server_large", "The service: large answers, the allocator keeping freed memory or not"),
    ("server_ingest", "The service: ingest through the wire"),
    ("soak_history", "The service beside a history job"),
    ("soak_clients", "The service soaked: 100 clients"),
    ("replay", "Spark replay vs Spark's own read rate"),
    ("history", "Historical evaluation: one pass vs one Spark job per query"),
    ("history_scale", "Historical evaluation: driver memory vs archive size, 1 vs 2 cores"),
    ("spark_live", "Streams fed by a Spark source: files landing in a folder (issue 38)"),
    ("batch_reads", "Invocations over a stream probed in Spark's executors vs in memory"),
    ("oscar", "Reduced archive reads (Remembrance of Streams Past, Fig. 12)"),
    ("oscar_copies", "Hourly averages from the archive's aggregate copies vs tuples"),
    ("scale_register", "Registration over 1M-16M retained rows vs DuckDB, every mode"),
    ("scale_stall", "No client stalls another: a poller and a producer, quiet vs contended"),
    ("scale_stall_replicas", "No client stalls another, with one read replica"),
    ("scale_restart", "Restart: SIGKILL to the first answer vs reading the checkpoint's files"),
    ("scale_cores", "One core against every core: ingest at 1,024 to 10^5 queries"),
    ("scale_cores_probe", "One core against every core: the probe alone, where a split pays"),
    ("scale_cores_server", "One core against every core: 100 polling clients and a producer"),
]


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    try:
        return format(value, fmt)
    except (TypeError, ValueError):
        return str(value)


def section(name: str, title: str) -> str | None:
    path = common.RESULTS_DIR / f"{name}.json"
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    columns = doc.get("columns")
    if not columns:
        return None
    lines = [f"### {title}", "",
             "| " + " | ".join(header for _, header, _ in columns) + " |",
             "|" + "---|" * len(columns)]
    for row in doc["rows"]:
        lines.append("| " + " | ".join(_cell(row.get(key), fmt) for key, _, fmt in columns)
                     + " |")
    lines.append("")
    lines += [f"- {note}" for note in doc.get("notes", [])]
    lines += ["", f"![{name}](results/{name}.png)", "",
              f"<sub>{path.name}, {doc['timestamp']}</sub>", ""]
    return "\n".join(lines)


def machine() -> str:
    info = common.machine_info()
    return (f"Measured on: {info['platform']}, {info['cpu_count']} cores, "
            f"{common.cpu_line(info)}, Python {info['python']}, numpy {info['numpy']}, "
            f"DuckDB {info.get('duckdb', '-')}. Each result's JSON holds the CPU's flags.")


def main() -> None:
    readme = common.BENCH_DIR / "README.md"
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme} has no {BEGIN} ... {END} markers")
    parts = [machine(), ""] + [s for s in (section(n, t) for n, t in ORDER) if s]
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    readme.write_text(head + BEGIN + "\n" + "\n".join(parts) + "\n" + END + tail)
    print(f"wrote the results of {len(parts) - 2} reports into {readme.relative_to(common.ROOT)}")


if __name__ == "__main__":
    main()

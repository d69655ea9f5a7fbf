"""The `scale` suite: one machine at a user's sizes (millions of retained rows, 10^4 to
10^5 queries, a hundred clients).

Each section is a script of its own, run here one after another in its own process (so
one section's memory and threads do not disturb the next), with this script's flags:

* scale_register.py: registration (and unregistration) over 1M / 4M / 16M retained rows
  against DuckDB running the same query over the same rows, in every mode;
* scale_stall.py: a poller's and a producer's latency, quiet and while another client
  registers over millions of rows, reads a 2M-row answer and a checkpoint runs;
* scale_restart.py: SIGKILL to the first answered request, against reading the files;
* scale_cores.py: one core against every core, for ingest and for the server.

Usage: python bench/scale.py [--quick | --smoke] [SECTION ...]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SECTIONS = ["register", "stall", "restart", "cores"]


def main() -> int:
    here = Path(__file__).resolve().parent
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    wanted = [a for a in sys.argv[1:] if not a.startswith("--")] or SECTIONS
    unknown = [w for w in wanted if w not in SECTIONS]
    if unknown:
        print(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}",
              file=sys.stderr)
        return 2
    failed = []
    for section in wanted:
        script = here / f"scale_{section}.py"
        if not script.is_file():
            print(f"== scale {section}: not written yet ({script.name} missing)")
            continue
        print(f"== scale {section}", flush=True)
        if subprocess.call([sys.executable, str(script), *flags], cwd=here.parent):
            failed.append(section)
    if failed:
        print(f"scale: {', '.join(failed)} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

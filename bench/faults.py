"""Failure drills on one lab: per fault, the time from the fault's end to the run moving again, and
the steps repeated (goal 0). Needs root (the lab); about 6 minutes on 2 cores.

    .venv/bin/python bench/faults.py [--case NAME ...] [--keep-dir DIR]

"moving again" is the first action completed ok (from the action journal) or gate reading passed
(from the run's status) after the fault ended; for a held step that includes the operator's
retry (sent at once, or, for the failed gate, once the players are back at the held percentage).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console
from rich.table import Table

from lab.drills.faults import CASES, FaultDrills


async def main(cases: list[str], root: Path) -> int:
    console = Console(width=200)
    started = time.monotonic()
    reports = []
    async with FaultDrills(root, log=lambda m: console.print(f"[dim]{time.monotonic() - started:6.1f}s[/dim] {m}",
                                                             highlight=False)) as drills:
        for name in cases:
            try:
                reports.append(await drills.run_case(name))
            except Exception as exc:  # noqa: BLE001 - one case failing must not hide the others' figures
                console.print(f"[red]{name} failed: {type(exc).__name__}: {exc}[/red]")
                return 1
    table = Table("fault", "fault ended by", "→ moving (s)", "what moved", "run", "steps repeated",
                  "interrupted+retried", "retried after failure", "DNS % end", "case (s)")
    for r in reports:
        j = r.journal
        table.add_row(r.fault, r.fault_end, "n/a" if r.recovery_s is None else f"{r.recovery_s:.2f}", r.moved_by,
                      r.state, str(len(r.repeats)), str(len(j.interrupted_retried)) if j else "?",
                      str(len(j.retried_after_failure)) if j else "?",
                      "?" if r.dns_percent_end is None else f"{r.dns_percent_end:g}", f"{r.wall_s:.1f}")
    console.print(table)
    console.print(f"total {time.monotonic() - started:.1f} s (lab up/down and the Temporal dev server included)")
    return 0 if all(r.state == "succeeded" and not r.repeats for r in reports) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", choices=list(CASES), help="run only these (default: all)")
    parser.add_argument("--keep-dir", type=Path, help="state dir (journal, logs, temporal.db) to keep")
    args = parser.parse_args()
    root = args.keep_dir or Path(tempfile.mkdtemp(prefix="coldstart-faults-"))
    sys.exit(asyncio.run(main(args.case or list(CASES), root)))

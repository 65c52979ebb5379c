"""How long `coldstart test` takes: each shipped runbook's cases on the time-skipping test server, end to end.

Each runbook's `coldstart test RUNBOOK` runs `--rounds` times (3 by default) as a fresh process, the runbooks
alternating; wall time from spawn to exit (the interpreter's start, the test server's start and every case).
Prints each round's wall time and the command's own summary line (the run time its cases covered), then the
median per runbook. Goal: runbooks/consul-cold-start.yaml under 10 s (the median).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLDSTART = str(Path(sys.prefix) / "bin" / "coldstart")
GOAL_S = 10.0
GOAL_RUNBOOK = "runbooks/consul-cold-start.yaml"


def _run(runbook: str) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run([COLDSTART, "test", runbook], cwd=REPO, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"coldstart test {runbook} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return elapsed, done.stdout.splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runbooks = sorted(path.relative_to(REPO).as_posix() for path in (REPO / "runbooks").glob("*.yaml")
                      if (path.parent / "cases" / path.name).exists())
    samples: dict[str, list[float]] = {runbook: [] for runbook in runbooks}
    for round_ in range(1, args.rounds + 1):
        for runbook in runbooks:
            wall, summary = _run(runbook)
            samples[runbook].append(wall)
            print(f"round {round_}  {runbook:<36} {wall:6.2f} s  ({summary})", flush=True)
    print(f"\n{'runbook':<36} {'median s':>9} {'min':>7} {'max':>7}  goal")
    for runbook, values in samples.items():
        median = statistics.median(values)
        goal = "" if runbook != GOAL_RUNBOOK else ("met" if median < GOAL_S else f"NOT met (< {GOAL_S:.0f} s)")
        print(f"{runbook:<36} {median:9.2f} {min(values):7.2f} {max(values):7.2f}  {goal}")


if __name__ == "__main__":
    main()

"""How long `coldstart test` takes: each shipped runbook's cases on the time-skipping test server, end to end.

Each runbook's `coldstart test RUNBOOK` runs `--rounds` times (3 by default) as a fresh process, the runbooks
alternating (the order reversed every other round); wall time from spawn to exit (the interpreter's start, the test server's start and every case).
Prints each round's wall time and the command's own summary line (the run time its cases covered), then the
median per runbook. Goal: runbooks/consul-cold-start.yaml under 10 s (the median over rounds); NOT met when
any run of any runbook exited non-zero (counted, the rounds go on).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._verdict import Verdict, alternated, median, samples_table, under

COLDSTART = str(Path(sys.prefix) / "bin" / "coldstart")
GOAL_S = 10.0
GOAL_RUNBOOK = "runbooks/consul-cold-start.yaml"


def _run(runbook: str) -> tuple[float | None, str]:
    """The wall time and the summary line; None and the output when the command failed."""
    started = time.perf_counter()
    done = subprocess.run([COLDSTART, "test", runbook], cwd=REPO, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        return None, f"exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return elapsed, done.stdout.splitlines()[-1]


def cases_verdict(samples: dict[str, list[float | None]]) -> Verdict:
    """The goal runbook's median over its successful rounds under GOAL_S; NOT met on any failed run."""
    return Verdict([under(f"{GOAL_RUNBOOK} median", median(samples.get(GOAL_RUNBOOK, [])), GOAL_S, " s")],
                   {"runs failed": sum(v is None for values in samples.values() for v in values)})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runbooks = sorted(path.relative_to(REPO).as_posix() for path in (REPO / "runbooks").glob("*.yaml")
                      if (path.parent / "cases" / path.name).exists())
    samples: dict[str, list[float | None]] = {runbook: [] for runbook in runbooks}
    for round_ in range(1, args.rounds + 1):
        for runbook in alternated(runbooks, round_ - 1):
            wall, summary = _run(runbook)
            samples[runbook].append(wall)
            took = "FAILED" if wall is None else f"{wall:6.2f} s"
            print(f"round {round_}  {runbook:<36} {took}  ({summary})", flush=True)
    print("\n" + "\n".join(samples_table(samples, "runbook", "s", 2)))
    verdict = cases_verdict(samples)
    print(verdict.line())
    return 0 if verdict.met else 1


if __name__ == "__main__":
    raise SystemExit(main())

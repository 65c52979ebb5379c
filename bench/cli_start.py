"""How soon the `coldstart` command answers: `--help` and `validate runbooks/demo.yaml` against `python -c pass`.

Each command runs `--rounds` times (10 by default) as a fresh process, the three alternating so a
slow moment of the machine falls on all of them; wall time from spawn to exit. Prints the load average
at the start and the median, minimum and maximum of each. Goal: `--help` and `validate` under 300 ms
(the median). The commands run with bytecode writing on (PYTHONDONTWRITEBYTECODE removed), so the
unmeasured warm-up leaves the compiled modules an installed package has.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLDSTART = str(Path(sys.prefix) / "bin" / "coldstart")
GOAL_MS = 300.0

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "coldstart --help": [COLDSTART, "--help"],
    "coldstart validate runbooks/demo.yaml": [COLDSTART, "validate", "runbooks/demo.yaml"],
}


ENV = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}


def _wall_ms(argv: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    elapsed = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode().strip()[:300]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    for argv in COMMANDS.values():  # warm the page cache and the bytecode once, unmeasured
        _wall_ms(argv)
    print(f"load average at the start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.rounds):
        for name, argv in COMMANDS.items():
            samples[name].append(_wall_ms(argv))
    print(f"{'command':<40} {'median ms':>10} {'min':>8} {'max':>8}  goal")
    for name, values in samples.items():
        median = statistics.median(values)
        goal = "" if name.startswith("python") else ("met" if median < GOAL_MS else f"missed (< {GOAL_MS:.0f} ms)")
        print(f"{name:<40} {median:>10.0f} {min(values):>8.0f} {max(values):>8.0f}  {goal}")


if __name__ == "__main__":
    main()

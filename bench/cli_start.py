"""How soon the `coldstart` command answers: `--help` and `validate runbooks/demo.yaml` against `python -c pass`.

Each command runs `--rounds` times (10 by default) as a fresh process, the three alternating (the order reversed every other round) so a
slow moment of the machine falls on all of them; wall time from spawn to exit. Prints the load average
at the start and the median, minimum and maximum of each. Goal: `--help` and `validate` under 300 ms
(the median over rounds; NOT met when any run exited non-zero, counted). The commands run with bytecode writing on (PYTHONDONTWRITEBYTECODE removed), so the
unmeasured warm-up leaves the compiled modules an installed package has.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._verdict import Verdict, alternated, median, samples_table, under

COLDSTART = str(Path(sys.prefix) / "bin" / "coldstart")
GOAL_MS = 300.0

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "coldstart --help": [COLDSTART, "--help"],
    "coldstart validate runbooks/demo.yaml": [COLDSTART, "validate", "runbooks/demo.yaml"],
}


ENV = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}


def _wall_ms(argv: list[str]) -> float | None:
    """The wall time in ms; None (and the error printed) when the command failed."""
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    elapsed = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        print(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode().strip()[:300]}", file=sys.stderr)
        return None
    return elapsed


def start_verdict(samples: dict[str, list[float | None]]) -> Verdict:
    """Each coldstart command's median over its successful rounds under GOAL_MS; NOT met on any failed run."""
    goals = [under(f"{name} median", median(values), GOAL_MS, " ms")
             for name, values in samples.items() if not name.startswith("python")]
    return Verdict(goals, {"runs failed": sum(v is None for values in samples.values() for v in values)})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    for argv in COMMANDS.values():  # warm the page cache and the bytecode once, unmeasured
        _wall_ms(argv)
    print(f"load average at the start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    samples: dict[str, list[float | None]] = {name: [] for name in COMMANDS}
    for round_ in range(args.rounds):
        for name in alternated(list(COMMANDS), round_):
            samples[name].append(_wall_ms(COMMANDS[name]))
    print("\n".join(samples_table(samples, "command", "ms", 0)))
    verdict = start_verdict(samples)
    print(verdict.line())
    return 0 if verdict.met else 1


if __name__ == "__main__":
    raise SystemExit(main())

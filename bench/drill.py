"""Benchmark: the cold-start drill's wall time against the sum of its configured waits; goal: ratio <= 1.10."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

__all__ = ["main"]

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GOAL_RATIO = 1.10
# The postmortem's waits (the runbook's defaults) in seconds; --scale shrinks them all alike.
POSTMORTEM_WAITS = {"consul_bake": 600, "tier_bake": 300, "ramp_bake": 900}


def _scaled(scale: float) -> dict[str, str]:
    return {name: f"{max(1, round(seconds * scale))}s" for name, seconds in POSTMORTEM_WAITS.items()}


def main(argv: list[str] | None = None) -> int:
    import os

    from rich.console import Console

    from lab.drills.outage import run_lab_drill

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scale", type=float, default=None,
                    help="run with the postmortem's waits times this (e.g. 0.02); default: the drill's own waits")
    args = ap.parse_args(argv)
    os.chdir(REPO)  # the drill reads runbooks/ relative to the checkout
    params = _scaled(args.scale) if args.scale else {}
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="coldstart-bench-drill-") as tmp:
        report = asyncio.run(run_lab_drill("consul-cold-start", Path(tmp), console, params=params))
    waits = report.configured_wait_seconds
    print(f"drill outcome: {report.outcome}")
    print(f"waits: {'the drill overrides' if not params else params}")
    print(f"configured waits: {waits:.1f} s")
    # A drill that did not succeed meets no goal, however fast it ended.
    met = report.outcome == "succeeded" and report.run_seconds / waits <= GOAL_RATIO
    verdict = "met" if met else ("NOT met" if report.outcome == "succeeded" else f"NOT met: the drill {report.outcome}")
    print(f"run wall time (start to close): {report.run_seconds:.1f} s -> overhead ratio {report.run_seconds / waits:.2f} "
          f"(goal <= {GOAL_RATIO:.2f}: {verdict})")
    print(f"whole drill incl. lab up/down and report: {report.wall_seconds:.1f} s -> ratio {report.wall_seconds / waits:.2f}")
    for step, seconds in report.phases:
        print(f"  {step:28s} {seconds:8.1f} s")
    return 0 if report.outcome == "succeeded" else 1


if __name__ == "__main__":
    raise SystemExit(main())

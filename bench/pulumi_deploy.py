"""Benchmark: a real Pulumi engine on the lab's telemetry host: first up, preview, a one-target change, a
rejected rule and destroy, each timed, on one namespace host with sshd and Prometheus.

No goal: the figures say what `coldstart lab telemetry --pulumi` and tests/infra/test_pulumi_deploy.py cost.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["main"]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STEPS = ("first up (sshd, workspace, plugin, stack, up)", "preview, nothing changed", "preview, one target added",
         "up, one target added", "up, a rule promtool rejects", "destroy")


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _round(bin_dir: Path, subnet: str) -> list[float]:
    from infra.engine import PulumiError
    from tests.infra.pulumi_lab import pulumi_lab

    with tempfile.TemporaryDirectory(prefix="coldstart-bench-") as tmp, \
            pulumi_lab(Path(tmp) / "state", bin_dir, prefix="csj", subnet=subnet) as lab:
        engine = lab.engine
        times = [lab.first_up_s, _timed(engine.preview)]
        changed = copy.deepcopy(lab.config)
        changed["targets"]["players"].append(subnet.rsplit(".", 1)[0] + ".250:9105")
        engine.write_config(changed)
        times += [_timed(engine.preview), _timed(engine.up)]
        broken = copy.deepcopy(changed)
        broken["groupIntervals"] = {**broken["groupIntervals"], "coldstart-hosts": "1x"}
        engine.write_config(broken)
        t = time.perf_counter()
        try:
            engine.up()
            raise SystemExit("a rejected rule deployed")
        except PulumiError:
            times.append(time.perf_counter() - t)
        engine.write_config(changed)
        times.append(_timed(engine.destroy))
    return times


def main(argv: list[str] | None = None) -> int:
    from infra.engine import find_engine, missing_engine_reason

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--subnet", default="10.223.0.0/24", help="kept apart from a default lab and the tests")
    args = ap.parse_args(argv)
    if reason := missing_engine_reason():
        print(f"not measured: no Pulumi engine ({reason})")
        return 1
    bin_dir = find_engine()
    assert bin_dir is not None
    rounds = [_round(bin_dir, args.subnet) for _ in range(args.rounds)]
    print(f"engine: {bin_dir}")
    for i, step in enumerate(STEPS):
        xs = [r[i] for r in rounds]
        print(f"{step:48s} median {statistics.median(xs):6.2f} s  min {min(xs):6.2f}  max {max(xs):6.2f}"
              f"  (n={len(xs)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

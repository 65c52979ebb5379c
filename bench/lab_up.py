"""Benchmark: wall time of a cold `lab up`, a warm (idempotent) `lab up`, and `lab down`; goal: cold up < 20 s."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GOAL_UP_S = 20.0


def main(argv: list[str] | None = None) -> int:
    from lab.lifecycle import down, up
    from lab.settings import LabConfig

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--subnet", default="10.217.0.0/24", help="kept apart from a default lab")
    args = ap.parse_args(argv)
    cold, warm, downs = [], [], []
    with tempfile.TemporaryDirectory(prefix="coldstart-bench-") as tmp:
        cfg = LabConfig(state_dir=Path(tmp) / "state", inventory_path=Path(tmp) / "lab.yaml", prefix="csb",
                        bridge="csbbr0", veth_prefix="csbv", subnet=args.subnet)
        for _ in range(args.rounds):
            try:
                t = time.perf_counter()
                up(cfg)
                cold.append(time.perf_counter() - t)
                t = time.perf_counter()
                up(cfg)
                warm.append(time.perf_counter() - t)
            finally:
                t = time.perf_counter()
                down(cfg)
                downs.append(time.perf_counter() - t)
    for name, xs in (("lab up (cold)", cold), ("lab up (warm, idempotent)", warm), ("lab down", downs)):
        if xs:
            print(f"{name:28s} median {statistics.median(xs):6.2f} s  min {min(xs):6.2f}  max {max(xs):6.2f}  (n={len(xs)})")
    ok = bool(cold) and max(cold) < GOAL_UP_S
    print(f"goal: cold up < {GOAL_UP_S:.0f} s -> {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

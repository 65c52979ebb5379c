"""Benchmark: cold `lab up`, warm (idempotent) `lab up` and `lab down`, on real agents and on the stand-ins, in one run.

Vault is real in both (it has no stand-in).

Goals: cold up < 30 s on real Consul, Nomad and Vault; < 20 s on the stand-ins.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GOALS_S = {"real": 30.0, "standin": 20.0}


def _rounds(backend: str, rounds: int, subnet: str) -> dict[str, list[float]]:
    from lab.lifecycle import down, up
    from lab.settings import LabConfig

    os.environ["COLDSTART_STANDINS"] = "all" if backend == "standin" else ""
    times: dict[str, list[float]] = {"cold": [], "warm": [], "down": []}
    with tempfile.TemporaryDirectory(prefix="coldstart-bench-") as tmp:
        cfg = LabConfig(state_dir=Path(tmp) / "state", inventory_path=Path(tmp) / "lab.yaml", prefix="csb",
                        bridge="csbbr0", veth_prefix="csbv", subnet=subnet)
        for _ in range(rounds):
            try:
                t = time.perf_counter()
                info = up(cfg)
                times["cold"].append(time.perf_counter() - t)
                want = "stand-in" if backend == "standin" else "real"
                if not all(how.startswith(want if name != "vault" else "real")  # Vault has no stand-in
                           for name, how in info["backends"].items()):
                    raise SystemExit(f"{backend}: lab came up on {info['backends']}")
                t = time.perf_counter()
                up(cfg)
                times["warm"].append(time.perf_counter() - t)
            finally:
                t = time.perf_counter()
                down(cfg)
                times["down"].append(time.perf_counter() - t)
    return times


def main(argv: list[str] | None = None) -> int:
    from lab.hashistack.local import missing_binaries

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--subnet", default="10.225.0.0/24", help="kept apart from a default lab, the tests and the drills")
    args = ap.parse_args(argv)
    backends = ["standin"]
    if missing := missing_binaries():
        print(f"real agents: not measured (no {', '.join(missing)} binary on PATH)")
    else:
        backends.insert(0, "real")
    ok = True
    for backend in backends:
        times = _rounds(backend, args.rounds, args.subnet)
        for name, label in (("cold", "lab up (cold)"), ("warm", "lab up (warm, idempotent)"), ("down", "lab down")):
            xs = times[name]
            if xs:
                print(f"{backend:8s} {label:27s} median {statistics.median(xs):6.2f} s  min {min(xs):6.2f}  "
                      f"max {max(xs):6.2f}  (n={len(xs)})")
        met = bool(times["cold"]) and max(times["cold"]) < GOALS_S[backend]
        ok = ok and met
        print(f"{backend:8s} goal: cold up < {GOALS_S[backend]:.0f} s -> {'met' if met else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

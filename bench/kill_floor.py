"""The kernel's part of a drain's kill: the lab's containers killed outside the lab, nothing else running.

    .venv/bin/python bench/kill_floor.py [--containers 200] [--runs 10] [--probe-every SECONDS]

Needs root. Each round starts --containers session containers as the lab's node agent does
(lab/containers.ContainerHost: `unshare --pid --fork --mount-proc`, the same one-process workload, a
cgroup each below one parent), waits until every one answers, then runs the drain's own action,
`containers.kill_inits`, through Temporal's ActivityEnvironment and a network namespace of its own as the
host (no server, no lab, no other step). It prints each round's first-signal-to-last,
first-signal-to-every-cgroup-empty and whole-action times, their p50, p95 and max, and the load average at
the start: the floor `bench/drain.py`'s "cgroups empty" figure is measured against. With --probe-every, a task
probes every session as the lab's session router does (lab/session_router.py: all of them, every 0.25 s
there), through the kill too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _soak_figures import percentile
from temporalio.testing import ActivityEnvironment

from activities.containers import kill_inits
from activities.contracts.containers import KillInitsInput
from activities.contracts.targets import HostTarget
from lab.containers import ContainerHost, remove_sessions_cgroup, session_answers, sessions_cgroup

_PREFIX = "killfloor"
_NETNS = "coldstart-killfloor"
_HOST = "kf"


async def _probe(sockets: list[Path], every: float) -> None:
    while True:
        began = time.monotonic()
        await asyncio.gather(*(session_answers(sock) for sock in sockets))
        await asyncio.sleep(max(0.0, every - (time.monotonic() - began)))


async def _round(containers: int, state_dir: Path, probe_every: float) -> tuple[float, float, float, int]:
    host = ContainerHost(_HOST, _PREFIX, state_dir, store=None)
    prober: asyncio.Task | None = None
    try:
        gate = asyncio.Semaphore(16)  # as the node agent starts them

        async def start(i: int):
            async with gate:
                return await host.start(f"r{i}")

        started = await asyncio.gather(*(start(i) for i in range(containers)))
        silent = await host.wait_answering(list(started))
        if silent:
            raise RuntimeError(f"{len(silent)} containers never answered: {', '.join(silent[:5])}")
        if probe_every:
            prober = asyncio.create_task(_probe([c.socket for c in started], probe_every))
        await asyncio.sleep(0.5)
        target = HostTarget(name=_HOST, kind="netns", netns=_NETNS, python=sys.executable)
        began = time.monotonic()
        out = await ActivityEnvironment().run(kill_inits, KillInitsInput(
            host=_HOST, hosts=[target], cgroup_parent=sessions_cgroup(_PREFIX), verify_within_seconds=5))
        return out.signalled_seconds, out.seconds, time.monotonic() - began, out.killed_count
    finally:
        if prober is not None:
            prober.cancel()
        await host.close()
        remove_sessions_cgroup(_PREFIX)


async def _measure(args: argparse.Namespace) -> None:
    signals: list[float] = []
    empty: list[float] = []
    action: list[float] = []
    print(f"load average at the start: {os.getloadavg()[0]:.2f}; {args.containers} containers a round, {args.runs} rounds"
          + (f", every session probed every {args.probe_every:g} s" if args.probe_every else ", no probes"))
    with tempfile.TemporaryDirectory(prefix="killfloor-") as state:
        for r in range(args.runs):
            began = time.monotonic()
            sent, emptied, whole, killed = await _round(args.containers, Path(state), args.probe_every)
            signals.append(sent)
            empty.append(emptied)
            action.append(whole)
            print(f"round {r + 1}: {killed} killed, first signal to last {sent * 1000:.1f} ms, to every cgroup empty "
                  f"{emptied * 1000:.1f} ms, the whole action {whole * 1000:.1f} ms (round {time.monotonic() - began:.1f} s)",
                  flush=True)
    for name, values in (("first signal to last", signals), ("first signal to every cgroup empty", empty),
                         ("the whole action (the script's start, the reads before and after, the kill)", action)):
        print(f"{name} (s): p50 {statistics.median(values):.3f}, p95 {percentile(values, 95):.3f}, "
              f"max {max(values):.3f} over {len(values)} rounds")


def main(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print("kill_floor: needs root (cgroups, namespaces)", file=sys.stderr)
        return 2
    subprocess.run(["ip", "netns", "add", _NETNS], check=False, capture_output=True)
    try:
        asyncio.run(_measure(args))
    finally:
        remove_sessions_cgroup(_PREFIX)
        subprocess.run(["ip", "netns", "delete", _NETNS], check=False, capture_output=True)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--containers", type=int, default=200)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--probe-every", type=float, default=0.0, help="probe every session this often (0: never)")
    sys.exit(main(parser.parse_args()))

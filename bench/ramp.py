"""Benchmark: the players ramp on one lab, fixed 10 % steps against adaptive, from a cold cache and with the cache flushed mid-ramp.

Goal (issue 35): adaptive reaches 100 % in at most half the fixed ramp's time, with no gate violation and a peak
database load no higher than the fixed ramp's; with the cache flushed mid-ramp it backs off and holds the gates.
Each variant runs --rounds times (3), the order reversed every other round; the goals are judged on the medians
over rounds, and are NOT met with a ramp that did not succeed or a figure missing (no Prometheus series).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["cold_verdict", "herd_verdict", "main"]

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._verdict import Goal, Verdict, alternated, at_most, median, no_more_than

RUNBOOK = REPO / "bench" / "ramp.yaml"
# Kept apart from the default lab, the test labs (tests/lab/conftest.py), the other benches and each other
# (--lab): two benches may run side by side.
LABS = {name: {"prefix": f"cs{name}", "bridge": f"cs{name}br0", "veth_prefix": f"cs{name}v", "subnet": subnet}
        for name, subnet in (("r", "10.226.0.0/24"), ("q", "10.227.0.0/24"), ("u", "10.228.0.0/24"))}
HERD_AT = 60  # the mid-ramp flush: once the ramp's target reaches this percentage (both ramps set 60 on their way)
ZONE_POLL_S = 0.05  # how often the herd case reads the zone: the flush lands this long at most after the ramp sets it
CONVERGENCE_GATE = "admitted-on-target"  # waits for players to see a new percentage: no health reading
HIT_RATIO_MIN = 0.8  # bench/ramp.yaml's cache_hit_ratio_min
HIT_RATIO_GATE = "cache-hit-ratio"
RESOLVER_SWEEP_S = 8.0  # lab/players.py re-resolves every 5 s: after this every player sees maintenance


@dataclass
class Result:
    """One ramp: what the run recorded and what Prometheus saw between its first step and its end."""

    name: str
    outcome: str
    seconds: float | None = None  # first step to the gates passing at 100 %
    peak_db_qps: float | None = None
    worst_hit_ratio: float | None = None
    failed_readings: int = 0
    readings: int = 0
    health_failed: list[tuple[str, int | None]] = field(default_factory=list)  # (gate, percent) of failed health reads
    stepped_into: list[int] = field(default_factory=list)  # percentages a step set on a failing health gate
    hit_ratio_low_s: float | None = None  # seconds the cache hit ratio spent under its gate's threshold
    max_over_target: float | None = None
    percents: list[int] = field(default_factory=list)  # the percentages the ramp set, in order
    decisions: list[str] = field(default_factory=list)
    flushed_at: int | None = None
    flush_lag_s: float | None = None  # the flush's own time, from the zone read at flushed_at (after a poll of ZONE_POLL_S at most)
    hit_ratio_at_flush: list[float] = field(default_factory=list)  # the hit-ratio gate's readings at flushed_at
    warm: str | None = None  # the warm-up's time and keys written, when the variant warms the cache
    round: int = 1


def _variants(adaptive: dict[str, Any] | None) -> dict[str, str]:
    """The bench runbook's variants by name: fixed (no adaptive, no warm-up), adaptive (no warm-up, the parameters
    overridden by `adaptive`), and each with the warm-up (adaptive-warm is the runbook as written)."""
    import yaml

    from workflows.yaml_safety import load_text

    data = load_text(RUNBOOK.read_text())
    players = next(s for s in data["steps"] if s["id"] == "players")
    policy = {**players["ramp"]["adaptive"], **(adaptive or {})}
    texts = {}
    for name, adaptive_on, warm in (("fixed", False, False), ("adaptive", True, False), ("fixed-warm", False, True),
                                    ("adaptive-warm", True, True)):
        ramp = {k: v for k, v in players["ramp"].items() if k != "adaptive"} | ({"adaptive": policy} if adaptive_on else {})
        steps = [({**s, "ramp": ramp} if s["id"] == "players" else s) for s in data["steps"] if warm or s["id"] != "warm"]
        metadata = {**data["metadata"], "name": f"ramp-bench-{name}"}
        texts[name] = yaml.safe_dump({**data, "metadata": metadata, "steps": steps}, sort_keys=False)
    return texts


async def _series(prometheus: str, query: str, start: float, end: float) -> list[float]:
    from activities.prometheus import PrometheusError, range_query

    try:
        result = (await range_query(prometheus, query, start=start, end=end)).get("result", [])
    except PrometheusError:
        return []
    return [float(v) for _, v in result[0]["values"]] if result else []


@dataclass(frozen=True)
class _Reading:
    gate: str
    percent: int | None
    value: float | None
    passed: bool


async def _all_readings(client: Any, handle: Any, kept: list[Any]) -> list[_Reading]:
    """Every reading of the players step, from the run's history: its status keeps only the newest 60. Each is
    judged by its gate's comparator and threshold, as the kept readings carry them."""
    from temporalio.api.enums.v1 import EventType

    from activities.contracts.telemetry import READ_ACTIONS
    from workflows.calls import compare

    bounds = {r.gate: (r.comparator, r.threshold) for r in kept if r.comparator is not None and r.threshold is not None}
    converter = client.data_converter
    scheduled: dict[int, list[dict[str, Any]]] = {}
    readings: list[_Reading] = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name in READ_ACTIONS:
                [args] = await converter.decode(attrs.input.payloads)
                scheduled[event.event_id] = args.get("reads") or [args]
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attrs = event.activity_task_completed_event_attributes
            reads = scheduled.pop(attrs.scheduled_event_id, None)
            if reads is None:
                continue
            [value] = await converter.decode(attrs.result.payloads)
            results = value.get("readings", [value])
            for read, got in zip(reads, results, strict=False):
                gate, number = read.get("gate"), got.get("value")
                if read.get("step") != "players" or gate not in bounds:
                    continue
                comparator, threshold = bounds[gate]
                passed = number is not None and got.get("error") is None and compare(number, comparator, threshold)
                readings.append(_Reading(gate, read.get("percent"), number, passed))
    return readings


async def _measure(result: Result, status: Any, prometheus: str, client: Any, handle: Any) -> None:
    warm = next((s for s in status.steps if s.id == "warm"), None)
    if warm is not None and warm.started_at and warm.ended_at:
        result.warm = f"{(warm.ended_at - warm.started_at).total_seconds():.1f} s, {warm.outputs.get('written')} keys"
    players = next(s for s in status.steps if s.id == "players")
    readings = await _all_readings(client, handle, players.readings)
    result.readings = len(readings)
    result.failed_readings = sum(not r.passed for r in readings)
    # A violation is a health gate (not the convergence gate) read with a value outside its threshold; a step "into" one is a
    # percentage the ramp stepped to, other than its first (a cold start) and the one the bench flushed at.
    # A reading with no value (an empty window, an unreachable Prometheus) fails its gate but measures nothing.
    result.health_failed = [(r.gate, r.percent) for r in readings
                            if not r.passed and r.gate != CONVERGENCE_GATE and r.value is not None]
    first = result.percents[0] if result.percents else None
    result.stepped_into = sorted({p for _, p in result.health_failed
                                  if p is not None and p not in (first, result.flushed_at)})
    result.decisions = [d.reason for d in players.ramp_decisions]
    result.hit_ratio_at_flush = [r.value for r in readings if r.gate == HIT_RATIO_GATE and r.percent == result.flushed_at
                                 and r.value is not None]
    if players.started_at is None:
        return
    start = players.started_at.timestamp()
    end = (players.ended_at or datetime.now(UTC)).timestamp()
    if players.status == "succeeded" and players.outputs.get("percent") == 100:
        result.seconds = end - start
    # The 1 m windows behind the recording rules reach a little past the ramp's end: read them up to it.
    db = await _series(prometheus, "coldstart:db_queries_per_second", start, end)
    hits = [v for v in await _series(prometheus, "coldstart:cache_hit_ratio", start, end) if not math.isnan(v)]
    over = await _series(prometheus, "max(coldstart_players_admitted_fraction) * 100 - max(coldstart_players_target_percent)",
                         start, end)
    result.peak_db_qps = max(db, default=None)
    result.worst_hit_ratio = min(hits, default=None)
    result.hit_ratio_low_s = 2.0 * sum(v < HIT_RATIO_MIN for v in hits)  # the range query's 2 s step
    result.max_over_target = max((v for v in over if not math.isnan(v)), default=None)


async def _flush_at_herd(cfg: Any, dns: dict[str, Any], result: Result) -> None:
    """Flush the cache the moment a server's zone says HERD_AT % or more: read from the zone itself, every
    ZONE_POLL_S, so both ramps' gates at that percentage read the same time after the flush (the run's status
    would add its view's pace and the bench's poll, up to a second, and decide whether a 4 s bake sees it)."""
    from activities.dns.axfr import read_state
    from lab import faults

    zone = dns["zone"] if dns["zone"].endswith(".") else dns["zone"] + "."
    fqdn = dns["name"] if dns["name"].endswith(".") else f"{dns['name']}.{zone}"
    armed = False  # the zone may still hold the last run's 100 % until this run's maintenance step sets 0
    while True:
        states = await asyncio.gather(*(read_state(s, zone, fqdn, 1.0) for s in dns["servers"]),
                                      return_exceptions=True)
        percents = [s.percent for s in states if not isinstance(s, BaseException) and s.percent is not None]
        armed = armed or (len(percents) == len(states) and max(percents) < HERD_AT)
        if armed and percents and max(percents) >= HERD_AT:
            seen = time.monotonic()
            await asyncio.to_thread(faults.inject, cfg, "cold-cache")
            result.flushed_at, result.flush_lag_s = int(max(percents)), time.monotonic() - seen
            return
        await asyncio.sleep(ZONE_POLL_S)


async def _ramp(client: Any, run: Any, queue: str, cfg: Any, name: str, herd: bool) -> Result:
    """Run one variant: maintenance, a flush once every player sees it, the settle wait, the ramp (and a flush at
    HERD_AT % when `herd`). A held step is aborted: unattended, nobody answers it."""
    from runtime.polling import read_full_status
    from runtime.runs import start_run

    result = Result(name=name, outcome="running")
    handle = await start_run(client, run, queue)
    herd_flush = asyncio.ensure_future(_flush_at_herd(cfg, run.target["dns"], result)) if herd else None
    try:
        await _follow(handle, cfg, result)
    finally:
        if herd_flush is not None and not herd_flush.done():
            herd_flush.cancel()
    status = await read_full_status(handle)  # the memo keeps only the newest readings
    result.outcome = status.state
    prometheus = run.target["telemetry"]["prometheus"]
    await asyncio.sleep(3)  # one more scrape and rule evaluation past the ramp's end
    await _measure(result, status, prometheus, client, handle)
    if herd_flush is not None and herd_flush.done() and not herd_flush.cancelled() and herd_flush.exception():
        result.outcome += f" (the flush failed: {herd_flush.exception()})"
    return result


async def _follow(handle: Any, cfg: Any, result: Result) -> None:
    """Follow the run to its end: flush the cache cold while it settles, note each percentage set, abort a hold."""
    from lab import faults
    from runtime.polling import read_kept_status
    from workflows.contract import ControlRequest

    settle_seen: float | None = None
    flushed_cold = False
    while True:
        await asyncio.sleep(0.5)
        try:
            status = await read_kept_status(handle, attempts=1)
        except Exception:  # noqa: BLE001, S112 - a busy server answers the next poll
            continue
        steps = {s.id: s for s in status.steps}
        if not flushed_cold and steps["settle"].status == "running":
            settle_seen = settle_seen or time.monotonic()
            if time.monotonic() - settle_seen >= RESOLVER_SWEEP_S:
                await asyncio.to_thread(faults.inject, cfg, "cold-cache")
                flushed_cold = True
        players = steps["players"]
        if players.percent is not None and (not result.percents or result.percents[-1] != players.percent):
            result.percents.append(players.percent)
        if status.over:
            break
        if status.held:
            await handle.execute_update("abort", ControlRequest(actor="ramp-bench", reason=f"held: {status.held}"))
    if not flushed_cold:
        result.outcome += " (the cache was never flushed cold)"


async def _bench(args: argparse.Namespace, state_dir: Path) -> list[Result]:
    from activities.catalog import load_registry
    from lab import lifecycle
    from lab.drills.outage import vault_token
    from lab.settings import LabConfig
    from runtime.catalog import Catalog
    from runtime.connection import connect
    from runtime.processes import free_port, start_process
    from runtime.server_config import dev_server_argv
    from runtime.worker import build_worker
    from workflows.loader import plan_run, read_inventory

    targets = state_dir / "targets"
    catalog_dir = state_dir / "runbooks"
    catalog_dir.mkdir(parents=True)
    for name, text in _variants(args.adaptive).items():
        (catalog_dir / f"ramp-bench-{name}.yaml").write_text(text)
    # The drill's load: 200 player requests/s.
    cfg = LabConfig.model_validate({"state_dir": state_dir / "lab", "inventory_path": targets / "lab.yaml",
                                    "players_rps": 200.0, **LABS[args.lab]})
    results: list[Result] = []
    # Stopped by a signal, the bench still takes its lab down: the signal cancels it, the finally runs.
    task = asyncio.current_task()
    for sig in (signal.SIGINT, signal.SIGTERM):
        if task is not None:
            asyncio.get_running_loop().add_signal_handler(sig, task.cancel)
    try:
        info = await asyncio.to_thread(lifecycle.up, cfg)
        print(f"lab up in {info['seconds']} s: " + ", ".join(f"{k} {v}" for k, v in info["backends"].items()),
              file=sys.stderr)
        inventory = read_inventory(info["inventory"]).as_target()
        port = free_port()
        with start_process(dev_server_argv(state_dir / "temporal.db", port, ui_port=free_port()),
                           log=state_dir / "temporal.log", port=port):
            client = await connect(target_host=f"127.0.0.1:{port}", namespace="default", ready_within=60)
            queue = f"ramp-bench-{os.getpid()}"
            async with build_worker(client, queue, catalog=Catalog(catalog_dir, targets)):
                for round_, herd in itertools.product(range(args.rounds), args.cases):
                    for name in alternated(args.variants, round_):
                        run = plan_run(catalog_dir / f"ramp-bench-{name}.yaml", registry=load_registry(),
                                       targets_dir=targets, initiator="ramp-bench", drill=True)
                        label = name + (" +flush" if herd else "")
                        # A fresh login per ramp: the lab's AppRole tokens expire within a bench's run.
                        os.environ["VAULT_TOKEN"] = await asyncio.to_thread(vault_token, inventory)
                        print(f"{label}: running (round {round_ + 1})", file=sys.stderr)
                        result = await _ramp(client, run, queue, cfg, label, herd)
                        result.round = round_ + 1
                        print(f"{label}: {result.outcome}, {result.percents}", file=sys.stderr)
                        results.append(result)
    finally:
        await asyncio.to_thread(lifecycle.down, cfg)
    return results


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _table(results: list[Result]) -> None:
    from activities.retry import format_duration

    rows = [
        ("outcome", lambda r: r.outcome),
        ("first step to 100 %", lambda r: "-" if r.seconds is None else f"{format_duration(r.seconds)} ({r.seconds:.1f} s)"),
        ("peak database load (q/s)", lambda r: _fmt(r.peak_db_qps, ".1f")),
        ("worst cache hit ratio", lambda r: _fmt(r.worst_hit_ratio, ".3f")),
        ("gate readings failed (all)", lambda r: f"{r.failed_readings} of {r.readings}"),
        ("health-gate readings failed", lambda r: _failed_by_gate(r.health_failed)),
        ("steps into a failing health gate", lambda r: " ".join(map(str, r.stepped_into)) or "none"),
        ("time hit ratio < 0.8", lambda r: "-" if r.hit_ratio_low_s is None else f"{r.hit_ratio_low_s:.0f} s"),
        ("admitted over target (points)", lambda r: _fmt(r.max_over_target, "+.1f")),
        ("steps set (%)", lambda r: " ".join(map(str, r.percents))),
        ("cache flushed at", lambda r: "-" if r.flushed_at is None else f"{r.flushed_at} % (+{r.flush_lag_s:.2f} s)"),
        ("hit ratio read there", lambda r: " ".join(f"{v:.2f}" for v in r.hit_ratio_at_flush[:6]) or "-"),
        ("warm-up before the ramp", lambda r: r.warm or "-"),
    ]
    width = max(len(label) for label, _ in rows)
    print(f"{'':{width}}  " + "  ".join(f"{f'{r.name} #{r.round}':>22}" for r in results))
    for label, cell in rows:
        print(f"{label:{width}}  " + "  ".join(f"{cell(r):>22}" for r in results))
    for r in results:
        if r.decisions:
            print(f"\n{r.name} decisions:")
            for reason in r.decisions:
                print(f"  {reason}")


def _failed_by_gate(failed: list[tuple[str, int | None]]) -> str:
    if not failed:
        return "none"
    gates: dict[str, list[str]] = {}
    for gate, percent in failed:
        gates.setdefault(gate, []).append(str(percent))
    return "; ".join(f"{gate} x{len(at)}" for gate, at in gates.items())


def _verdict(results: list[Result]) -> list[tuple[str, Verdict]]:
    """The issue's goals on the medians over rounds, for each pair that ran: (fixed, adaptive) from a cold cache,
    then with the mid-ramp flush. A side with no ramp, or a ramp with no figure (a missing series), is NOT met."""
    by: dict[str, list[Result]] = {}
    for r in results:
        by.setdefault(r.name, []).append(r)
    lines = []
    for warm in ("", "-warm"):
        fixed, adaptive = by.get(f"fixed{warm}", []), by.get(f"adaptive{warm}", [])
        if fixed or adaptive:
            lines.append((f"goal, fixed{warm} vs adaptive{warm} (medians over {max(len(fixed), len(adaptive))} rounds)",
                          cold_verdict(fixed, adaptive)))
        fixed, adaptive = by.get(f"fixed{warm} +flush", []), by.get(f"adaptive{warm} +flush", [])
        if fixed or adaptive:
            lines.append((f"thundering herd{warm} (over {max(len(fixed), len(adaptive))} rounds)",
                          herd_verdict(fixed, adaptive)))
    return lines


def _not_succeeded(ramps: list[Result]) -> int:
    return sum(r.outcome != "succeeded" for r in ramps)


def _no_series(ramps: list[Result]) -> int:
    return sum(r.peak_db_qps is None for r in ramps)


def cold_verdict(fixed: list[Result], adaptive: list[Result]) -> Verdict:
    """Adaptive reaches 100 % in at most half the fixed ramp's median time, with a median peak database load no
    higher; NOT met on any ramp that did not succeed or any failed health-gate reading of the adaptive ramp."""
    fixed_s, adaptive_s = median([r.seconds for r in fixed]), median([r.seconds for r in adaptive])
    goals = [at_most("adaptive to 100 %", adaptive_s, fixed_s / 2, " s") if fixed_s is not None
             else Goal("adaptive to 100 %", False, "no data for the fixed ramp"),
             no_more_than("peak db load", median([r.peak_db_qps for r in adaptive]),
                          median([r.peak_db_qps for r in fixed]), " q/s")]
    return Verdict(goals, {"ramps not succeeded": _not_succeeded(fixed + adaptive),
                           "ramps with no db load series": _no_series(fixed + adaptive),
                           "adaptive health-gate readings failed": sum(len(r.health_failed) for r in adaptive)})


def herd_verdict(fixed: list[Result], adaptive: list[Result]) -> Verdict:
    """With the cache flushed mid-ramp, at the same percentage in every ramp (more players on an emptied cache
    load the database more): the fixed ramp steps into a failing health gate in most rounds, the adaptive one
    in none, and its median peak database load is no higher; NOT met on any adaptive ramp that did not succeed."""
    flushed = {r.flushed_at for r in fixed + adaptive}
    same = len(flushed) == 1 and None not in flushed and bool(fixed) and bool(adaptive)
    fixed_into = sum(bool(r.stepped_into) for r in fixed)
    goals = [Goal("flushed at the same percentage", same, "at " + ", ".join(f"{p} %" for p in sorted(flushed, key=str))),
             Goal("fixed steps into a failing health gate", bool(fixed) and 2 * fixed_into >= len(fixed),
                  f"{fixed_into} of {len(fixed)} rounds"),
             no_more_than("peak db load", median([r.peak_db_qps for r in adaptive]),
                          median([r.peak_db_qps for r in fixed]), " q/s")]
    return Verdict(goals, {"adaptive ramps not succeeded": _not_succeeded(adaptive),
                           "ramps with no db load series": _no_series(fixed + adaptive),
                           "adaptive ramps stepping into a failing health gate": sum(bool(r.stepped_into) for r in adaptive)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--adaptive", type=json.loads, default=None,
                    help='override the adaptive parameters of bench/ramp.yaml, e.g. \'{"increase": 20}\'')
    ap.add_argument("--case", choices=("cold", "herd", "both"), default="both",
                    help=f"cold: from a cold cache; herd: also flushed at {HERD_AT} %%; both (default)")
    ap.add_argument("--lab", choices=sorted(LABS), default="r", help="which of the bench's lab subnets (default r)")
    ap.add_argument("--warm", action="store_true", help="also run both after warming the cache (cache.warm)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of every variant, the order reversed every other round (the goals are medians)")
    ap.add_argument("--only", choices=("fixed", "adaptive", "fixed-warm", "adaptive-warm"), action="append",
                    help="run only these variants (repeatable)")
    args = ap.parse_args(argv)
    args.cases = {"cold": [False], "herd": [True], "both": [False, True]}[args.case]
    args.variants = args.only or ["fixed", "adaptive", *(["fixed-warm", "adaptive-warm"] if args.warm else [])]
    os.chdir(REPO)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="coldstart-bench-ramp-") as tmp:
        results = asyncio.run(_bench(args, Path(tmp)))
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, {time.monotonic() - started:.0f} s in all")
    _table(results)
    verdicts = _verdict(results)
    for label, verdict in verdicts:
        print(verdict.line(label))
    return 0 if verdicts and all(verdict.met for _, verdict in verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""A soak on the PostgreSQL cluster: fleet targets running runbooks back to back for minutes while workers, the server, PostgreSQL, Prometheus and DNS fail on a schedule.

    .venv/bin/python bench/soak.py [--targets 10] [--minutes 6] [--keep-dir DIR]
    .venv/bin/python bench/soak.py --targets 50 --minutes 15          # the full setting (more than 2 cores)
    .venv/bin/python bench/soak.py --targets 50 --minutes 17 --baseline 180   # the same faults, and the control
    .venv/bin/python bench/soak.py --targets 3 --minutes 1.65 --baseline 20 --kill-every 4 --kills-only
                                                                   # a worker SIGKILLed every 4 s from 20 to 96 s, nothing else

Brings up the cluster (runtime/cluster.py: Temporal's server on a private PostgreSQL), three real workers
(worker.py, each its own process group, one action journal), and Debian's Prometheus scraping itself. Each
target is a development target whose telemetry is that Prometheus; it runs runbooks/demo.yaml and
bench/soak-drain.yaml in turn, each started with runtime.runs.start_run, the next as soon as the last one
ends, until the soak's time is up; the in-flight runs are then waited for (--drain-seconds). The bench
approves the demo's `go` as an operator would; a run that holds stays held and its target runs no more.

Faults (bench/_soak_figures.fault_schedule): none during the first --baseline seconds; then a worker
SIGKILLed every minute (--kill-every) and started again at once, and, unless --kills-only, once each, between two kills: the Temporal server
restarted (SIGTERM, start), PostgreSQL restarted (fast shutdown, start), Prometheus stopped for 30 s and
the DNS server stopped for 30 s. The DNS server is Debian's PowerDNS with the lab's TSIG'd zone of Lua
steering records (lab/dns), on loopback; every target's `dns` entry points at it, and the drain runbook
reads its steering record (dns.steer.get, by AXFR) in every run.

Printed: runs started, ended (succeeded, failed, aborted, rolled back), failed (with reasons), held (with reasons), unfinished; steps run twice
(activities.journal.check_journal over the workers' journal); p50/p95/p99 of step latency (an activity's
scheduled to closed, from the history's server timestamps) in the baseline and under faults; per fault,
the longest a run went without a history event across the fault, and the longest wait for a run's first
event after the fault cleared (its recovery); and, as a control, that recovery figure read at quiet instants
of the baseline, where nothing failed: a run waits that long for its next event anyway (a gate read
queued behind other runs' steps, a timer). The goal line (soak_verdict) is NOT met when any run failed, held or
was left unfinished, or any step ran twice, or the recovery from a fault took 15 s or more. Needs root (the cluster's PostgreSQL runs as postgres).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import httpx
import yaml
from _soak_figures import (
    Fault,
    RunTrace,
    Stall,
    baseline_gap,
    fault_schedule,
    latencies_between,
    percentile,
    quiet_instants,
    quiet_recoveries,
    stall_around,
)
from _targets import use_development_targets
from _verdict import Goal, Verdict
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from activities.catalog import load_registry
from activities.journal import Attempt, Repeat, check_journal, read_journal
from activities.retry import format_duration
from lab.dns import PdnsProcess, PdnsSettings, free_dns_port, prepare
from lab.dns import start as start_pdns
from lab.dns import stop as stop_pdns
from lab.drills.harness import WorkerProcess
from runtime.cluster import Cluster
from runtime.polling import read_kept_status
from runtime.processes import free_port, stop_process, wait_port
from runtime.runs import TargetBusy, start_run, workflow_id_for
from runtime.worker import READINGS_SHARE_ENV, reading_settings
from workflows.contract import ApproveRequest
from workflows.loader import plan_run

QUEUE = "soak"
WORKERS = 3
BOOKS = (ROOT / "runbooks" / "demo.yaml", ROOT / "bench" / "soak-drain.yaml")
PROMETHEUS_DOWN_S = 30.0
DNS_DOWN_S = 30.0
RECOVERY_GOAL_S = 15.0
_CLOSED = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity_task_completed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity_task_failed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity_task_timed_out_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: "activity_task_canceled_event_attributes",
}


class Prometheus:
    """Debian's Prometheus scraping itself every second, on a fixed port so it comes back where the targets point."""

    def __init__(self, work: Path):
        self.work, self.port = work, free_port()
        self.process: subprocess.Popen[bytes] | None = None
        work.mkdir(parents=True, exist_ok=True)
        (work / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{self.port}"]}]}],
        }))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise SystemExit("prometheus is not on PATH (Debian: apt-get install prometheus)")
        with (self.work / "prometheus.log").open("ab") as out:
            self.process = subprocess.Popen(
                [binary, f"--config.file={self.work / 'prometheus.yml'}", f"--storage.tsdb.path={self.work / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        wait_port(self.port, timeout=30, process=self.process)
        # Ready, and its own `up` scraped (a few seconds on a fresh database): what the runbooks' gates read.
        deadline = time.monotonic() + 60
        while not self._up():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus at {self.url} not scraping itself within 60 s")
            time.sleep(0.2)

    def _up(self) -> bool:
        try:
            if httpx.get(f"{self.url}/-/ready", timeout=2).status_code != 200:
                return False
            answer = httpx.get(f"{self.url}/api/v1/query", params={"query": 'max(up{job="prometheus"})'}, timeout=2)
            return bool(answer.json()["data"]["result"])
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        stop_process(self.process, grace=10)
        self.process = None


class PowerDns:
    """Debian's PowerDNS serving the lab's steering zone on loopback, on a fixed port so it comes back where the targets point."""

    def __init__(self, work: Path):
        self.lab = prepare(work, PdnsSettings(port=free_dns_port()))
        self.process: PdnsProcess | None = None

    def start(self) -> None:
        if shutil.which("pdns_server", path="/usr/sbin:/usr/bin") is None:
            raise SystemExit("pdns_server is not installed (Debian: apt-get install pdns-server pdns-backend-sqlite3)")
        self.process = start_pdns(self.lab)

    def stop(self) -> None:
        if self.process is not None:
            stop_pdns(self.process)
            self.process = None

    def steering(self) -> dict[str, Any]:
        """A target's `dns` entry (activities.inventory.DnsSteering) for this server's steering record."""
        settings = self.lab.settings
        return {
            "zone": settings.zone, "name": settings.steering_names[0], "servers": [settings.address],
            "game_ip": settings.game_ip, "maint_ip": settings.maint_ip, "tsig_key_name": settings.key_name,
            # The soak runs no Vault: its runs only read the record (AXFR, no key), so nothing follows this
            # reference, and the key stays in the server's own state dir (mode 0700).
            "tsig_secret": {"address": "http://vault.invalid:8200", "path": "coldstart/dns-tsig", "field": "secret"},
        }


@dataclass
class Outcome:
    target: str
    runbook: str
    workflow_id: str
    run_id: str
    state: str = "running"  # succeeded, failed, aborted, rolled_back; held; unfinished
    reason: str = ""


class Soak:
    """The fleet's drivers, the fault schedule and what they recorded."""

    def __init__(self, client: Client, cluster: Cluster, workers: list[WorkerProcess], prometheus: Prometheus,
                 dns: PowerDns, targets: list[dict[str, Any]], *, seconds: float, baseline: float, drain: float, say,
                 schedule: list[tuple[float, str]]):
        self.client, self.cluster, self.workers, self.prometheus, self.dns = client, cluster, workers, prometheus, dns
        self.targets, self.seconds, self.baseline, self.drain, self.say = targets, seconds, baseline, drain, say
        self.schedule = schedule
        self.registry = load_registry()
        self.outcomes: list[Outcome] = []
        self.start_errors: Counter[str] = Counter()
        self.faults: list[Fault] = []
        self.began = 0.0  # wall clock
        self._kills = 0

    async def run(self) -> None:
        self.began = time.time()
        ends, gives_up = time.monotonic() + self.seconds, time.monotonic() + self.seconds + self.drain
        faults = asyncio.create_task(self._faults(self.schedule))
        try:
            await asyncio.gather(*(self._drive(i, target, ends, gives_up) for i, target in enumerate(self.targets)))
        finally:
            faults.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await faults

    # ---- the fleet -------------------------------------------------------------------------------
    async def _drive(self, index: int, target: dict[str, Any], ends: float, gives_up: float) -> None:
        """One target: a run, then the next as soon as it ends, until the soak's time is up."""
        turn = index
        while time.monotonic() < ends:
            # The same runbook until its start is taken: a lost answer's run is then found as that runbook's.
            outcome = await self._start(target, BOOKS[turn % len(BOOKS)])
            if outcome is None:
                await asyncio.sleep(1)  # the server refused the start (restarting): ask again
                continue
            turn += 1
            self.outcomes.append(outcome)
            await self._follow(outcome, gives_up)
            if outcome.state in ("held", "unfinished"):
                return  # the target stays with its held run, as it would for an operator

    async def _start(self, target: dict[str, Any], book: Path) -> Outcome | None:
        run = plan_run(book, registry=self.registry, inventory=target, initiator="soak")
        workflow_id = workflow_id_for(target["name"])
        try:
            try:
                # Bounded: a start the server took but never answered is found by the next one (TargetBusy below).
                run_id = (await asyncio.wait_for(start_run(self.client, run, QUEUE), 30)).result_run_id or ""
            except TargetBusy:
                # An earlier start went through though its answer was lost (the server restarting): that run is ours.
                run_id = (await self.client.get_workflow_handle(workflow_id).describe()).run_id or ""
        except Exception as exc:  # noqa: BLE001 - counted by reason; the driver asks again
            self.start_errors[f"{type(exc).__name__}: {str(exc)[:120]}"] += 1
            return None
        return Outcome(target["name"], run.runbook.metadata.name, workflow_id, run_id)

    async def _follow(self, outcome: Outcome, gives_up: float) -> None:
        """Read the run's status from the server until it ends or holds; approve what waits for approval."""
        handle: WorkflowHandle = self.client.get_workflow_handle(outcome.workflow_id, run_id=outcome.run_id)
        while time.monotonic() < gives_up:
            try:
                status = await read_kept_status(handle, attempts=1)
            except Exception:  # noqa: BLE001 - the server or a worker restarting: ask again
                await asyncio.sleep(0.5)
                continue
            if status.over:
                outcome.state, outcome.reason = status.state, status.error or ""
                return
            if status.held:
                errors = {step.id: step.error for step in status.steps}
                outcome.state = "held"
                outcome.reason = "; ".join(f"{step}: {errors.get(step) or '?'}" for step in status.held)
                return
            for step in status.awaiting_approval:
                with contextlib.suppress(Exception):  # already approved, or the worker restarting: next round
                    await asyncio.wait_for(handle.execute_update(
                        "approve", ApproveRequest(step=step, approver="bob", comment="soak")), 10)
            await asyncio.sleep(0.5)
        outcome.state, outcome.reason = "unfinished", f"still running {format_duration(self.drain)} after the soak"

    # ---- the faults ------------------------------------------------------------------------------
    async def _faults(self, schedule: list[tuple[float, str]]) -> None:
        started = time.monotonic()
        for offset, name in schedule:
            await asyncio.sleep(max(0.0, started + offset - time.monotonic()))
            at = time.time()
            try:
                detail, end = await getattr(self, "_" + name.replace("-", "_"))()
            except Exception as exc:  # noqa: BLE001 - a fault that could not be cleared is a finding, not a crash
                detail, end = f"could not be cleared: {type(exc).__name__}: {exc}", time.time()
            self.faults.append(Fault(name, at, end, detail))
            self.say(f"{at - self.began:6.1f}s {name}: {detail} ({len(self.outcomes)} runs started so far)")

    async def _worker_kill(self) -> tuple[str, float]:
        worker = self.workers[self._kills % len(self.workers)]
        self._kills += 1
        pid = worker.kill()
        killed = time.time()
        await asyncio.to_thread(worker.start)
        return f"worker {worker.log.stem} (pid {pid}) SIGKILLed, started again in {time.time() - killed:.1f} s", killed

    async def _temporal_restart(self) -> tuple[str, float]:
        at = time.time()
        await self.cluster.stop_server()
        await self.cluster.start_server()
        return f"server stopped (SIGTERM) and serving again in {time.time() - at:.1f} s", time.time()

    async def _postgres_restart(self) -> tuple[str, float]:
        at = time.time()
        await asyncio.to_thread(self.cluster.db.stop)
        await asyncio.to_thread(self.cluster.db.start, self.cluster.ports["postgres"])
        back = time.time() - at
        # The server rides it out; if it gave up, start_server brings it back (a no-op when it runs) and waits until it serves.
        await self.cluster.start_server()
        return (f"PostgreSQL stopped (fast) and started again in {back:.1f} s, the server serving "
                f"{time.time() - at:.1f} s after the stop"), time.time()

    async def _prometheus_down(self) -> tuple[str, float]:
        await asyncio.to_thread(self.prometheus.stop)
        await asyncio.sleep(PROMETHEUS_DOWN_S)
        await asyncio.to_thread(self.prometheus.start)
        return f"Prometheus stopped for {format_duration(PROMETHEUS_DOWN_S)}, then ready again", time.time()

    async def _dns_down(self) -> tuple[str, float]:
        await asyncio.to_thread(self.dns.stop)
        await asyncio.sleep(DNS_DOWN_S)
        await asyncio.to_thread(self.dns.start)
        return f"PowerDNS stopped for {format_duration(DNS_DOWN_S)}, then answering again", time.time()

    # ---- the histories ---------------------------------------------------------------------------
    async def traces(self) -> list[RunTrace]:
        gate = asyncio.Semaphore(8)

        async def one(outcome: Outcome) -> RunTrace:
            async with gate:
                history = await self.client.get_workflow_handle(outcome.workflow_id, run_id=outcome.run_id).fetch_history()
            # A held run stands still by design from its hold (waiting for an operator): only an unfinished
            # one counts as still until now.
            return trace_of(outcome, history.events, open_until=time.time() if outcome.state == "unfinished" else None)

        return list(await asyncio.gather(*(one(o) for o in self.outcomes)))


def trace_of(outcome: Outcome, events: Any, open_until: float | None) -> RunTrace:
    """A run's history reduced to its event times and its activities' (scheduled, closed) times: actions,
    and gate reads apart (a read waits for its sample, up to the gate's interval). core.wait is left out:
    its latency is the wait it was asked for."""
    trace = RunTrace(outcome.workflow_id, outcome.run_id, [], open_until=open_until)
    scheduled: dict[int, tuple[float, str]] = {}
    for event in events:
        at = event.event_time.ToNanoseconds() / 1e9
        trace.events.append(at)
        name = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[event.event_id] = at, event.activity_task_scheduled_event_attributes.activity_type.name
            name += f" {scheduled[event.event_id][1]}"
        trace.names.append(name)
        if event.event_type in _CLOSED:
            start, kind = scheduled.pop(getattr(event, _CLOSED[event.event_type]).scheduled_event_id, (None, ""))
            trace.names[-1] += f" {kind}"
            if start is None or kind == "core.wait":
                continue
            (trace.reads if kind.startswith("telemetry.read") else trace.activities).append((start, at))
    return trace


def _pcts(values: list[float]) -> str:
    if not values:
        return "no steps"
    return (f"p50 {percentile(values, 50) * 1000:7.0f} ms  p95 {percentile(values, 95) * 1000:7.0f} ms  "
            f"p99 {percentile(values, 99) * 1000:7.0f} ms  ({len(values)} steps)")


def report(soak: Soak, traces: list[RunTrace], journal: Path) -> bool:
    """Print the table; True when every goal holds."""
    outcomes = soak.outcomes
    states = Counter(o.state for o in outcomes)
    ended = sum(n for s, n in states.items() if s not in ("held", "unfinished"))
    check = check_journal(read_journal(journal))
    print(f"\nruns started {len(outcomes)}, ended {ended} ({', '.join(f'{s} {n}' for s, n in sorted(states.items()))})")
    for state in ("failed", "aborted", "rolled_back", "held", "unfinished"):
        for reason, n in Counter(o.reason for o in outcomes if o.state == state).most_common():
            print(f"  {state:11} x{n:<3} {reason[:300] or '(no reason given)'}")
    if soak.start_errors:
        print(f"starts refused (asked again a second later): {sum(soak.start_errors.values())}")
        for reason, n in soak.start_errors.most_common(5):
            print(f"  x{n:<3} {reason}")
    print(f"journal: {check.summary()}")
    for repeat in check.repeated:
        print(f"  ran twice: {repeat}")
        print(f"    {_repeat_cause(repeat, check.attempts, soak.faults, soak.began)}")
    quiet_end = soak.began + soak.baseline
    print("step latency (an activity scheduled to closed; core.wait left out):")
    for what, reads in (("actions", False), ("gate reads", True)):
        print(f"  {what:10} baseline, no faults ({format_duration(soak.baseline)}): "
              f"{_pcts(latencies_between(traces, soak.began, quiet_end, reads=reads))}")
        print(f"  {what:10} under faults:               {_pcts(latencies_between(traces, quiet_end, math.inf, reads=reads))}")
    print(f"  longest a run stood still in the baseline: {baseline_gap(traces, soak.began, quiet_end):.1f} s")
    controls = quiet_recoveries(traces, quiet_instants(soak.began, soak.baseline))
    control_worst = max((c.recovery_s for c in controls), default=math.nan)
    if controls:
        print(f"  control, no fault: the recovery figure read at {len(controls)} quiet instants of the baseline "
              f"(after its first minute, 10 s apart): median {percentile([c.recovery_s for c in controls], 50):.1f} s, "
              f"worst {control_worst:.1f} s, over {max(c.runs for c in controls)} runs at most")
    else:
        print("  control, no fault: none (a baseline of 90 s or more reads it)")
    goal = f"< {format_duration(RECOVERY_GOAL_S)}"
    print(f"{'fault at':>9}  {'fault':17} {'runs':>4}  {'stood still':>11}  {'recovery':>8}  {goal:>5}  what happened")
    stalls: list[Stall] = []
    for fault in soak.faults:
        stall = stall_around(traces, fault)
        stalls.append(stall)
        print(f"{fault.start - soak.began:8.1f}s  {fault.name:17} {stall.runs:4d}  {stall.still_s:10.1f}s  "
              f"{stall.recovery_s:7.1f}s  {'yes' if stall.recovery_s < RECOVERY_GOAL_S else 'NO':>5}  {fault.detail}")
    slow = [f"{f.name} at {f.start - soak.began:.0f} s" for f, s in zip(soak.faults, stalls, strict=True)
            if s.recovery_s >= RECOVERY_GOAL_S]
    verdict = soak_verdict(outcomes, len(check.repeated), slow)
    print(verdict.line())
    if slow and controls:
        beyond = [f"{f.name} at {f.start - soak.began:.0f} s" for f, s in zip(soak.faults, stalls, strict=True)
                  if s.recovery_s >= RECOVERY_GOAL_S and s.recovery_s > control_worst]
        print(f"  of the slow ones, longer than the control's worst ({control_worst:.1f} s, no fault at all): "
              + (", ".join(beyond) if beyond else "none"))
    for fault, stall in zip(soak.faults, stalls, strict=True):
        if stall.recovery_s < RECOVERY_GOAL_S:
            continue
        # What the slowest run waited on: the events either side of its longest stretch across the fault.
        gaps = [gap for trace in traces if trace.workflow_id == stall.recovery_run
                if (gap := trace.longest_gap(fault.start, fault.end))]
        if gaps:
            gap = max(gaps, key=lambda g: g[2] - g[0])
            before, before_name, after, after_name = gap
            print(f"  {fault.name} at {fault.start - soak.began:.0f} s: {stall.recovery_run} stood still "
                  f"{after - before:.1f} s, from {before_name} ({before - soak.began:.1f} s) to {after_name} "
                  f"({after - soak.began:.1f} s)")
    return verdict.met


FAILED_STATES = ("failed", "aborted", "rolled_back")


def soak_verdict(outcomes: list[Outcome], repeated: int, slow: list[str]) -> Verdict:
    """The soak's goals and failure counts. NOT met when any run failed (failed, aborted, rolled back), held,
    or was left unfinished, or any step ran twice: the bench approves every approval and the runbooks' gates
    pass on a healthy fleet, so a run fails or holds only because of a fault, which the goal says it rides out."""
    states = Counter(o.state for o in outcomes)
    goals = [Goal("runs succeeded", states["succeeded"] > 0, f"{states['succeeded']} of {len(outcomes)}"),
             Goal(f"recovery from each fault under {format_duration(RECOVERY_GOAL_S)}", not slow,
                  f"slow: {', '.join(slow)}" if slow else "")]
    failures = {"runs failed": sum(states[s] for s in FAILED_STATES), "held": states["held"],
                "unfinished": states["unfinished"], "steps run twice": repeated}
    return Verdict(goals, failures)


def _schedule(args: argparse.Namespace) -> list[tuple[float, str]]:
    """The fault schedule the command line asks for."""
    once: tuple[str, ...] = () if args.kills_only else ("temporal-restart", "postgres-restart", "prometheus-down", "dns-down")
    return fault_schedule(args.minutes * 60, args.baseline, kill_every=args.kill_every, once=once)


def _targets(count: int, prometheus: str, dns: dict[str, Any]) -> list[dict[str, Any]]:
    """Development targets whose telemetry is the bench's Prometheus and whose steered name is on its PowerDNS,
    where the workers' catalog reads them."""
    folder = use_development_targets()
    targets = []
    for i in range(count):
        inventory = {"name": f"soak-{i:03d}", "development": True, "telemetry": {"prometheus": prometheus}, "dns": dns}
        (folder / f"{inventory['name']}.yaml").write_text(yaml.safe_dump(inventory))
        targets.append(inventory)
    return targets


def _repeat_cause(repeat: Repeat, attempts: list[Attempt], faults: list[Fault], began: float) -> str:
    """Each attempt of a repeated step (worker, when it ended) and the fault closest after the first one ended:
    a worker SIGKILLed between an activity's end and the server receiving its completion is one cause."""
    mine = sorted((a for a in attempts if a.run_id == repeat.run_id and a.activity_id in repeat.activity_ids),
                  key=lambda a: (a.started_at or "", a.attempt))
    if not mine:
        return "(its attempts are not in the journal)"

    def at(stamp: str | None) -> float | None:
        return datetime.fromisoformat(stamp).timestamp() if stamp else None

    parts = [f"attempt {a.attempt} on {a.worker} ended {a.outcome or 'never'}"
             + (f" at {at(a.ended_at) - began:.2f}s" if a.ended_at else "") for a in mine]
    first_end = at(mine[0].ended_at)
    after = [f for f in faults if f.start >= first_end - 1.0] if first_end is not None else []
    if first_end is not None and after:
        fault = min(after, key=lambda f: f.start)
        parts.append(f"next fault {fault.name} at {fault.start - began:.2f}s ({fault.start - first_end:+.2f}s after "
                     f"the first attempt ended): {fault.detail}")
    return "; ".join(parts)


async def main(args: argparse.Namespace, work: Path) -> int:
    def say(message: str) -> None:
        print(message, flush=True)

    # SIGTERM as Ctrl-C: the finally blocks below and the cluster's exit stop everything this bench started.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)

    rate, share = reading_settings()
    say(f"soak: {args.targets} targets, {format_duration(args.minutes * 60)}, baseline "
        f"{format_duration(args.baseline)}, {WORKERS} workers (readings {rate:g} a second each, a share of "
        f"{share:g} while other runs' steps run: ${READINGS_SHARE_ENV}); load average {os.getloadavg()[0]:.2f}; state in {work}")
    prometheus = Prometheus(work / "prometheus")
    dns = PowerDns(work / "dns")
    # Development targets: the soak runs its own drain runbook (bench/soak-drain.yaml), not a catalogued one.
    workers = [WorkerProcess("", QUEUE, work / "actions.jsonl", work / f"worker-{i}.log", {}, allow_development=True)
               for i in range(WORKERS)]
    try:
        await asyncio.to_thread(prometheus.start)
        await asyncio.to_thread(dns.start)
        up = time.monotonic()
        async with Cluster(work / "cluster") as cluster:
            say(f"cluster up in {time.monotonic() - up:.1f} s at {cluster.address}")
            for worker in workers:
                worker.address = cluster.address
                await asyncio.to_thread(worker.start)
            soak = Soak(await cluster.client(), cluster, workers, prometheus, dns,
                        _targets(args.targets, prometheus.url, dns.steering()),
                        seconds=args.minutes * 60, baseline=args.baseline, drain=args.drain_seconds, say=say,
                        schedule=_schedule(args))
            try:
                await soak.run()
                traces = await soak.traces()
            finally:
                for worker in workers:
                    await asyncio.to_thread(worker.stop)
            ok = report(soak, traces, work / "actions.jsonl")
            print(f"load average at the end {os.getloadavg()[0]:.2f} (1 min), {os.getloadavg()[1]:.2f} (5 min)")
            return 0 if ok else 1
    finally:
        for worker in workers:  # a crash before the workers' own stop above
            await asyncio.to_thread(worker.stop)
        await asyncio.to_thread(prometheus.stop)
        await asyncio.to_thread(dns.stop)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--targets", type=int, default=10, help="fleet targets, each running one run at a time")
    parser.add_argument("--minutes", type=float, default=6, help="how long new runs are started")
    parser.add_argument("--baseline", type=float, default=60,
                        help="seconds with no faults at the start (90 or more also reads the control: the recovery "
                             "figure at quiet instants)")
    parser.add_argument("--drain-seconds", type=float, default=120, help="how long in-flight runs are waited for at the end")
    parser.add_argument("--kill-every", type=float, default=60, help="seconds between two worker SIGKILLs")
    parser.add_argument("--kills-only", action="store_true",
                        help="no server, PostgreSQL, Prometheus or DNS fault: only the worker SIGKILLs")
    parser.add_argument("--keep-dir", type=Path, help="state dir to keep (journal, logs, the cluster's database)")
    args = parser.parse_args()
    if args.targets < 1:
        parser.error("--targets must be at least 1")
    if args.kill_every <= 0:
        parser.error("--kill-every must be positive")
    try:
        _schedule(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.keep_dir:
        sys.exit(asyncio.run(main(args, args.keep_dir.resolve())))
    # The cluster's database is a few hundred MB after a soak: removed with the rest.
    with tempfile.TemporaryDirectory(prefix="coldstart-soak-") as tmp:
        sys.exit(asyncio.run(main(args, Path(tmp))))

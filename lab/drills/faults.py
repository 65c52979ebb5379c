"""Failure drills on the lab: faults survived with nothing lost and nothing done twice.

One lab, one Temporal dev server on a persistent SQLite database, and the real worker
(`worker.py --journal`) in a process of its own that a drill may SIGKILL. Each case runs
runbooks/fault-drill.yaml on the lab while one fault hits, then reports what the lab holds (DNS
steering read back from PowerDNS, flags in Consul), what the action journal says ran (repeats,
interrupted-and-retried attempts), what the run's status and timeline tell, and how long the run
took to move again once the fault ended. tests/lab/test_fault_drills.py asserts on the reports;
bench/faults.py prints them.

Every operator control is sent as `drill-bot`, the runbook's declared approver.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from activities.contracts.telemetry import READ_ACTIONS
from activities.journal import JournalCheck, check_journal, read_journal
from lab.drills.demo import DRILL_APPROVER
from lab.drills.harness import LabHarness

__all__ = ["ACTOR", "CASES", "FAULT_LAB", "CaseReport", "FaultDrills", "HistoryFact", "history_facts"]

REPO = Path(__file__).resolve().parents[2]
RUNBOOK = REPO / "runbooks" / "fault-drill.yaml"
ACTOR = DRILL_APPROVER  # the runbook's declared approver; every retry/pause/resume goes as it
# Apart from tests/lab (cst/10.214), the cold-start drill (csd/10.215) and a developer's lab (cs/10.213).
FAULT_LAB = {"prefix": "csf", "bridge": "csfbr0", "veth_prefix": "csfv", "subnet": "10.216.0.0/24"}
FLAG_PREFIX = "coldstart/drill/flags/"
FLAGS = [f"f{i:02d}" for i in range(40)]


def _utc(text: str | datetime | None) -> datetime | None:
    if text is None or isinstance(text, datetime):
        return text if text is None or text.tzinfo else text.replace(tzinfo=UTC)
    return datetime.fromisoformat(text)


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class CaseReport:
    name: str
    fault: str
    fault_end: str  # what ended the fault ("worker restarted", "server back", ...)
    state: str = "?"
    recovery_s: float | None = None  # fault end -> the run moving again
    moved_by: str = ""  # what showed it moving (the action completed or the gate that passed)
    dns_percent_end: float | None = None
    dns_percent_during: float | None = None  # read back while held (cases that hold)
    flags_ok: bool = False
    last_run_ok: bool = False
    journal: JournalCheck | None = None
    held_error: str | None = None  # the step's error while it was held
    status: Any = None  # the final RunStatus
    timeline: Any = None  # cli.timeline.Timeline
    history: list[HistoryFact] = field(default_factory=list)
    timeline_markdown: str = ""
    notes: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def repeats(self) -> list[Any]:
        return self.journal.repeated if self.journal else []


@dataclass
class HistoryFact:
    """What the run's history says beyond the timeline: retries and hand-overs between workers."""

    at: datetime
    # "activity retried" | "workflow task timed out" | "worker took over" | "workflow task superseded" |
    # "workflow task failed"
    kind: str
    detail: str
    who: str = ""  # the worker identity (pid@host), or "retry policy"


async def history_facts(client: Any, workflow_id: str, run_id: str | None = None) -> list[HistoryFact]:
    """Read a run's history for the things a fault leaves there: an activity's last attempt > 1 (its
    RetryPolicy ran it again, after a failure or a timeout of a vanished worker), workflow tasks that
    timed out, and the worker identity changing (another worker took the run over)."""
    from temporalio.api.enums.v1 import EventType as E
    from temporalio.api.enums.v1 import TimeoutType, WorkflowTaskFailedCause

    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    facts: list[HistoryFact] = []
    scheduled: dict[int, str] = {}
    worker: str | None = None
    for event in history.events:
        at = event.event_time.ToDatetime().replace(tzinfo=UTC)
        kind = event.event_type
        if kind == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_id
        elif kind == E.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            if attrs.attempt > 1:
                last = attrs.last_failure.message if attrs.HasField("last_failure") else ""
                facts.append(HistoryFact(at, "activity retried",
                                         f"{scheduled.get(attrs.scheduled_event_id, '?')} attempt {attrs.attempt} "
                                         f"on {attrs.identity}; previous attempt: {last}", "retry policy"))
        elif kind == E.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            identity = event.workflow_task_started_event_attributes.identity
            if worker is not None and identity and identity != worker:
                facts.append(HistoryFact(at, "worker took over", f"from {worker}", identity))
            worker = identity or worker
        elif kind == E.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            attrs = event.workflow_task_timed_out_event_attributes
            facts.append(HistoryFact(at, "workflow task timed out", TimeoutType.Name(attrs.timeout_type)))
        elif kind == E.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            attrs = event.workflow_task_failed_event_attributes
            # UnhandledCommand: new events (an activity's completion, a timer) reached the run while its task
            # ran, so the server asked for the task again with them. Temporal's own race, not a failed task.
            superseded = attrs.cause == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND
            facts.append(HistoryFact(at, "workflow task superseded" if superseded else "workflow task failed",
                                     attrs.failure.message[:240], attrs.identity))
    return facts


class FaultDrills(LabHarness):
    """The driver: `async with FaultDrills(root) as drills: report = await drills.run_case("...")`."""

    def __init__(self, root: Path, *, log: Callable[[str], None] | None = None):
        from lab.settings import LabConfig

        root = Path(root)
        # 100 player requests/s from 2,000 client subnets over 200 players: admitted cohorts warm the
        # cache quickly; 20 internal requests/s keep Consul busy without starving a 2-core machine.
        cfg = LabConfig(state_dir=root / "lab", inventory_path=root / "targets" / "lab.yaml",
                        players_rps=100, internal_rps=20, seed_players=200, **FAULT_LAB)
        super().__init__(root, cfg, f"coldstart-faults-{os.getpid()}", log=log)

    # ---- lab ----------------------------------------------------------------------------------

    async def inject(self, name: str, **options: Any) -> Any:
        from lab import faults

        self._log(f"inject {name} {options or ''}".rstrip())
        return await asyncio.to_thread(faults.inject, self.cfg, name, **options)

    async def dns_percent(self) -> float | None:
        """The steering percentage read back from PowerDNS (AXFR), the same on every server or None."""
        from activities.dns.axfr import read_state

        dns = self.inventory["dns"]
        zone = dns["zone"] if dns["zone"].endswith(".") else dns["zone"] + "."
        fqdn = dns["name"] if dns["name"].endswith(".") else f"{dns['name']}.{zone}"
        states = await asyncio.gather(*(read_state(s, zone, fqdn, 3.0) for s in dns["servers"]))
        percents = {s.percent for s in states}
        return percents.pop() if len(percents) == 1 else None

    async def kv(self, prefix: str) -> dict[str, str]:
        """Consul KV under a prefix, key -> value (read with the lab's token)."""
        import base64

        from lab.services import Secrets

        headers = {"X-Consul-Token": Secrets(self.cfg).read("consul-token")}
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.get(f"{self.cfg.consul_url}/v1/kv/{prefix}", params={"recurse": "true"}, headers=headers)
        if r.status_code == 404:
            return {}
        r.raise_for_status()
        return {e["Key"]: base64.b64decode(e["Value"]).decode() if e.get("Value") else "" for e in r.json()}

    async def prometheus(self, query: str) -> float | None:
        from activities.prometheus import PrometheusError, instant_query

        try:
            result = (await instant_query(self.inventory["telemetry"]["prometheus"], query, timeout=5)).get("result", [])
        except PrometheusError:
            return None
        return float(result[0]["value"][1]) if result else None

    # ---- runs ---------------------------------------------------------------------------------

    async def start(self, label: str, **params: Any) -> Any:
        from activities.catalog import load_registry
        from runtime.runs import start_run
        from workflows.loader import plan_run

        run = plan_run(RUNBOOK, registry=load_registry(), targets_dir=self.targets,
                       params={"label": label, "flags": FLAGS, **params}, initiator=ACTOR, drill=True)
        handle = await start_run(self.client, run, self.queue)
        self._log(f"{label}: run {handle.id} started")
        return handle

    async def reached_20(self, handle: Any) -> None:
        """Until the ramp has set 20 % and the server holds the set's completion: where every case strikes.

        The journal's end line is written before the worker reports the completion; a fault struck in
        between would lose a finished set and the server would run it again, a repeat no case is about.
        """
        await self.wait_for("players@20 set", lambda: self.journal_has(handle, "players@20#"))

        async def recorded() -> bool:
            return any(a.startswith("players@20#") for a in await self.completed_in_history(handle))

        await self.wait_for("players@20 set recorded by the server", recorded)

    async def pause_at_20(self, handle: Any, reason: str) -> None:
        """Pause, and wait until the ramp stops at its boundary after 20 %, so a fault lands before 40 %."""
        await self.control(handle, "pause", reason=reason)

        async def paused() -> bool:
            current = await self.status(handle)
            players = next((s for s in current.steps if s.id == "players"), None)  # none before resolution
            return current.state == "paused" and players is not None and players.last_good == 20

        # The ramp pauses once the 20 % gates pass: up to three gate timeouts on a loaded machine, so the
        # wait is longer than they are; a gate that gives up holds the step, and this wait fails.
        await self.wait_for("paused", paused, timeout=180)

    async def status(self, handle: Any) -> Any:
        from workflows.contract import RunStatus

        return await handle.query("status", result_type=RunStatus)

    def entries(self, handle: Any) -> list[dict[str, Any]]:
        """This run's journal lines (the journal is shared by every run of the suite)."""
        run_id = handle.result_run_id or handle.run_id
        return [e for e in read_journal(self.journal) if e.get("workflow_id") == handle.id and e.get("run_id") == run_id]

    async def completed_in_history(self, handle: Any) -> set[str]:
        """The activity ids whose completion the server has recorded in this run's history."""
        from temporalio.api.enums.v1 import EventType as E

        scheduled: dict[int, str] = {}
        completed: set[str] = set()
        async for event in handle.fetch_history_events():
            if event.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_id
            elif event.event_type == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                completed.add(scheduled.get(event.activity_task_completed_event_attributes.scheduled_event_id, ""))
        return completed

    def journal_has(self, handle: Any, prefix: str, *, event: str = "ended", outcome: str | None = "ok") -> bool:
        return any(e["activity_id"].startswith(prefix) and e.get("event") == event
                   and (outcome is None or e.get("outcome") == outcome) for e in self.entries(handle))

    async def wait_step(self, handle: Any, step: str, status: str, timeout: float = 120.0) -> Any:
        async def check() -> Any:
            current = await self.status(handle)
            state = next((s for s in current.steps if s.id == step), None)  # none before resolution
            return state if state is not None and state.status == status else None

        return await self.wait_for(f"{step} {status}", check, timeout)

    async def control(self, handle: Any, verb: str, step: str | None = None, reason: str = "") -> str:
        from workflows.contract import ControlRequest

        self._log(f"{verb} {step or ''} as {ACTOR}: {reason}")
        return await handle.execute_update(verb, ControlRequest(actor=ACTOR, step=step, reason=reason))

    async def finish(self, handle: Any, report: CaseReport, since: datetime | None, started: float,
                     timeout: float = 180.0, reads: bool = False) -> CaseReport:
        """Wait for the run to end, then read back the lab, the journal, the status and the timeline."""
        from cli.timeline import build_timeline, render_markdown

        async def done() -> Any:
            current = await self.status(handle)
            return current if current.over else None

        report.status = await self.wait_for(f"{report.name}: run to end", done, timeout, every=0.25)
        report.state = report.status.state
        report.dns_percent_end = await self.dns_percent()
        flags = await self.kv(FLAG_PREFIX)
        report.flags_ok = all(flags.get(FLAG_PREFIX + f) == report.name for f in FLAGS)
        report.last_run_ok = (await self.kv("coldstart/drill/last-run")).get("coldstart/drill/last-run") == report.name
        report.journal = check_journal(self.entries(handle))
        report.timeline = await build_timeline(self.client, handle.id)
        report.timeline_markdown = render_markdown(report.timeline)
        report.history = await history_facts(self.client, handle.id, handle.result_run_id)
        if since is not None:
            report.recovery_s, report.moved_by = self.moved_after(handle, report.status, since, reads=reads)
        report.wall_s = time.monotonic() - started
        self._log(f"{report.name}: {report.state} in {report.wall_s:.1f} s; recovery {report.recovery_s} s "
                  f"({report.moved_by}); journal: {report.journal.summary()}")
        for fact in report.history:
            self._log(f"  history: {fact.at:%H:%M:%S.%f} {fact.kind} {fact.who} {fact.detail}")
        return report

    def moved_after(self, handle: Any, status: Any, since: datetime, *, reads: bool = False) -> tuple[float | None, str]:
        """Seconds from `since` to the first action completed ok or gate reading passed after it
        (reads=True: any gate reading taken counts too: the run is executing again)."""
        moves: list[tuple[datetime, str]] = []
        for e in self.entries(handle):
            if (e.get("event") == "ended" and e.get("outcome") == "ok"
                    and (reads or e.get("activity_type") not in READ_ACTIONS)):
                at = _utc(e["ended_at"])
                if at and at > since:
                    moves.append((at, f"{e['activity_id']} completed"))
        for step in status.steps:
            for reading in step.readings:
                at = _utc(reading.at)
                if reading.passed and at and at > since:
                    moves.append((at, f"{step.id} gate {reading.gate} passed at {reading.percent}%"))
        if not moves:
            return None, "nothing moved"
        at, what = min(moves)
        return round((at - since).total_seconds(), 2), what

    # ---- cases --------------------------------------------------------------------------------

    async def run_case(self, name: str) -> CaseReport:
        return await CASES[name](self)


# Each case: (a) the end state read back from the lab, (b) the journal, (c) status/timeline, and the
# time from the fault's end to the run moving again.


async def worker_killed_mid_ramp(d: FaultDrills) -> CaseReport:
    report = CaseReport("worker-killed-mid-ramp", "worker SIGKILLed while the ramp bakes at 20 %",
                        "new worker started")
    started = time.monotonic()
    handle = await d.start(report.name)
    await d.reached_20(handle)
    return await _kill_and_replace_worker(d, handle, report, started, "SIGKILLed")


async def worker_killed_mid_fan_out(d: FaultDrills) -> CaseReport:
    report = CaseReport("worker-killed-mid-fan-out", "worker SIGKILLed with KV writes of the fan-out in flight",
                        "new worker started")
    started = time.monotonic()
    handle = await d.start(report.name)

    def flags() -> tuple[set[str], int]:
        entries = [e for e in d.entries(handle) if e["activity_id"].startswith("flags[")]
        ended = {(e["activity_id"], e["attempt"]) for e in entries if e["event"] == "ended"}
        started_only = [e for e in entries if e["event"] == "started" and (e["activity_id"], e["attempt"]) not in ended]
        return {e["activity_id"] for e in entries if e["event"] == "ended" and e.get("outcome") == "ok"}, len(started_only)

    await d.wait_for("6 flag writes done", lambda: len(flags()[0]) >= 6, every=0.01)
    assert d.worker is not None
    # A KV write takes milliseconds: freeze the worker (SIGSTOP), and kill it only if the journal shows
    # writes started and not ended, and every write it shows ended has reached the server. A worker writes an
    # action's end line before it reports the completion: one frozen in between would lose a finished write's
    # completion, and the server would run that write again (a repeat, not the interrupted write this case is).
    for _ in range(500):
        d.worker.signal(signal.SIGSTOP)
        done, in_flight = flags()
        if len(done) == len(FLAGS) or (in_flight and done <= await d.completed_in_history(handle)):
            break
        d.worker.signal(signal.SIGCONT)
        await asyncio.sleep(0.003)
    report.notes["in_flight_at_kill"] = in_flight
    return await _kill_and_replace_worker(d, handle, report, started, "SIGKILLed mid fan-out")


async def _kill_and_replace_worker(d: FaultDrills, handle: Any, report: CaseReport, started: float,
                                   what: str) -> CaseReport:
    assert d.worker is not None
    report.notes["killed_pid"] = d.worker.kill()
    d._log(f"worker {report.notes['killed_pid']} {what}")
    await asyncio.sleep(1.0)
    await asyncio.to_thread(d.worker.start)
    since = _now()
    report.notes["new_pid"] = d.worker.pid
    return await d.finish(handle, report, since, started, reads=True)


async def temporal_restarted(d: FaultDrills) -> CaseReport:
    report = CaseReport("temporal-server-restarted", "Temporal server stopped mid-ramp, restarted on its database",
                        "server back")
    started = time.monotonic()
    handle = await d.start(report.name)
    await d.reached_20(handle)
    stopping = time.monotonic()
    await asyncio.to_thread(d.server.stop)
    report.notes["down_at"] = _now()  # the process is gone: nothing can be recorded from here
    report.notes["stop_s"] = round(time.monotonic() - stopping, 2)
    d._log("temporal server stopped")
    await asyncio.sleep(3.0)
    await asyncio.to_thread(d.server.start)
    since = _now()
    report.notes["up_at"] = since
    d._log("temporal server back")
    return await d.finish(handle, report, since, started, reads=True)


async def prometheus_down(d: FaultDrills) -> CaseReport:
    report = CaseReport("prometheus-down-during-gate", "Prometheus stopped while the 20 % gates read",
                        "Prometheus back")
    started = time.monotonic()
    handle = await d.start(report.name)
    await d.reached_20(handle)
    down_at = _now()
    await d.inject("service-down", target="prometheus")

    async def errors() -> int:
        current = await d.status(handle)
        players = next((s for s in current.steps if s.id == "players"), None)  # none before resolution
        return players is not None and sum(1 for r in players.readings if r.error and _utc(r.at) > down_at) >= 3

    await d.wait_for("3 failed readings", errors, timeout=60)
    await d.inject("service-up", target="prometheus")
    since = _now()
    report.notes["down_at"] = down_at
    report.notes["up_at"] = since
    return await d.finish(handle, report, since, started)


async def _held(d: FaultDrills, handle: Any, report: CaseReport, step: str = "players") -> None:
    state = await d.wait_step(handle, step, "held", timeout=120)
    report.held_error = state.error
    d._log(f"{step} held: {state.error}")


async def vault_down(d: FaultDrills) -> CaseReport:
    report = CaseReport("vault-down-when-a-step-needs-a-token",
                        "Vault refusing connections when the 40 % set needs the TSIG key", "Vault back")
    started = time.monotonic()
    handle = await d.start(report.name)
    # The 20 % set read its key; the gates read Prometheus only. The 40 % set needs Vault again.
    await d.reached_20(handle)
    await d.inject("service-down", target="vault")
    await _held(d, handle, report)
    report.dns_percent_during = await d.dns_percent()
    await d.inject("service-up", target="vault")
    since = _now()
    await d.control(handle, "retry", "players", "Vault is back")
    report.notes["up_at"] = since
    return await d.finish(handle, report, since, started)


async def powerdns_down(d: FaultDrills) -> CaseReport:
    report = CaseReport("powerdns-down-during-ramp-step", "PowerDNS stopped before the 40 % set",
                        "PowerDNS back")
    started = time.monotonic()
    handle = await d.start(report.name)
    # Pause at 20 %: the ramp stops at its next percentage boundary, so the fault lands exactly there.
    await d.reached_20(handle)
    await d.pause_at_20(handle, "inject PowerDNS down before the next ramp step")
    await d.inject("service-down", target="dns")
    await d.control(handle, "resume", reason="PowerDNS is down")
    await _held(d, handle, report)
    await d.inject("service-up", target="dns")
    since = _now()
    report.dns_percent_during = await d.dns_percent()  # read back before the retry: unchanged
    await d.control(handle, "retry", "players", "PowerDNS is back")
    return await d.finish(handle, report, since, started)


async def gate_fails_mid_ramp(d: FaultDrills) -> CaseReport:
    report = CaseReport("gate-fails-mid-ramp", "players lose DNS at the 40 % step (admitted-on-target fails)",
                        "fault cleared")
    started = time.monotonic()
    # 30 s: long enough for a healthy step (a players' sweep, a scrape, a rule evaluation, the 6 s
    # offset), short enough that the failing gate gives up quickly.
    handle = await d.start(report.name, gate_timeout="30s")
    await d.reached_20(handle)
    await d.pause_at_20(handle, "inject players-dns-lost before the 40 % step")
    await d.inject("players-dns-lost")
    await d.control(handle, "resume", reason="players have lost DNS")
    await _held(d, handle, report)
    report.dns_percent_during = await d.dns_percent()
    await d.inject("clear")
    since = _now()
    # The operator retries once the players are back at the held percentage (as a dashboard shows).
    query = "coldstart:players_admitted_error_points and on() (max(coldstart_players_target_percent offset 6s) == 20)"

    async def recovered() -> bool:
        value = await d.prometheus(query)
        return value is not None and value < 5

    await d.wait_for("players back at 20 %", recovered, timeout=90, every=0.5)
    report.notes["operator_wait_s"] = round((_now() - since).total_seconds(), 2)
    await d.control(handle, "retry", "players", "players resolve again")
    return await d.finish(handle, report, since, started)


CASES: dict[str, Callable[[FaultDrills], Awaitable[CaseReport]]] = {
    "worker-killed-mid-ramp": worker_killed_mid_ramp,
    "worker-killed-mid-fan-out": worker_killed_mid_fan_out,
    "temporal-server-restarted": temporal_restarted,
    "prometheus-down-during-gate": prometheus_down,
    "vault-down-when-a-step-needs-a-token": vault_down,
    "powerdns-down-during-ramp-step": powerdns_down,
    "gate-fails-mid-ramp": gate_fails_mid_ramp,
}

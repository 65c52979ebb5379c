"""A run's timeline, read from its Temporal history: every step, actor, approval, gate reading and duration."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from activities.contracts.telemetry import READ_ACTION, READ_ACTIONS
from activities.retry import format_duration
from workflows.contract import MEMO_RUN, MEMO_STEP, MEMO_STEPS, RESOLVE_RUN_ACTIVITY
from workflows.history_tags import VIEW_TIMER_SUMMARY, ActivityTag, activity_tag, is_approval_note, timer_step

__all__ = ["Entry", "StepRow", "StepSummary", "Timeline", "Totals", "Wait", "build_timeline", "render_markdown"]

_E = EventType


def _verified_subject(result: Any, update_id: str, controls: dict[str, str]) -> str | None:
    """The verified subject of an accepted update, from structured fields only: the approval record it
    returned, or the run's control record that names the update (never from text an actor typed)."""
    if isinstance(result, dict):
        return result.get("subject")
    return controls.get(update_id)


@dataclass
class Entry:
    at: datetime
    step: str | None
    event: str
    actor: str | None = None
    detail: str = ""
    duration_s: float | None = None
    outcome: str | None = None


@dataclass
class Wait:
    """A time a step spent waiting, not working: for an approval, held for an operator, or on a timer (a wait
    step, a bake, a retry's delay); who or what ended it, and how."""

    kind: str  # approval, hold, timer
    started: datetime
    ended: datetime | None = None
    ended_by: str | None = None
    how: str | None = None  # approved, retry, skip, abort, fired, canceled, run ended
    detail: str = ""

    @property
    def duration_s(self) -> float:
        return (self.ended - self.started).total_seconds() if self.ended else 0.0

    def said(self) -> str:
        who = f"{self.how or 'open'}" + (f" by {self.ended_by}" if self.ended_by else "")
        return f"{self.kind} {format_duration(round(self.duration_s, 2))} ({who})"


@dataclass
class StepSummary:
    step: str
    started: datetime
    ended: datetime
    activities: int = 0
    readings: int = 0
    failed_readings: int = 0
    approvals: list[str] = field(default_factory=list)
    kind: str = ""
    status: str = ""
    waits: list[Wait] = field(default_factory=list)
    undos: int = 0

    @property
    def duration_s(self) -> float:
        return (self.ended - self.started).total_seconds()

    @property
    def waiting_s(self) -> float:
        """The step's waits within its own span (a wait still open counts to the step's end)."""
        total = 0.0
        for wait in self.waits:
            end = min(wait.ended or self.ended, self.ended)
            total += max(0.0, (end - max(wait.started, self.started)).total_seconds())
        return min(total, self.duration_s)

    @property
    def working_s(self) -> float:
        return self.duration_s - self.waiting_s


@dataclass
class StepRow:
    """A step in the step table: nested (a parallel step's child, inside its parent's span) or not, and the
    time between it and the top-level step before it."""

    summary: StepSummary
    nested: bool
    gap_before_s: float


@dataclass
class Totals:
    """The run's wall time (first event to close) as the top-level steps' durations plus the time between them."""

    steps_s: float
    between_s: float
    wall_s: float


@dataclass
class Timeline:
    workflow_id: str
    run_ids: list[str]
    runbook: str = ""
    target: str = ""
    initiator: str = ""
    # The runbook version the controller resolved the run to, and where it found it (catalog, development).
    runbook_digest: str = ""
    runbook_origin: str = ""
    controller: str = ""
    contracts: str = ""
    # The runbook's recovery objectives as resolved (workflows/spec.Objectives, JSON), for its scorecard.
    objectives: dict[str, Any] | None = None
    started: datetime | None = None
    ended: datetime | None = None
    outcome: str = "running"
    entries: list[Entry] = field(default_factory=list)
    steps: dict[str, StepSummary] = field(default_factory=dict)

    def wall_end(self) -> datetime | None:
        """The close event's time; for a run still going, its last event's."""
        return self.ended or max((e.at for e in self.entries), default=self.started)

    def rows(self) -> list[StepRow]:
        """Every step that ran, in order of start; a step inside another's span (a parallel's child) is nested."""
        rows: list[StepRow] = []
        cursor = self.started
        top: StepSummary | None = None
        for summary in sorted(self.steps.values(), key=lambda s: (s.started, -s.ended.timestamp())):
            if top is not None and summary.started >= top.started and summary.ended <= top.ended:
                rows.append(StepRow(summary, True, 0.0))
                continue
            gap = max(0.0, (summary.started - cursor).total_seconds()) if cursor else 0.0
            rows.append(StepRow(summary, False, gap))
            top = summary
            cursor = max(cursor, summary.ended) if cursor else summary.ended
        return rows

    def totals(self) -> Totals:
        start, end = self.started, self.wall_end()
        wall = (end - start).total_seconds() if start and end else 0.0
        top = [r for r in self.rows() if not r.nested]
        steps = sum(r.summary.duration_s for r in top)
        last = max((r.summary.ended for r in top), default=start)
        after = max(0.0, (end - last).total_seconds()) if end and last else 0.0
        return Totals(steps_s=steps, between_s=sum(r.gap_before_s for r in top) + after, wall_s=wall)

    def to_json(self) -> dict[str, Any]:
        def plain(value: Any) -> Any:
            if isinstance(value, datetime):
                return value.isoformat()
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            if isinstance(value, list):
                return [plain(v) for v in value]
            return value

        return plain(
            {
                "workflow_id": self.workflow_id,
                "run_ids": self.run_ids,
                "runbook": self.runbook,
                "target": self.target,
                "initiator": self.initiator,
                "runbook_digest": self.runbook_digest,
                "controller": self.controller,
                "contracts": self.contracts,
                "started": self.started,
                "ended": self.ended,
                "outcome": self.outcome,
                "steps": [asdict(r.summary) | {"duration_s": r.summary.duration_s, "waiting_s": r.summary.waiting_s,
                                                "working_s": r.summary.working_s, "nested": r.nested,
                                                "gap_before_s": r.gap_before_s}
                          for r in self.rows()],
                "totals": asdict(self.totals()),
                "entries": [asdict(e) for e in self.entries],
            }
        )


def _time(event: Any) -> datetime:
    return event.event_time.ToDatetime().replace(tzinfo=None)


async def _verified_controls(client: Client, workflow_id: str, run_id: str | None) -> dict[str, str]:
    """update id -> verified subject, from the control records the run keeps (latest run of the id only)."""
    from runtime.polling import read_kept_status

    handle = client.get_workflow_handle(workflow_id)
    try:
        if run_id is not None and (await handle.describe()).run_id != run_id:
            return {}
        status = await read_kept_status(handle)
    except Exception:  # noqa: BLE001 - a run that keeps no status shows its decisions unverified, never wrongly verified
        return {}
    return {c.update_id: c.subject for c in status.controls if c.update_id and c.subject}


def _adopt_resolution(timeline: Timeline, plan: Any) -> None:
    """The header from what the controller resolved, not from what the starter sent."""
    if not isinstance(plan, dict):
        return
    runbook = plan.get("runbook") or {}
    timeline.runbook = runbook.get("metadata", {}).get("name", timeline.runbook)
    timeline.objectives = runbook.get("objectives") or timeline.objectives
    timeline.target = plan.get("target_name", timeline.target)
    timeline.initiator = plan.get("initiator", timeline.initiator)
    catalog = plan.get("catalog") or {}
    timeline.runbook_digest, timeline.runbook_origin = catalog.get("digest", ""), catalog.get("origin", "")
    timeline.controller, timeline.contracts = catalog.get("controller", ""), catalog.get("contracts", "")


def _resolution(request: Any, result: Any) -> str:
    """Which runbook version the controller resolved the run to, from where; or why it refused."""
    asked = request if isinstance(request, dict) else {}
    said = f"{asked.get('runbook', '?')} {asked.get('digest', '?')} on {asked.get('target', '?')}"
    catalog = result.get("catalog") if isinstance(result, dict) else None
    if isinstance(catalog, dict):
        return f"{said} from the {catalog.get('origin')} ({catalog.get('path')})"
    return f"{said}: {_short(result, 240)}"


def _short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def _decode(client: Client, payloads: Any) -> list[Any]:
    if not payloads or not payloads.payloads:
        return []
    return await client.data_converter.decode(payloads.payloads)


async def build_timeline(client: Client, workflow_id: str, run_id: str | None = None) -> Timeline:
    """Walk the history of a run (following continue-as-new) and turn it into timeline entries."""
    timeline = Timeline(workflow_id=workflow_id, run_ids=[])
    next_run: str | None = run_id
    if next_run is None:
        # Start from the first run of the most recent chain.
        description = await client.get_workflow_handle(workflow_id).describe()
        next_run = description.run_id
        chain = [next_run]
        first_history = await client.get_workflow_handle(workflow_id, run_id=next_run).fetch_history()
        started = first_history.events[0].workflow_execution_started_event_attributes
        while started.continued_execution_run_id:
            prior = started.continued_execution_run_id
            chain.insert(0, prior)
            history = await client.get_workflow_handle(workflow_id, run_id=prior).fetch_history()
            started = history.events[0].workflow_execution_started_event_attributes
        next_run = chain[0]
    scheduled: dict[int, tuple[ActivityTag | None, str, datetime, Any]] = {}
    updates: dict[str, Entry] = {}
    waits = _Waits(timeline)
    timers: dict[int, tuple[Entry, Wait | None]] = {}
    controls = await _verified_controls(client, workflow_id, run_id)
    while next_run:
        timeline.run_ids.append(next_run)
        history = await client.get_workflow_handle(workflow_id, run_id=next_run).fetch_history()
        next_run = None
        for event in history.events:
            kind = event.event_type
            at = _time(event)
            if kind == _E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                if timeline.started is None:
                    timeline.started = at
                    attrs = event.workflow_execution_started_event_attributes
                    args = await _decode(client, attrs.input)
                    if args and isinstance(args[0], dict):
                        # A run starts from its request (the names its starter gave; the resolved plan is the
                        # resolve activity's result) or, continued, from its sealed plan.
                        start = args[0]
                        request, plan = start.get("request") or {}, (start.get("sealed") or {}).get("plan") or {}
                        timeline.runbook = request.get("runbook") or plan.get("runbook", {}).get("metadata", {}).get("name", "")
                        timeline.target = request.get("target") or plan.get("target_name", "")
                        timeline.initiator = request.get("initiator") or plan.get("initiator", "")
                    timeline.entries.append(Entry(at, None, "run started", timeline.initiator, f"{timeline.runbook} on {timeline.target}"))
            elif kind == _E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                attrs = event.activity_task_scheduled_event_attributes
                args = await _decode(client, attrs.input)
                scheduled[event.event_id] = (activity_tag(attrs.header), attrs.activity_type.name, at, args[0] if args else None)
            elif kind in (
                _E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
                _E.EVENT_TYPE_ACTIVITY_TASK_FAILED,
                _E.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
            ):
                if kind == _E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                    attrs = event.activity_task_completed_event_attributes
                    result = await _decode(client, attrs.result)
                    outcome, value = "completed", result[0] if result else None
                elif kind == _E.EVENT_TYPE_ACTIVITY_TASK_FAILED:
                    attrs = event.activity_task_failed_event_attributes
                    outcome, value = "failed", attrs.failure.message
                else:
                    attrs = event.activity_task_timed_out_event_attributes
                    outcome, value = "timed out", attrs.failure.message
                tag, activity_type, started_at, args = scheduled.pop(attrs.scheduled_event_id, (None, "?", at, None))
                step = tag.step if tag else None
                duration = (at - started_at).total_seconds()
                if activity_type in READ_ACTIONS:
                    for step, gate, query, reading, error in _gate_readings(activity_type, tag, args, value):
                        detail = f"{gate}: {query} = {reading if error is None else 'no value (' + str(error) + ')'}"
                        timeline.entries.append(Entry(at, step, "gate reading", None, _short(detail, 240), duration,
                                                      "value" if error is None else "error"))
                        _touch(timeline, step, started_at, at, reading=error is None and reading is not None)
                elif activity_type == RESOLVE_RUN_ACTIVITY:
                    _adopt_resolution(timeline, value if outcome == "completed" else None)
                    timeline.entries.append(Entry(at, None, "runbook resolved" if outcome == "completed" else
                                                  f"runbook refused ({outcome})", None, _resolution(args, value),
                                                  duration, outcome))
                else:
                    label = ("undo" if tag and tag.role == "undo" else
                             "step-back" if tag and tag.role == "ramp" and tag.after == "gate-failed" else "action")
                    detail = f"{activity_type} {_short(args or {}, 120)} -> {_short(value, 120)}"
                    if label == "step-back" and tag and tag.percent is not None:
                        detail = f"to {tag.percent}% after a failed gate: {detail}"
                    timeline.entries.append(Entry(at, step, f"{label} {outcome}", None, detail, duration, outcome))
                    if label == "undo":
                        # A rollback runs after its step ended: it is the run's time, not the step's.
                        if step in timeline.steps:
                            timeline.steps[step].undos += 1
                    else:
                        _touch(timeline, step, started_at, at, activity=True)
            elif kind == _E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
                attrs = event.workflow_execution_update_accepted_event_attributes
                request = attrs.accepted_request
                args = await _decode(client, request.input.args)
                body = args[0] if args and isinstance(args[0], dict) else {}
                name = request.input.name
                actor = body.get("approver") or body.get("actor")
                step = body.get("step")
                text = body.get("comment") or body.get("reason") or ""
                entry = Entry(at, step, f"{name} (update)", actor, text)
                timeline.entries.append(entry)
                updates[request.meta.update_id] = entry
                if name == "approve" and step:
                    _touch(timeline, step, at, at)
                    timeline.steps[step].approvals.append(f"{actor} at {at:%H:%M:%S}" + (f": {text}" if text else ""))
            elif kind == _E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED:
                attrs = event.workflow_execution_update_completed_event_attributes
                entry = updates.get(attrs.meta.update_id)
                if entry is not None and attrs.outcome.HasField("success"):
                    result = await _decode(client, attrs.outcome.success)
                    subject = _verified_subject(result[0] if result else None, attrs.meta.update_id, controls)
                    if subject:
                        entry.actor = f"{entry.actor} (verified {subject})"
                        summary = timeline.steps.get(entry.step or "")
                        if entry.event == "approve (update)" and summary and summary.approvals:
                            summary.approvals[-1] += f" (verified {subject})"
            elif kind == _E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                attrs = event.workflow_execution_signaled_event_attributes
                args = await _decode(client, attrs.input)
                body = args[0] if args and isinstance(args[0], dict) else {}
                timeline.entries.append(
                    Entry(at, body.get("step"), f"{attrs.signal_name} (signal)", body.get("approver") or body.get("actor"),
                          body.get("comment") or body.get("reason") or "")
                )
            elif kind == _E.EVENT_TYPE_TIMER_STARTED:
                attrs = event.timer_started_event_attributes
                summary = await _decode(client, _Wrap(event.user_metadata.summary)) if event.HasField("user_metadata") else []
                seconds = attrs.start_to_fire_timeout.ToTimedelta().total_seconds()
                text = summary[0] if summary else "timer"
                step = timer_step(str(text)) if summary else None
                # A gate's next reading, the lines showing how to approve and the live view's pacing are no waits.
                if "next reading" not in str(text) and not is_approval_note(str(text)) and text != VIEW_TIMER_SUMMARY:
                    entry = Entry(at, step, "wait", None, f"{text} (timer {format_duration(seconds)})")
                    timeline.entries.append(entry)
                    wait = None
                    if step is not None and _waiting_timer(str(text)):
                        wait = Wait("timer", at, detail=str(text).partition(": ")[2])
                        _touch(timeline, step, at, at)
                        timeline.steps[step].waits.append(wait)
                    timers[event.event_id] = (entry, wait)
            elif kind in (_E.EVENT_TYPE_TIMER_FIRED, _E.EVENT_TYPE_TIMER_CANCELED):
                fired = kind == _E.EVENT_TYPE_TIMER_FIRED
                attrs = event.timer_fired_event_attributes if fired else event.timer_canceled_event_attributes
                entry, wait = timers.pop(attrs.started_event_id, (None, None))
                if entry is not None:
                    entry.duration_s = (at - entry.at).total_seconds()
                    entry.outcome = "fired" if fired else "canceled"
                    entry.detail += f", {entry.outcome}"
                if wait is not None and wait.ended is None:
                    wait.ended, wait.how = at, "fired" if fired else "canceled"
                    if entry is not None and entry.step:
                        _touch(timeline, entry.step, at, at)
            elif kind == _E.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED:
                fields = event.workflow_properties_modified_event_attributes.upserted_memo.fields
                keys = list(fields)
                memo = dict(zip(keys, await client.data_converter.decode([fields[k] for k in keys]), strict=True))
                waits.upserted(at, memo)
            elif kind == _E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
                pass
            elif kind == _E.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                next_run = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
                timeline.entries.append(Entry(at, None, "continued as new", None, next_run))
            elif kind == _E.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
                waits.closed(at)
                timeline.ended, timeline.outcome = at, "succeeded"
            elif kind == _E.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
                failure = event.workflow_execution_failed_event_attributes.failure
                waits.closed(at)
                timeline.ended = at
                timeline.outcome = failure.application_failure_info.type.removeprefix("Runbook").lower() or "failed"
                timeline.entries.append(Entry(at, None, "run ended", None, _short(failure.message, 400), outcome=timeline.outcome))
            elif kind in (_E.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED, _E.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
                          _E.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT):
                waits.closed(at)
                timeline.ended, timeline.outcome = at, EventType.Name(kind).removeprefix("EVENT_TYPE_WORKFLOW_EXECUTION_").lower()
    if timeline.ended:
        timeline.entries.append(Entry(timeline.ended, None, "run finished", None, timeline.outcome,
                                      (timeline.ended - timeline.started).total_seconds() if timeline.started else None))
    timeline.entries.sort(key=lambda e: e.at)
    return timeline


# A timer that is a step waiting (a wait step, a ramp's bake, a retry's delay), not a gate's next reading
# or a deadline running beside the step.
_WAITING_TIMERS = ("wait ", "bake at ", "retry in ")


def _waiting_timer(summary: str) -> bool:
    return summary.partition(": ")[2].startswith(_WAITING_TIMERS)


def _when(value: Any) -> datetime | None:
    """A time the workflow recorded (ISO 8601 in its memo), naive UTC like the history's."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


_ENDED = ("succeeded", "skipped", "failed", "aborted", "rolled_back")


class _Waits:
    """The run's status as its memo upserts tell it (workflows/contract.status_memo): when each step started and
    ended, when it began and stopped waiting for an approval or an operator, who approved, who decided a hold."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self.status: dict[str, str] = {}
        self.approvals: dict[str, int] = {}
        self.decisions: dict[str, int] = {}  # an adaptive ramp's decisions already listed, per step
        self.chunked: dict[str, dict[str, Any]] = {}  # each step's entry as a chunk last sent it
        self.controls: set[tuple[Any, ...]] = set()
        self.open: dict[tuple[str, str], Wait] = {}
        self.paused: tuple[datetime, str] | None = None

    def _summary(self, step: str, at: datetime) -> StepSummary:
        summary = self.timeline.steps.get(step)
        if summary is None:
            summary = self.timeline.steps[step] = StepSummary(step=step, started=at, ended=at)
        return summary

    def _close(self, step: str, kind: str, at: datetime, how: str | None = None, by: str | None = None,
               seen: datetime | None = None) -> None:
        """End a wait at `at` (the workflow's time of the decision); its event is listed at `seen`, the history's
        time of the upsert that told it (after the Update or Signal that carried the decision)."""
        wait = self.open.pop((step, kind), None)
        if wait is None:
            return
        wait.ended, wait.how, wait.ended_by = at, how or wait.how, by or wait.ended_by
        said = f"{wait.how or 'ended'}" + (" after the hold" if kind == "hold" else "")
        self.timeline.entries.append(Entry(max(at, seen or at), step, f"{'approval wait' if kind == 'approval' else 'hold'} ended",
                                           wait.ended_by, said, wait.duration_s, wait.how))

    def upserted(self, at: datetime, memo: dict[str, Any]) -> None:
        run = memo.get(MEMO_RUN)
        if isinstance(run, dict):
            self._controls(at, run.get("controls") or [])
        for key, entry in memo.items():
            if key.startswith(MEMO_STEP) and isinstance(entry, dict):
                self._step(at, key.removeprefix(MEMO_STEP), entry)
            elif key.startswith(MEMO_STEPS) and isinstance(entry, list):
                # Steps not in play, a chunk of them: a step sent again unchanged beside a changed one is
                # not news (a step's end is the upsert's time when its entry does not say it).
                for slot in entry:
                    if isinstance(slot, dict) and isinstance(slot.get("id"), str) and self.chunked.get(slot["id"]) != slot:
                        self.chunked[slot["id"]] = slot
                        self._step(at, slot["id"], slot)

    def _step(self, at: datetime, step: str, entry: dict[str, Any]) -> None:
        status, before = entry.get("status") or "pending", self.status.get(step, "pending")
        self.status[step] = status
        if status == "pending":
            return
        summary = self._summary(step, _when(entry.get("started_at")) or at)
        summary.kind, summary.status = entry.get("kind") or summary.kind, status
        summary.started = _when(entry.get("started_at")) or min(summary.started, at)
        ended = _when(entry.get("ended_at"))
        summary.ended = ended or max(summary.ended, at)
        approvals = entry.get("approvals") or []
        for record in approvals[self.approvals.get(step, 0):]:
            who = str(record.get("approver"))
            if record.get("subject"):
                who += f" (verified {record['subject']})"
            when = _when(record.get("at")) or at
            if (step, "approval") in self.open:
                self._close(step, "approval", when, "approved", who, seen=at)
        self.approvals[step] = len(approvals)
        decisions = entry.get("ramp_decisions") or []
        for decision in decisions[self.decisions.get(step, 0):]:
            self.timeline.entries.append(Entry(at, step, "ramp decision", None, str(decision.get("reason", "")),
                                               outcome=f"{decision.get('at')}% -> {decision.get('next')}%"))
        self.decisions[step] = len(decisions)
        if status == before:
            return
        if before == "awaiting_approval":
            self._close(step, "approval", at, "aborted" if status == "aborted" else "ended")
        if before == "held":
            self._close(step, "hold", at, {"running": "retry", "skipped": "skip", "aborted": "abort"}.get(status))
        if status in ("awaiting_approval", "held"):
            kind = "approval" if status == "awaiting_approval" else "hold"
            detail = str(entry.get("awaiting") or "") if kind == "approval" else str(entry.get("error") or "")
            wait = Wait(kind, at, detail=_short(detail, 240))
            self.open[(step, kind)] = wait
            summary.waits.append(wait)
            self.timeline.entries.append(Entry(at, step, "approval requested" if kind == "approval" else "held", None,
                                               wait.detail))

    def _controls(self, at: datetime, controls: list[Any]) -> None:
        for control in controls:
            if not isinstance(control, dict):
                continue
            key = (control.get("verb"), control.get("step"), control.get("actor"), control.get("at"))
            if key in self.controls:
                continue
            self.controls.add(key)
            verb, step, when = control.get("verb"), control.get("step"), _when(control.get("at")) or at
            who = str(control.get("actor")) + (f" (verified {control['subject']})" if control.get("subject") else "")
            if verb in ("retry", "skip"):
                held = [s for (s, kind) in self.open if kind == "hold" and (step is None or s == step)]
                for name in held[:1]:
                    self._close(name, "hold", when, verb, who, seen=at)
            elif verb == "abort":
                for name, kind in list(self.open):
                    self._close(name, kind, when, "abort", who, seen=at)
            elif verb == "pause":
                self.paused = (when, who)
            elif verb == "resume" and self.paused is not None:
                since, by = self.paused
                self.paused = None
                seconds = (when - since).total_seconds()
                self.timeline.entries.append(Entry(when, None, "pause ended", who,
                                                   f"paused by {by} for {format_duration(round(seconds, 2))}", seconds))

    def closed(self, at: datetime) -> None:
        """The run ended: a wait still open ended with it."""
        for name, kind in list(self.open):
            self._close(name, kind, at, "run ended")


class _Wrap:
    """Lets a single Payload go through the same decode path as a Payloads message."""

    def __init__(self, payload: Any):
        self.payloads = [payload]


def _gate_readings(activity_type: str, tag: ActivityTag | None, args: Any,
                   value: Any) -> list[tuple[str | None, str, str, Any, Any]]:
    """(step, gate, query, value, error) of each reading a reading activity took; a failed or timed-out
    activity (value is its message) is that error for each gate it read."""
    args = args if isinstance(args, dict) else {}
    if activity_type == READ_ACTION:  # one reading an activity (runs from before batched readings)
        reads = [{**args, "step": tag.step if tag else None, "gate": tag.gate if tag and tag.gate else "?"}]
        results = [value if isinstance(value, dict) else {"error": value}]
    else:
        reads = args.get("reads") or []
        results = value.get("readings") if isinstance(value, dict) else [{"error": value}] * len(reads)
    return [(read.get("step"), read.get("gate") or "?", read.get("query") or read.get("endpoint", ""),
             (result or {}).get("value"), (result or {}).get("error"))
            for read, result in zip(reads, results or [], strict=False)]  # a partial history: what it has


def _touch(timeline: Timeline, step: str | None, started: datetime, ended: datetime, *, activity: bool = False,
           reading: bool | None = None) -> None:
    if step is None:
        return
    summary = timeline.steps.get(step)
    if summary is None:
        summary = timeline.steps[step] = StepSummary(step=step, started=started, ended=ended)
    summary.started = min(summary.started, started)
    summary.ended = max(summary.ended, ended)
    if activity:
        summary.activities += 1
    if reading is not None:
        summary.readings += 1
        summary.failed_readings += 0 if reading else 1


def render_markdown(timeline: Timeline) -> str:
    """Markdown for a retrospective: a summary per step, then every event in order."""
    start = timeline.started
    total = (timeline.ended - start).total_seconds() if timeline.ended and start else None
    out = [
        f"# Timeline: {timeline.runbook} on {timeline.target}",
        "",
        f"- workflow: `{timeline.workflow_id}` (runs: {', '.join(f'`{r}`' for r in timeline.run_ids)})",
        f"- initiator: {timeline.initiator}",
        *([f"- runbook version: `{timeline.runbook_digest}` ({timeline.runbook_origin})"] if timeline.runbook_digest else []),
        *([f"- controller: coldstart {timeline.controller}, actions `{timeline.contracts}`"] if timeline.controller else []),
        f"- started: {start:%Y-%m-%d %H:%M:%S} UTC" if start else "- started: ?",
        f"- outcome: **{timeline.outcome}**" + (f" after {format_duration(round(total, 1))}" if total is not None else ""),
        "",
        "## Steps",
        "",
        ("Each step's wall time is its working time plus its waiting time (for an approval, held for an operator, "
         "on a timer); the top-level steps' durations plus the time between them are the run's wall time."),
        "",
        ("| step | kind | start (+s) | before (s) | duration (s) | working (s) | waiting (s) | waits (ended by) "
         "| actions | gate readings (no value) | approvals |"),
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for row in timeline.rows():
        summary = row.summary
        offset = (summary.started - start).total_seconds() if start else 0.0
        name = f"↳ {summary.step}" if row.nested else summary.step
        before = "" if row.nested else f"{row.gap_before_s:.2f}"
        waits = "; ".join(w.said() for w in summary.waits).replace("|", "\\|")
        actions = f"{summary.activities}" + (f" (+{summary.undos} undone)" if summary.undos else "")
        out.append(
            f"| {name} | {summary.kind} | {offset:.1f} | {before} | {summary.duration_s:.2f} | {summary.working_s:.2f} | "
            f"{summary.waiting_s:.2f} | {waits} | {actions} | {summary.readings} ({summary.failed_readings}) | "
            f"{'; '.join(summary.approvals) or ''} |"
        )
    totals = timeline.totals()
    end = timeline.wall_end()
    last = max((r.summary.ended for r in timeline.rows() if not r.nested), default=start)
    tail = (end - last).total_seconds() if end and last else 0.0
    out += [
        f"| after the last step | | | {tail:.2f} | | | | | | | |",
        f"| **total** | | | **{totals.between_s:.2f}** | **{totals.steps_s:.2f}** | | | | | | |",
        "",
        (f"Steps {totals.steps_s:.2f} s + between steps {totals.between_s:.2f} s = "
         f"{totals.steps_s + totals.between_s:.2f} s; run wall time (first event to "
         f"{'close' if timeline.ended else 'last event'}) {totals.wall_s:.2f} s."),
    ]
    out += ["", "## Events", "", "| time (UTC) | +s | step | event | actor | detail |", "|---|---:|---|---|---|---|"]
    for entry in timeline.entries:
        offset = (entry.at - start).total_seconds() if start else 0.0
        detail = entry.detail.replace("|", "\\|").replace("\n", " ")
        if entry.duration_s is not None and entry.event not in ("run finished",):
            detail += f" ({format_duration(round(entry.duration_s, 2))})"
        out.append(f"| {entry.at:%H:%M:%S.%f}"[:-3] + f" | {offset:.1f} | {entry.step or ''} | {entry.event} | {entry.actor or ''} | {detail} |")
    return "\n".join(out) + "\n"

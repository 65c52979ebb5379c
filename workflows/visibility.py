"""What a run shows while it runs: Web UI search attributes and details, and the worker's step and gate metrics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import timedelta
from operator import attrgetter
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows import search
    from workflows.contract import MEMO_CHUNK, GateReading, StatusMemo, StepState, workflow_id_for
    from workflows.history_tags import VIEW_TIMER_SUMMARY, approval_note
    from workflows.run_state import RunFields
    from workflows.spec import ActionStep, AnyStep, ApprovalSpec, RampStep
    from workflows.step_changes import StatusWatch, StepChanges, StepsInPlay

__all__ = ["VIEW_EVERY", "RunVisibility", "metrics_gate", "metrics_step"]

# While a run moves fast its live view (memo and search attributes) is upserted at most this often: each
# upsert is a history event and a visibility write on the server, which steps of a few ms each would pay
# for on every step (bench/step_overhead.py). A change after a quiet spell, and the run's end, go out at once.
VIEW_EVERY = timedelta(milliseconds=500)

# The server's cap on a summary (limit.userMetadataSummarySize), counted on its JSON payload.
_SUMMARY_BYTES = 400

_OPERATOR_HELP = (
    "Approve from the Temporal Web UI (Send an Update) or `coldstart approve`. Update name: "
)


def _clamped(summary: str) -> str:
    while len(json.dumps(summary).encode()) > _SUMMARY_BYTES:
        summary = summary[:-10]
    return summary


def metrics_step(runbook: str, step: str, outcome: str | None) -> None:
    """Worker metrics for infra's rules (replay-safe: the SDK drops them during replay)."""
    meter = workflow.metric_meter()
    labels = {"runbook": runbook, "step": step}
    meter.create_gauge("coldstart_step_in_progress", "1 while the step runs").set(0 if outcome else 1, labels)
    if outcome:
        meter.create_counter("coldstart_step_runs_total", "steps finished, by outcome").add(1, {**labels, "outcome": outcome})


def metrics_gate(runbook: str, gate: str, reading: GateReading) -> None:
    meter = workflow.metric_meter()
    result = "error" if reading.error else ("pass" if reading.passed else "fail")
    labels = {"runbook": runbook, "gate": gate}
    meter.create_counter("coldstart_gate_evaluations_total", "gate readings, by result").add(1, {**labels, "result": result})
    meter.create_gauge("coldstart_gate_last_result", "1 if the gate's last reading passed").set(1 if reading.passed else 0, labels)


# A step's part of what a live view shows.
_SIGNED = attrgetter("status", "attempts", "error", "percent", "last_good", "awaiting", "skip_requested_by",
                     "gate_gives_up_at")
_LAST_READING = attrgetter("gate", "value", "passed", "error")


def _step_part(step: StepState) -> tuple:
    return _SIGNED(step), _LAST_READING(step.readings[-1]) if step.readings else None, len(step.approvals)


class RunVisibility(RunFields):
    """RunbookWorkflow's Web UI face; reads the run's state, never changes it."""

    async def _keep_status_memo(self) -> None:
        """Keep the run's status in its memo, for live views (runtime/polling.py) that read the server.

        Runs beside the steps: its condition is checked whenever the workflow has run, so a change
        is in the memo at once after a quiet VIEW_EVERY and else at the end of the VIEW_EVERY after the
        upsert before (with the search attributes). Only
        the entries that changed are upserted; a gate reading the same value again changes none. A
        status past workflows/contract.MEMO_BUDGET is no longer kept (views Query it instead).
        Each check, and each upsert, reads only the steps that changed (workflows/step_changes.py).
        """
        memo = StatusMemo(compact=True, chunk=MEMO_CHUNK)
        changed_steps = self._step_changes().reader()
        in_play = StepsInPlay()
        while True:
            since = self._status_since()
            steps = self._step_changes().taken(changed_steps)
            current, held = in_play.update(steps)
            changed = {} if memo.full else memo.changes_in(self._run_status([], current, held), steps)
            if changed:
                self._upsert_status_memo(changed)
            if self._upsert_wanted_view() or changed:
                await self._gather_view_changes(self._asks)
                continue
            await workflow.wait_condition(lambda: since() or self._wants_view())

    async def _gather_view_changes(self, asks_shown: int) -> None:
        """After an upsert, let the view's changes gather for VIEW_EVERY; not past the run's end or a step
        starting to wait on a person (an approval, a hold), which an operator sees, and the timeline
        (cli/timeline.py) dates, by the upsert that shows it.

        Always a timer of the same length, never one for what is left of the pace by workflow time: whether
        a task waits or upserts must follow from the history's events alone, so that a replay (after a
        server restart, on another worker) takes the same path. A run whose view changes seldom pays one
        timer per upsert; a run moving fast, one timer and one upsert per VIEW_EVERY instead of an upsert
        a step."""
        def now_due() -> bool:
            return self._ended_at is not None or self._asks != asks_shown

        if now_due():
            return
        # The window's timer is left to fire, never cancelled: a change due at once lands in the task where
        # the timer may be firing, and the time-skipping test server then never takes that task's completion
        # (tests/test_visibility.py).
        window = asyncio.ensure_future(workflow.sleep(VIEW_EVERY, summary=VIEW_TIMER_SUMMARY))
        await workflow.wait_condition(lambda: now_due() or window.done())

    def _upsert_status_memo(self, changed: dict[str, Any]) -> None:
        """The keeper's one command (a seam: tests/test_status_upkeep.py checks it against the whole upkeep)."""
        workflow.upsert_memo(changed)

    def _step_changes(self) -> StepChanges:
        """The run's steps' change reports, from the first reader on (the steps are final by then)."""
        if getattr(self, "_changes", None) is None:
            self._changes = StepChanges(self._steps)
        return self._changes

    def _status_since(self) -> Callable[[], bool]:
        """A condition true once what a live view shows changed from what it shows now: a step's status,
        attempts, error, ramp percentages, approval or skip request, its gate's deadline, its last reading's
        result, its approvals' count; the run's state, pause, error, awaited approvals and operator controls'
        count."""
        if getattr(self, "_watch", None) is None:
            self._watch = StatusWatch(self._step_changes(), _step_part, self._run_part)
        return self._watch.since()

    def _run_part(self) -> tuple:
        return self._state, self._paused, self._error, tuple(self._awaiting), len(self._controls)

    def _publish(self, current: str | None) -> None:
        """Ask for the Web UI search attributes to show `current`: the status keeper upserts them with the
        memo, when they change (not on every event)."""
        self._wanted_view = (current, bool(self._awaiting))

    def _wants_view(self) -> bool:
        return self._wanted_view is not None and self._wanted_view != self._published

    def _upsert_wanted_view(self) -> bool:
        """Upsert the search attributes when what _publish last asked for is not what they show."""
        wanted = self._wanted_view
        if wanted is None or wanted == self._published:
            return False
        self._published = wanted
        current, awaiting = wanted
        workflow.upsert_search_attributes(
            [search.CURRENT_STEP.value_set(current or self._state), search.AWAITING_APPROVAL.value_set(awaiting)]
        )
        return True

    def _approval_notes(self, step_id: str, spec: ApprovalSpec) -> list[str]:
        """How to approve, one line per timer an approval waits beside (workflows/runbook_workflow.py).

        The Web UI opens a run on its timeline, which shows each pending timer's summary on a row of its
        own and none of the run's details: who may approve, the command, and the Update's name and input.
        """
        allowed = self._allowed_approvers(spec)
        verified = self._needs_identity("approve")
        # How the CLI names the run: its target, or its workflow id when that is not the target's (a schedule's).
        run = workflow.info().workflow_id
        run = self._inp.target_name if run == workflow_id_for(self._inp.target_name) else run
        fields = {"step": step_id, "approver": allowed[0] if allowed else "YOU", "comment": ""}
        if verified:
            fields["identity_token"] = "PASTE"
        lines = [
            approval_note(step_id, f"may approve: {', '.join(allowed) if allowed else 'anyone named'}"
                          + (f" (not {self._inp.initiator}, who started the run: four eyes)" if self._four_eyes(spec) else "")
                          + (f"; {self._steps[step_id].awaiting}" if self._steps[step_id].awaiting else ""),
                          first=True),
            approval_note(step_id, f"coldstart approve {run} {step_id}" + (" --vault-login" if verified else "")),
            approval_note(step_id, f"Web UI: More Actions, Send an Update, approve, input {json.dumps(fields, separators=(',', ':'))}"),
        ]
        if verified:
            lines.append(approval_note(step_id, f"Web UI: PASTE the output of {self.token_command('approve', step_id)}"))
        return [_clamped(line) for line in lines]

    def _details(self, step: AnyStep | None) -> str:
        """Markdown for the Web UI's 'current details': what is happening and how to act on it."""
        book = self._inp.runbook.metadata.name
        if step is None:
            if self._paused and self._state == "running":
                return f"**{book}** paused. Resume with Update `resume` and `{self._example('resume', actor='you')}`."
            return f"**{book}** {self._state}" + (f": {self._error}" if self._error else "")
        state = self._steps[step.id]
        lines = [f"**{book}** on `{self._inp.target_name}`: step `{step.id}` ({state.kind}) {state.status}"]
        if step.description:
            lines.append(step.description)
        if isinstance(step, ActionStep):
            lines.append(f"Runs `{step.action}`: {self._inp.actions[step.action].description}")
        if isinstance(step, RampStep) and state.percent is not None:
            lines.append(f"Ramp at {state.percent}% (last good {state.last_good if state.last_good is not None else step.ramp.baseline}%).")
        if state.status == "awaiting_approval":
            spec = self._awaiting.get(step.id)
            allowed = (self._allowed_approvers(spec) if spec else None) or []
            lines.append(f"Waiting for approval: {state.awaiting}")
            lines.append(
                _OPERATOR_HELP
                + "`approve`, input: "
                + f"`{self._example('approve', step=step.id, approver=allowed[0] if allowed else 'your-name', comment='checked')}`"
            )
            if self._needs_identity("approve"):
                lines.append(f"identity_token: paste the output of `{self.token_command('approve', step.id)}` "
                             "(your own Vault login); it is bound to this run, this step and this verb.")
            if allowed:
                lines.append(f"Allowed approvers: {', '.join(allowed)}")
            if spec and self._four_eyes(spec):
                lines.append(f"Four eyes: {self._inp.initiator} (who started the run) cannot approve.")
        if state.status == "held":
            lines.append(f"Held after failure: {state.error}")
            for name in ("retry", "skip", "abort"):
                lines.append(f"Update `{name}`: `{self._example(name, step=step.id, actor='your-name', reason='why')}`")
            approvers = self._skippers()
            lines.append(f"Skip needs an approver ({', '.join(approvers)})" if approvers
                         else "Nobody may skip: the runbook and its target name no approvers in common.")
            if state.skip_requested_by:
                lines.append(f"Skip requested by {state.skip_requested_by}; four eyes: a second approver must confirm.")
            operators = self._operators()
            if operators:
                lines.append(f"Retry and abort: {', '.join(operators)}")
            elif operators is not None:
                lines.append(f"Nobody may retry or abort: {self._nobody_operates()}.")
        return "\n\n".join(lines)

"""RunbookWorkflow: walks a validated runbook plan deterministically, step by step."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from activities.contracts.telemetry import MAX_READS_PER_BATCH, READ_MANY_ACTION, WAITED_IN_READING
    from activities.oidc import IDENTITY_KEYS_ACTION, IdentityKeys
    from activities.policy import DrillCheck, TargetPolicy
    from activities.retry import Retry, format_duration
    from workflows.calls import (
        READING_PRIORITY,
        DeadlineMissed,
        RunAborted,
        StepFailed,
        call_action,
        compare,
        execute_action,
        failure_message,
        referenced,
    )
    from workflows.contract import (
        RESOLVE_HEARTBEAT,
        RESOLVE_RUN_ACTIVITY,
        SCHEDULED_SUFFIX,
        ApprovalRecord,
        ApproveRequest,
        ControlRecord,
        ControlRequest,
        FanOutInput,
        FanOutResult,
        GateReading,
        RampDecision,
        ResumeState,
        RunInput,
        RunRequest,
        RunResult,
        RunStart,
        RunStatus,
        SealedFanOut,
        SealedRun,
        StepState,
        UndoRecord,
        drill_schedule_id,
        parse_request,
        parsed_start,
        readings_queue,
        workflow_id_for,
    )
    from workflows.controls import OperatorControls
    from workflows.fanout import (
        FANOUT_CHILD_THRESHOLD,
        RESUME_BUDGET,
        FanOutWorkflow,
        reads_results,
        run_fan_out,
        run_in_batches,
        shown_outputs,
    )
    from workflows.history_tags import ActivityTag, tagged, timer_summary
    from workflows.notices import RunNotices
    from workflows.ramp_policy import decide as decide_next_step
    from workflows.readings import ReadingBatch
    from workflows.refs import RefError, resolve
    from workflows.sealing import continuation_place, fan_out_place, seal, start_refusal, verify
    from workflows.spec import (
        ActionDefaults,
        ActionStep,
        AdaptiveSpec,
        AnyStep,
        ApprovalSpec,
        ApprovalStep,
        ForEachStep,
        GateSpec,
        GateStep,
        OnFailure,
        ParallelStep,
        RampStep,
        WaitStep,
    )
    from workflows.step_changes import IN_PLAY
    from workflows.visibility import RunVisibility, metrics_gate, metrics_step

__all__ = ["RunbookWorkflow"]

_T = TypeVar("_T")

# Who stops a drill whose guard turns red, in its abort record and its readings.
_GUARD_STEP = "drill-guard"
# The loader pins gate reads only for a runbook with a gate; a drill's guard reads in any runbook.
_READ_MANY_DEFAULTS = ActionDefaults(name=READ_MANY_ACTION, timeout=timedelta(seconds=60), retry=Retry(max_attempts=1))
_MAX_READINGS_KEPT = 60
_MAX_REJECTED_KEPT = 50
# How long the timers that show an approval's instructions run before the next ones replace them.
NOTES_RENEWED_EVERY = timedelta(days=1)
# How long a run that answered an Update in its last workflow task waits before it ends (_answers_land).
ANSWERS_LAND_IN = timedelta(milliseconds=1)
# The Schedule that started a run, set by the server on each run a Schedule starts.
_SCHEDULED_BY = SearchAttributeKey.for_keyword("TemporalScheduledById")


@workflow.defn
class RunbookWorkflow(OperatorControls, RunVisibility):
    """Interprets one runbook run. Operators steer it with Updates (or Signals) and read it with Queries."""

    @workflow.init
    def __init__(self, start: RunStart | dict[str, Any]) -> None:
        # Until the door has resolved the request (or verified the sealed plan), the run shows the names its
        # start gave and holds no step.
        parsed, self._malformed = parsed_start(RunStart, start)
        self._start = parsed or RunStart()
        inp = self._start.placeholder()
        self._inp = inp
        self._steps: dict[str, StepState] = {}
        self._specs: dict[str, AnyStep] = {}
        self._outputs: dict[str, dict[str, Any]] = {}
        self._undo: list[UndoRecord] = []
        self._paused = False
        self._abort: ControlRequest | None = None
        self._decisions: dict[str, str] = {}
        self._awaiting: dict[str, ApprovalSpec] = {}
        self._granted: dict[str, ApprovalRecord] = {}
        self._rejected_signals: list[str] = []
        self._answered_in = -1  # the history length of the workflow task that last ran an Update's handler
        self._state = "running"
        self._error: str | None = None
        self._ended_at = None
        self._seq = 0
        self._published: tuple[str | None, bool] | None = None
        self._wanted_view: tuple[str | None, bool] | None = None
        self._asks = 0  # each time the run starts waiting on a person: the live view shows that at once
        self._identity_keys: IdentityKeys | None = None
        self._controls: list[ControlRecord] = []
        # Digests of identity tokens already used in this run: a token seen in the history is not reusable.
        self._used_tokens: list[str] = []
        self._readings = ReadingBatch(self._read_many, self._sleep, most=MAX_READS_PER_BATCH)
        # Deadlines bind the main steps; the runbook's on_miss steps run after one was missed, unbound.
        self._deadlines_bind = True
        self._started_at = workflow.now()

    def _adopt(self, plan: RunInput) -> None:
        """Make `plan` (resolved by the catalog, or verified under its seal) the run's, with its progress."""
        self._inp = plan
        self._steps.clear()
        self._specs.clear()
        self._index_plan(plan)
        if plan.resume is not None:
            self._steps.update(plan.resume.steps)
            self._undo = list(plan.resume.undo_stack)
            self._outputs = dict(plan.resume.outputs)
            self._paused = plan.resume.paused
            self._started_at = plan.resume.started_at
            self._identity_keys = plan.resume.identity_keys
            self._controls = list(plan.resume.controls)
            self._used_tokens = list(plan.resume.used_tokens)

    async def _door(self, start: RunStart) -> str | None:
        """Make the run's plan the controller's own before any command that acts: a new run's request resolved
        by the worker's catalog, or a continuation's plan verified against the seal the run before it made.
        The reason it refuses otherwise (then no step runs)."""
        info = workflow.info()
        refusal = start_refusal("run")
        if refusal is not None:
            return f"refused by the controller: {refusal}"
        if start.request is not None and start.sealed is not None:
            return "refused by the controller: a run starts from a request or continues a sealed plan, not both"
        if start.sealed is not None:
            if info.continued_run_id is None:
                return ("refused by the controller: a sealed plan is handed on by continue-as-new only; start a run "
                        "with a request")
            if start.sealed.plan.resume is None:
                return "refused by the controller: a continuation carries the run's progress"
            refused = await verify(start.sealed.plan, start.sealed.seal,
                                   continuation_place(info.workflow_id, info.continued_run_id))
            if refused is not None:
                return f"refused by the controller: {refused}"
            self._adopt(start.sealed.plan)
            return None
        if start.request is None:
            return "refused by the controller: the run carries no request to resolve against the catalog"
        if info.continued_run_id is not None:
            return "refused by the controller: a continuation carries the controller's sealed plan, not a request"
        return await self._resolve_request(start.request)

    async def _resolve_request(self, request: RunRequest) -> str | None:
        """Replace the starter's input with the plan the worker's catalog resolves its request to; the reason
        when it refuses (then no step runs)."""
        try:
            with tagged(ActivityTag("resolve")):
                plan = await workflow.execute_activity(
                    RESOLVE_RUN_ACTIVITY, request, result_type=RunInput,
                    start_to_close_timeout=timedelta(seconds=60), heartbeat_timeout=RESOLVE_HEARTBEAT,
                    retry_policy=RetryPolicy(maximum_attempts=5, non_retryable_error_types=["CatalogRefused"]),
                    summary=f"resolve {request.runbook} on {request.target}"[:400],
                )
        except ActivityError as exc:
            return f"refused by the controller: {failure_message(exc)}"
        # One run per target holds only if the run's id is its resolved target's; a drill's Schedule appends its
        # time, and only that Schedule's runs (the server marks them) may carry such an id.
        info = workflow.info()
        expected, given = workflow_id_for(plan.target_name), info.workflow_id
        if given != expected:
            schedule = drill_schedule_id(plan.runbook.metadata.name, plan.target_name)
            if not SCHEDULED_SUFFIX.fullmatch(given.removeprefix(expected)):
                return f"refused by the controller: workflow id {given} is not target {plan.target_name}'s ({expected})"
            if info.typed_search_attributes.get(_SCHEDULED_BY) != schedule or not plan.drill:
                return (f"refused by the controller: workflow id {given} is shaped like a scheduled drill's, but the "
                        f"run was not started by Schedule {schedule}")
        self._adopt(plan)
        return None

    def _index_plan(self, plan: RunInput) -> None:
        self._index(plan.runbook.steps)
        self._index(plan.runbook.deadline.on_miss if plan.runbook.deadline else [])

    def _index(self, steps: list[Any]) -> None:
        for step in steps:
            self._specs[step.id] = step
            self._steps[step.id] = StepState(id=step.id, kind=step.kind, title=step.name or step.description)
            if isinstance(step, ParallelStep):
                self._index(step.parallel)

    # ---- run ---------------------------------------------------------------------------------

    @workflow.run
    async def run(self, start: RunStart | dict[str, Any]) -> RunResult:
        # Nothing a client sends is executed unless the controller produced it: the door first.
        refused = (f"refused by the controller: {self._malformed}" if self._malformed is not None
                   else await self._door(self._start))
        inp = self._inp
        steps = inp.runbook.steps
        first = inp.resume.next_index if inp.resume else 0
        self._status_memo = asyncio.ensure_future(self._keep_status_memo())
        # Events for the worker's notifier: they add nothing to the history.
        objectives = inp.runbook.objectives.model_dump() if inp.runbook.objectives else None
        self._notices = RunNotices(self.status, objectives)
        self._notices_watch = asyncio.ensure_future(self._notices.watch(self._status_since))
        guard = self._drill_guard_check()
        if guard is not None:
            self._guard = asyncio.ensure_future(self._watch_drill_guard(*guard))
        try:
            if refused is not None:
                raise StepFailed(refused)
            if self._identity() is not None and self._identity_keys is None:
                await self._capture_identity_keys()
            for index in range(first, len(steps)):
                if index > first and workflow.info().is_continue_as_new_suggested():
                    await self._continue_as_new(index)
                await self._run_step(steps[index])
            # Each way out waits for the Updates to land before it says how the run ended: the view then
            # shows the end in the task that ends the run, never before it (_answers_land).
            await self._answers_land()
            self._state = "succeeded"
        except DeadlineMissed as exc:
            await self._answers_land()
            self._error = str(exc)
            self._state = "failed"
            await self._deadline_missed()
        except RunAborted:
            await self._answers_land()
            self._state = "aborted"
            who = self._abort.actor if self._abort else "operator"
            self._error = f"aborted by {who}" + (f": {self._abort.reason}" if self._abort and self._abort.reason else "")
            if self._abort is not None and self._abort.undo:
                await self._rollback()
                if self._state == "rolled_back":
                    self._state = "aborted"
            elif self._undo:
                # Say exactly what the aborted run leaves changed: what its undo actions would have reverted.
                left = ", ".join(f"{r.step} ({r.action})" for r in reversed(self._undo))
                self._error = f"{self._error}; left in place, not undone: {left}"
        except StepFailed as exc:
            await self._answers_land()
            self._error = str(exc)
            if exc.rollback:
                await self._rollback()
            else:
                self._state = "failed"
        self._ended_at = workflow.now()
        self._notices.offer()
        self._publish(None)
        workflow.set_current_details(self._details(None))
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self._answers_land()
        assert self._state != "running"  # every way out of the steps above set how the run ended
        result = RunResult(state=self._state, steps=list(self._steps.values()), error=self._error,
                           ended_at=self._ended_at, controls=list(self._controls))
        if self._state != "succeeded":
            raise ApplicationError(
                f"runbook {inp.runbook.metadata.name} {self._state}: {self._error}",
                result.model_dump(mode="json"),
                type=f"Runbook{self._state.title().replace('_', '')}",
                non_retryable=True,
            )
        return result

    def _deadline(self, step: AnyStep) -> datetime | None:
        """When `step` must have ended: the earlier of its own limit and the runbook's; None if unbound."""
        if not self._deadlines_bind:
            return None
        ends = []
        if self._inp.runbook.deadline is not None:
            if isinstance(self._inp.runbook.deadline.at, str):
                raise DeadlineMissed(f"the deadline {self._inp.runbook.deadline.at!r} was never resolved to a time")
            ends.append(self._inp.runbook.deadline.end(self._started_at))
        if step.deadline is not None:
            ends.append(self._started_at + step.deadline)
        return min(ends) if ends else None

    def _check_deadline(self, step: AnyStep) -> datetime | None:
        """Fail fast when `step` cannot finish in time: past its deadline, or with less left than it needs."""
        end = self._deadline(step)
        if end is None:
            return None
        left = end - workflow.now()
        need = step.needs or timedelta(0)
        if left <= need:
            ahead = f"{_seconds(left)} left" if left > timedelta(0) else f"{_seconds(-left)} past it"
            needs = f", the step needs {_seconds(need)}" if step.needs else ""
            raise DeadlineMissed(f"step {step.id} not started: deadline {_clock(end)}, {ahead}{needs}")
        return end

    async def _within(self, step: AnyStep, end: datetime | None, work: Awaitable[_T]) -> _T:
        """Await `work` (a coroutine), cancelling it at `end`: a step never runs past its deadline."""
        if end is None:
            return await work
        task = asyncio.ensure_future(work)
        left = end - workflow.now()
        try:
            await workflow.wait_condition(task.done, timeout=left, timeout_summary=f"{step.id}: deadline")
        except TimeoutError:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, ActivityError, StepFailed):
                pass
            raise DeadlineMissed(f"step {step.id} stopped at its deadline {_clock(end)} after {_seconds(left)}") from None
        return task.result()

    async def _deadline_missed(self) -> None:
        """Run the runbook's on_miss steps: what it says to do when the deadline cannot be met."""
        spec = self._inp.runbook.deadline
        if spec is None or not spec.on_miss:
            return
        if spec.on_miss_after is not None and self._steps[spec.on_miss_after].status != "succeeded":
            self._error = f"{self._error}; on_miss not run: {spec.on_miss_after} had not confirmed it"
            return
        self._deadlines_bind = False
        done: list[str] = []
        try:
            for step in spec.on_miss:
                await self._run_step(step)
                done.append(step.id)
        except (StepFailed, RunAborted) as exc:
            self._error = f"{self._error}; on_miss stopped: {exc}"
        self._error = f"{self._error}; on_miss ran: {', '.join(done) or 'nothing'}"

    async def _answers_land(self) -> None:
        """End the run only in a workflow task that answered no Update: if this one did, wait for the next.

        The server refuses a task that ends the run while events the run has not seen wait for it (a
        timer that fired, a signal): it fails the task and answers each Update the task carried with
        "unexpected workflow task failure", not applied, so the operator's final approve or abort
        would be lost to a coincidence. A task that answers and ends nothing cannot be refused that
        way. Yields only when it waits, so a run that answered nothing keeps its commands' order."""
        while self._answered_in == workflow.info().get_current_history_length():
            await workflow.sleep(ANSWERS_LAND_IN, summary="the run ends after the Update it just answered")
            await workflow.wait_condition(workflow.all_handlers_finished)

    async def _continue_as_new(self, next_index: int) -> None:
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self._answers_land()
        resume = ResumeState(
            next_index=next_index,
            steps=self._steps,
            undo_stack=self._undo,
            outputs=self._outputs,
            paused=self._paused,
            started_at=self._started_at,
            identity_keys=self._identity_keys,
            controls=self._controls,
            used_tokens=self._used_tokens,
        )
        carried = self._inp.model_copy(update={"resume": resume})
        size = len(carried.model_dump_json())
        # A fan-out's per-item results kept for a later step can make the new run's input too large to start:
        # the run goes on in this history (Temporal's hard limit is 50 MB) rather than stop.
        if size > RESUME_BUDGET:
            workflow.logger.warning("not continuing as new: its input would be too large",
                                    extra={"bytes": size, "budget": RESUME_BUDGET})
            return
        info = workflow.info()
        sealed = await seal(carried, continuation_place(info.workflow_id, info.run_id))
        workflow.continue_as_new(RunStart(sealed=SealedRun(plan=carried, seal=sealed)))

    async def _capture_identity_keys(self) -> None:
        """The keys that sign operators' identity tokens, read once so validators can check tokens offline."""
        policy = self._identity()
        assert policy is not None
        action = self._inp.actions[IDENTITY_KEYS_ACTION]
        where: dict[str, Any] = {"address": policy.vault}
        if policy.provider is not None:
            where["provider"] = policy.provider
        if policy.ca_cert is not None:
            where["ca_cert"] = policy.ca_cert
        try:
            keys = await execute_action(
                action,
                where,
                activity_id=self._next_id("identity-keys"),
                summary=f"identity keys from {policy.vault}",
                tag=ActivityTag("identity"),
            )
        except StepFailed as exc:
            raise StepFailed(f"verified identity: cannot read the signing keys from {policy.vault}: {exc}") from None
        self._identity_keys = IdentityKeys.model_validate(keys)
        workflow.logger.info("identity keys captured", extra={"issuer": self._identity_keys.issuer,
                                                              "keys": len(self._identity_keys.keys)})

    def _context(self, **extra: Any) -> dict[str, Any]:
        info = workflow.info()
        return {
            "params": self._inp.params,
            "target": self._inp.target,
            "steps": self._outputs,
            "run": {
                "id": info.workflow_id,
                "initiator": self._inp.initiator,
                "target": self._inp.target_name,
                "runbook": self._inp.runbook.metadata.name,
                "drill": self._inp.drill,
            },
            **extra,
        }

    def _resolve(self, value: Any, **extra: Any) -> Any:
        try:
            return resolve(value, self._context(**extra))
        except RefError as exc:
            raise StepFailed(f"reference does not resolve: {exc}") from None

    def _next_id(self, label: str) -> str:
        self._seq += 1
        return f"{label}#{self._seq}"

    async def _checkpoint(self) -> None:
        if self._abort is not None:
            raise RunAborted()
        if self._paused:
            workflow.logger.info("run paused before next step")
            workflow.set_current_details(self._details(None))
            await workflow.wait_condition(lambda: not self._paused or self._abort is not None)
            if self._abort is not None:
                raise RunAborted()

    async def _sleep(self, duration: timedelta, summary: str) -> None:
        if duration <= timedelta(0):
            return
        try:
            await workflow.wait_condition(
                lambda: self._abort is not None, timeout=duration, timeout_summary=summary[:200]
            )
        except TimeoutError:
            return
        raise RunAborted()

    async def _run_step(self, step: AnyStep) -> None:
        state = self._steps[step.id]
        if state.status in ("succeeded", "skipped"):
            return  # finished before a continue-as-new
        retry = step.retry or Retry()
        while True:
            await self._checkpoint()
            try:
                end = self._check_deadline(step)
            except DeadlineMissed as exc:
                state.status, state.error, state.ended_at = "failed", str(exc), workflow.now()
                metrics_step(self._inp.runbook.metadata.name, step.id, "failed")
                raise
            state.attempts += 1
            state.status = "running"
            state.error = None
            state.started_at = state.started_at or workflow.now()
            self._publish(step.id)
            workflow.set_current_details(self._details(step))
            workflow.logger.info("step started", extra={"step": step.id, "attempt": state.attempts})
            metrics_step(self._inp.runbook.metadata.name, step.id, None)
            try:
                outputs = await self._within(step, end, self._execute(step, state))
            except StepFailed as exc:
                state.error = str(exc)
                workflow.logger.warning("step failed", extra={"step": step.id, "error": str(exc)})
                if isinstance(exc, DeadlineMissed):
                    state.status, state.ended_at = "failed", workflow.now()
                    metrics_step(self._inp.runbook.metadata.name, step.id, "failed")
                    raise
                if step.on_failure == OnFailure.retry and not isinstance(step, ActionStep) and state.attempts < retry.max_attempts:
                    delay = retry.delay(state.attempts)
                    state.status = "failed"
                    await self._sleep(delay, timer_summary(step.id, f"retry in {format_duration(delay)}"))
                    continue
                if step.on_failure == OnFailure.hold:
                    try:
                        decision = await self._within(step, end, self._hold(step, state))
                    except DeadlineMissed:
                        state.status, state.awaiting, state.ended_at = "failed", None, workflow.now()
                        raise
                    if decision == "retry":
                        continue
                    state.status = "skipped"
                    state.ended_at = workflow.now()
                    metrics_step(self._inp.runbook.metadata.name, step.id, "skipped")
                    self._outputs[step.id] = {"outputs": {}, "status": "skipped"}
                    return
                state.status = "failed"
                state.ended_at = workflow.now()
                metrics_step(self._inp.runbook.metadata.name, step.id, "failed")
                raise StepFailed(f"step {step.id} failed: {exc}", rollback=step.on_failure == OnFailure.rollback) from None
            state.status = "succeeded"
            state.outputs = shown_outputs(outputs) if isinstance(step, ForEachStep) else outputs
            state.ended_at = workflow.now()
            metrics_step(self._inp.runbook.metadata.name, step.id, "ok")
            self._outputs[step.id] = {"outputs": outputs, "status": "succeeded"}
            self._publish(step.id)
            return

    async def _hold(self, step: AnyStep, state: StepState) -> str:
        state.status = "held"
        state.awaiting = "operator: retry, skip or abort"
        self._asks += 1
        self._publish(step.id)
        workflow.set_current_details(self._details(step))
        await workflow.wait_condition(lambda: step.id in self._decisions or self._abort is not None)
        state.awaiting = None
        if self._abort is not None:
            state.status = "aborted"
            raise RunAborted()
        return self._decisions.pop(step.id)

    # Each step kind's runner (spec.STEP_TYPES names the kinds; tests/test_step_kinds.py proves this complete).
    STEP_RUNNERS: ClassVar[dict[str, str]] = {
        "action": "_action",
        "gate": "_gate_step",
        "approval": "_approval_step",
        "wait": "_wait_step",
        "ramp": "_ramp",
        "for_each": "_for_each",
        "parallel": "_parallel",
    }

    async def _execute(self, step: AnyStep, state: StepState) -> dict[str, Any]:
        return await getattr(self, self.STEP_RUNNERS[step.kind])(step, state)

    async def _gate_step(self, step: GateStep, state: StepState) -> dict[str, Any]:
        await self._gate(step.id, step.gate, step.gate.name or step.id)
        return {"last": state.readings[-1].value if state.readings else None}

    async def _approval_step(self, step: ApprovalStep, state: StepState) -> dict[str, Any]:
        record = await self._approval(step.id, step.approval, acts=self._guarded_inputs(step.id))
        return record.model_dump(mode="json")

    def _guarded_inputs(self, step_id: str) -> str | None:
        """What an approval step lets happen, when the step after it changes something: that action and its
        inputs as resolved now, so the approver sees what is acted on, not only the runbook's prompt."""
        steps = self._inp.runbook.steps
        index = next((i for i, s in enumerate(steps) if s.id == step_id), None)
        if index is None or index + 1 >= len(steps):
            return None
        following = steps[index + 1]
        if not isinstance(following, ActionStep):
            return None
        action = self._inp.actions.get(following.action)
        if action is None or not action.mutating:
            return None
        try:
            args = resolve(following.with_, self._context())
        except RefError:
            return f"then {following.id} runs {following.action} (its inputs resolve when it starts)"
        return f"then {following.id} runs {following.action} with {_shown(args)}"

    async def _wait_step(self, step: WaitStep, state: StepState) -> dict[str, Any]:
        await self._sleep(step.wait, timer_summary(step.id, f"wait {format_duration(step.wait)}"))
        return {}

    async def _action(self, step: ActionStep, state: StepState) -> dict[str, Any]:
        action = self._inp.actions[step.action]
        args = self._resolve(step.with_)
        execution = execute_action(
            action,
            args,
            activity_id=self._next_id(step.id),
            summary=f"{step.id}: {step.action} {json.dumps(args, default=str)[:200]}",
            tag=ActivityTag("action", step.id),
            timeout=step.timeout,
            retry=step.retry if step.on_failure == OnFailure.retry else None,
        )
        running = asyncio.ensure_future(execution)
        # An abort does not wait for a long action: the activity is cancelled (it sees it at its next heartbeat).
        await workflow.wait_condition(lambda: running.done() or self._abort is not None)
        if not running.done():
            running.cancel()
            try:
                await running
            except (asyncio.CancelledError, StepFailed):
                pass
            raise RunAborted()
        outputs = running.result()
        self._remember_undo(step, action, args, outputs)
        return outputs

    def _remember_undo(self, step: ActionStep, action: ActionDefaults, args: dict[str, Any], outputs: dict[str, Any]) -> None:
        if step.undo is not None:
            extra_outputs = dict(self._outputs)
            extra_outputs[step.id] = {"outputs": outputs, "status": "succeeded"}
            context = self._context()
            context["steps"] = extra_outputs
            try:
                undo_args = resolve(step.undo.with_, context)
            except RefError as exc:
                raise StepFailed(f"undo of {step.id} does not resolve: {exc}") from None
            self._undo.append(UndoRecord(step=step.id, action=step.undo.action, args=undo_args))
        elif action.undo:
            undo_args = outputs.get(action.undo_from_output, {}) if action.undo_from_output else args
            self._undo.append(UndoRecord(step=step.id, action=action.undo, args=undo_args))

    async def _rollback(self) -> None:
        undone: list[str] = []
        while self._undo:
            record = self._undo.pop()
            try:
                await execute_action(
                    self._inp.actions[record.action],
                    record.args,
                    activity_id=self._next_id(f"undo:{record.step}"),
                    summary=f"rollback {record.step}: {record.action}",
                    tag=ActivityTag("undo", record.step),
                )
            except StepFailed as exc:
                self._state = "failed"
                left = [r.step for r in reversed(self._undo)] + [record.step]
                self._error = (
                    f"{self._error}; rollback stopped at {record.step}: {exc}; "
                    f"undone: {', '.join(undone) or 'nothing'}; not undone: {', '.join(left)}"
                )
                return
            self._steps[record.step].status = "rolled_back"
            undone.append(record.step)
        self._state = "rolled_back"
        self._error = f"{self._error}; rolled back: {', '.join(undone) or 'nothing to undo'}"

    async def _read(self, step_id: str, gate: GateSpec, name: str, percent: int | None,
                    not_before: datetime | None = None) -> GateReading:
        # The read's timeout and retries are what telemetry.read_many (telemetry.read before the patch)
        # declares, pinned by the loader; its single attempt means a failed read is a failed reading:
        # the gate keeps polling and fails closed.
        request = {"source": gate.source, "endpoint": gate.endpoint, "query": gate.query}
        try:
            read = {**request, "step": step_id, "gate": name, "percent": percent}
            if not_before is not None:
                read["not_before"] = not_before.isoformat()
            raw = await self._readings.read(read)
            value, error = raw.get("value"), raw.get("error")
        except ActivityError as exc:
            value, error = None, failure_message(exc)
        passed = value is not None and error is None and compare(float(value), gate.comparator, gate.threshold)
        reading = GateReading(gate=name, at=workflow.now(), value=value, passed=passed, error=error, percent=percent,
                              comparator=gate.comparator, threshold=gate.threshold)
        metrics_gate(self._inp.runbook.metadata.name, name, reading)
        return reading

    def _drill_guard_check(self) -> tuple[DrillCheck, str, timedelta] | None:
        """A drill's guard from its target's policy (policy.drills.guard), where it reads, and how often."""
        if not self._inp.drill:
            return None
        safety = TargetPolicy.of(self._inp.target).drills
        if safety is None or safety.guard is None:
            return None
        prometheus = safety.prometheus or (self._inp.target.get("telemetry") or {}).get("prometheus")
        return (safety.guard, prometheus, safety.guard_interval) if prometheus else None

    async def _watch_drill_guard(self, check: DrillCheck, prometheus: str, interval: timedelta) -> None:
        """Beside the steps of a drill: read the guard every interval; red (or unreadable three times running),
        stop the drill and undo what it changed, as `abort --undo` would."""
        unread = 0
        while self._state == "running" and self._abort is None:
            raw = await self._readings.read({"source": "prometheus", "endpoint": prometheus, "query": check.red_count(),
                                             "step": _GUARD_STEP, "gate": check.name, "percent": None})
            value, error = raw.get("value"), raw.get("error")
            unread = unread + 1 if error is not None or value is None else 0
            red = value is not None and error is None and float(value) > 0
            if (red or unread >= 3) and self._state == "running" and self._abort is None:
                why = (f"guard {check.name} red ({value:g} series above 0: {check.query})" if red
                       else f"guard {check.name} unreadable three times running: {error}")
                workflow.logger.warning("drill stopped by its guard", extra={"reason": why})
                self._abort = ControlRequest(actor=_GUARD_STEP, reason=why, undo=True)
                return
            try:
                await workflow.wait_condition(lambda: self._state != "running" or self._abort is not None,
                                              timeout=interval, timeout_summary=f"{_GUARD_STEP}: next reading")
            except TimeoutError:
                continue

    async def _read_many(self, reads: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One telemetry.read_many for the reads gathered by self._readings; its readings, in order."""
        steps = sorted({read["step"] for read in reads})
        one = reads[0] if len(reads) == 1 else None
        label = f"{one['step']}/gate/{one['gate']}" if one else f"{steps[0]}/gates" if len(steps) == 1 else "gates"
        raw = await call_action(
            self._inp.actions.get(READ_MANY_ACTION, _READ_MANY_DEFAULTS),
            {"reads": reads},
            activity_id=self._next_id(label),
            summary=f"gate readings: {', '.join(read['step'] + ' ' + read['gate'] for read in reads)}",
            tag=ActivityTag("gate", steps[0] if len(steps) == 1 else None, gate=one["gate"] if one else None,
                            percent=one["percent"] if one else None),
            **self._reading_route(),
        )
        return raw["readings"]

    @staticmethod
    def _reading_route() -> dict[str, Any]:
        # Readings have a queue of their own: a flood of them in the run's queue would slow every run's steps.
        return {"task_queue": readings_queue(workflow.info().task_queue),
                "priority": Priority(priority_key=READING_PRIORITY, fairness_key=workflow.info().workflow_id)}

    def _resolved_gate(self, gate: GateSpec, ramp: dict[str, int] | None = None) -> GateSpec:
        # A ramp's gates may name ${{ ramp.percent }} (e.g. to read only once clients see this step).
        return GateSpec.model_validate(self._resolve(gate.model_dump(by_alias=True), **({"ramp": ramp} if ramp else {})))

    @staticmethod
    def _ramp_context(percent: int, previous: int) -> dict[str, int]:
        return {"percent": percent, "previous": previous}

    async def _gate(self, step_id: str, gate: GateSpec, name: str, percent: int | None = None,
                    ramp: dict[str, int] | None = None) -> None:
        gate = self._resolved_gate(gate, ramp)
        state = self._steps[step_id]
        deadline = workflow.now() + gate.timeout
        state.gate_gives_up_at = deadline  # for the views: how long the gate has left
        streak = 0
        streak_since = None
        not_before = None
        while True:
            reading = await self._read(step_id, gate, name, percent, not_before)
            _keep_reading(state, reading)
            if reading.passed:
                streak += 1
                streak_since = streak_since or reading.at
                baked = gate.bake is None or reading.at - streak_since >= gate.bake
                if streak >= gate.consecutive and baked:
                    state.gate_gives_up_at = None
                    return
            else:
                streak, streak_since = 0, None
            if workflow.now() + gate.interval > deadline:
                last = reading.error or f"last value {reading.value:g}" if reading.value is not None else reading.error
                need = f"{gate.consecutive} consecutive" + (f" over {format_duration(gate.bake)}" if gate.bake else "")
                state.gate_gives_up_at = None
                raise StepFailed(
                    f"gate {name}: {gate.query or gate.endpoint} {gate.comparator} {gate.threshold:g} "
                    f"not held ({need}) within {format_duration(gate.timeout)} ({last or 'no value'})"
                )
            if self._waited_in_reading(gate.interval):
                not_before = workflow.now() + gate.interval  # waited by the reading's activity
            else:
                await self._readings.tick(gate.interval, timer_summary(step_id, f"gate {name} and any due with it: next reading"))

    @staticmethod
    def _waited_in_reading(interval: timedelta) -> bool:
        """Whether the next reading's activity waits the interval, rather than a timer: a timer and the
        workflow task it wakes are five history events a reading."""
        return interval <= WAITED_IN_READING

    async def _approval(self, step_id: str, spec: ApprovalSpec, percent: int | None = None,
                        acts: str | None = None) -> ApprovalRecord:
        state = self._steps[step_id]
        previous = state.status
        prompt = self._resolve(spec.prompt) if spec.prompt else ""
        state.status = "awaiting_approval"
        state.awaiting = str(prompt) or f"approve step {step_id}"
        if percent is not None:
            state.awaiting = f"{state.awaiting} (ramp to {percent}%)"
        if acts is not None:
            state.awaiting = f"{state.awaiting}; {acts}"
        self._awaiting[step_id] = spec
        self._asks += 1
        self._publish(step_id)
        workflow.set_current_details(self._details(self._specs[step_id]))
        try:
            await self._await_approval(step_id, spec)
        except TimeoutError:
            self._awaiting.pop(step_id, None)
            state.awaiting = None
            state.status = previous
            assert spec.timeout is not None  # only an approval with a timeout times out
            raise StepFailed(f"approval of {step_id} timed out after {format_duration(spec.timeout)}") from None
        self._awaiting.pop(step_id, None)
        state.awaiting = None
        if self._abort is not None:
            state.status = "aborted"
            raise RunAborted()
        record = self._granted.pop(step_id)
        record.percent = percent
        state.add_approval(record)
        state.status = "running"
        self._publish(step_id)
        return record

    async def _await_approval(self, step_id: str, spec: ApprovalSpec) -> None:
        """Wait for the approval (or an abort); TimeoutError once the approval's own timeout passes."""
        decided = lambda: step_id in self._granted or self._abort is not None
        deadline = f"{step_id}: approval deadline"
        # The timers beside the wait show how to approve on the Web UI's first page.
        notes = asyncio.create_task(self._show_notes(self._approval_notes(step_id, spec)))
        try:
            await workflow.wait_condition(decided, timeout=spec.timeout, timeout_summary=deadline)
        finally:
            notes.cancel()

    @staticmethod
    async def _show_notes(lines: list[str]) -> None:
        """A timer per line, renewed until canceled: the Web UI's timeline shows a pending timer's summary."""
        while True:
            # Started last line first: the timeline lists the newest first, so the lines read top down.
            await asyncio.gather(*(workflow.sleep(NOTES_RENEWED_EVERY, summary=line) for line in reversed(lines)))

    async def _ramp(self, step: RampStep, state: StepState) -> dict[str, Any]:
        spec = step.ramp
        if spec.adaptive is not None:
            return await self._adaptive_ramp(step, state, spec.adaptive)
        action = self._inp.actions[spec.action]
        last_good = state.last_good if state.last_good is not None else spec.baseline
        for percent in [p for p in spec.schedule() if p > last_good]:
            try:
                await self._ramp_to(step, state, action, percent, last_good)
            except StepFailed as exc:
                fallback = await self._confirm_fallback(step, last_good, percent)
                raise StepFailed(f"at {percent}%: {exc}; stepped back to {last_good}%{fallback}") from None
            last_good = percent
            state.last_good = percent
        return {"percent": last_good}

    async def _ramp_to(self, step: RampStep, state: StepState, action: ActionDefaults, percent: int,
                       last_good: int, *, trend: bool = False) -> datetime:
        """One ramp step: approval if asked, set `percent`, bake, then every gate. A gate that fails sets the
        ramp back to `last_good` and raises its StepFailed. Returns when `percent` was set.

        trend: read every gate once as the bake starts too (an adaptive ramp's), so the policy sees each gate's
        move over the bake, not one reading after it; those readings decide nothing themselves."""
        spec = step.ramp
        await self._checkpoint()
        if spec.approval is not None:
            try:
                args = resolve(spec.with_, self._context(ramp={"percent": percent, "previous": last_good}))
                acts = f"then {spec.action} runs with {_shown(args)}"
            except RefError:
                acts = None
            await self._approval(step.id, spec.approval, percent=percent, acts=acts)
        set_at = workflow.now()
        await self._ramp_set(step, action, percent, last_good)
        state.percent = percent
        self._publish(step.id)
        workflow.set_current_details(self._details(step))
        # Read while the bake runs, not before it: the bake is the wait, the reading must not lengthen it.
        starting = asyncio.ensure_future(self._read_every_gate(step, state, percent, last_good)) if trend else None
        await self._sleep(spec.bake, timer_summary(step.id, f"bake at {percent}%"))
        if starting is not None:
            await starting
        try:
            context = self._ramp_context(percent, last_good)
            for gate, name in _named_gates(spec.gates):
                await self._gate(step.id, gate, name, percent, ramp=context)
        except StepFailed:
            await self._ramp_set(step, action, last_good, percent, after="gate-failed")
            state.percent = last_good
            raise
        return set_at

    async def _adaptive_ramp(self, step: RampStep, state: StepState, policy: AdaptiveSpec) -> dict[str, Any]:
        """A ramp whose every next step comes from the gates' headroom at the last one (workflows/ramp_policy.py);
        each decision is kept on the step with the headroom that drove it."""
        spec = step.ramp
        action = self._inp.actions[spec.action]
        last_good = state.last_good if state.last_good is not None else spec.baseline
        size = spec.step
        percent = spec.start if last_good < spec.start else min(spec.stop, last_good + size)
        backoffs = holds = 0
        while True:
            try:
                set_at = await self._ramp_to(step, state, action, percent, last_good, trend=True)
            except StepFailed as exc:
                smaller = max(policy.min_step, int(size * policy.backoff))
                if backoffs >= policy.max_backoffs or smaller >= size:
                    fallback = await self._confirm_fallback(step, last_good, percent)
                    raise StepFailed(f"at {percent}%: {exc}; stepped back to {last_good}%{fallback}") from None
                backoffs += 1
                retry_at = min(spec.stop, last_good + smaller)
                state.add_ramp_decision(RampDecision(
                    at=percent, next=retry_at, step=smaller,
                    reason=f"a gate failed at {percent}%: back to {last_good}%, step {size} -> {smaller} "
                           f"(back-off {backoffs} of {policy.max_backoffs}); {exc}"[:400]))
                size, percent = smaller, retry_at
                await self._sleep(spec.bake, timer_summary(step.id, f"settle at {last_good}% after a step-back"))
                continue
            last_good = percent
            state.last_good = percent
            if percent >= spec.stop:
                return {"percent": last_good}
            here: dict[str, list[GateReading]] = {}
            for reading in state.readings:
                if reading.percent == percent and reading.at >= set_at:
                    here.setdefault(reading.gate, []).append(reading)
            decision = decide_next_step(policy, at=percent, stop=spec.stop, step=size, readings=here,
                                        took=workflow.now() - set_at, may_hold=holds < policy.max_holds)
            while decision.next == percent:
                state.add_ramp_decision(decision)
                holds += 1
                here = await self._hold_readings(step, state, percent, last_good)
                decision = decide_next_step(policy, at=percent, stop=spec.stop, step=decision.step, readings=here,
                                            took=workflow.now() - set_at, may_hold=holds < policy.max_holds)
            holds = 0
            state.add_ramp_decision(decision)
            size, percent = decision.step, decision.next

    async def _hold_readings(self, step: RampStep, state: StepState, percent: int,
                             previous: int) -> dict[str, list[GateReading]]:
        """A hold: each gate read now and again after a bake, so the next decision sees the trend over the bake.
        A gate failing at the end is waited for as at any step (its timeout fails the step): a ramp never moves
        on from a percentage whose gates do not pass."""
        here: dict[str, list[GateReading]] = {}
        await self._read_every_gate(step, state, percent, previous, here)
        await self._sleep(step.ramp.bake, timer_summary(step.id, f"hold at {percent}%"))
        readings = await self._read_every_gate(step, state, percent, previous, here)
        context = self._ramp_context(percent, previous)
        for (gate, name), reading in zip(_named_gates(step.ramp.gates), readings, strict=True):
            if not reading.passed:
                await self._gate(step.id, gate, name, percent, ramp=context)
        return here

    async def _read_every_gate(self, step: RampStep, state: StepState, percent: int, previous: int,
                               here: dict[str, list[GateReading]] | None = None) -> list[GateReading]:
        """Each of the ramp's gates read once, at the same time, kept on the step (and added to `here`)."""
        context = self._ramp_context(percent, previous)
        readings = await asyncio.gather(*(
            self._read(step.id, self._resolved_gate(gate, context), name, percent)
            for gate, name in _named_gates(step.ramp.gates)))
        for reading in readings:
            _keep_reading(state, reading)
            if here is not None:
                here.setdefault(reading.gate, []).append(reading)
        self._publish(step.id)
        return list(readings)

    async def _confirm_fallback(self, step: RampStep, percent: int, failed: int) -> str:
        """One reading of each gate after stepping back, so the operator sees whether the fallback is healthy."""
        failing = []
        context = self._ramp_context(percent, failed)
        for gate, name in _named_gates(step.ramp.gates):
            resolved = self._resolved_gate(gate, context)
            reading = await self._read(step.id, resolved, name, percent)
            _keep_reading(self._steps[step.id], reading)
            if not reading.passed:
                failing.append(name)
        return f" (gates at {percent}%: " + (f"still failing: {', '.join(failing)})" if failing else "passing)")

    async def _ramp_set(self, step: RampStep, action: ActionDefaults, percent: int, previous: int,
                        after: str | None = None) -> None:
        args = self._resolve(step.ramp.with_, ramp={"percent": percent, "previous": previous})
        await execute_action(
            action,
            args,
            activity_id=self._next_id(f"{step.id}@{percent}"),
            summary=f"{step.id}: {action.name} to {percent}% (from {previous}%)",
            tag=ActivityTag("ramp", step.id, percent=percent, after=after),
        )

    async def _for_each(self, step: ForEachStep, state: StepState) -> dict[str, Any]:
        spec = step.for_each
        items = self._resolve(spec.items)
        if not isinstance(items, list):
            raise StepFailed(f"for_each items of {step.id} resolved to {type(items).__name__}, not a list")
        fan_out = FanOutInput(
            step_id=step.id,
            spec=spec,
            items=items,
            context=referenced(self._context(), spec.with_),
            action=self._inp.actions[spec.action],
            attempt=state.attempts,
        )
        if len(items) > FANOUT_CHILD_THRESHOLD:
            # Batches of children, each with a bounded history and result; per-item outputs only when read later.
            fan_out.keep_results = reads_results(self._inp.runbook.steps, step.id)
            fan_out.spec = spec.model_copy(update={"items": []})  # inline items travel once, as the batch's items
            result = await run_in_batches(fan_out, lambda batch, number: self._fan_out_batch(step, state, batch, number))
        else:
            result = await run_fan_out(fan_out)
        allowed = spec.allowed_failures(len(items))
        outputs = result.model_dump(mode="json", exclude={name for name in ("results", "results_missing")
                                                          if getattr(result, name) is None})
        state.outputs = shown_outputs(outputs)
        if result.failed > allowed:
            raise StepFailed(
                f"{result.failed} of {result.total} items failed, more than the {allowed} allowed: "
                + "; ".join(result.failures[:3])
            )
        return outputs

    async def _fan_out_batch(self, step: ForEachStep, state: StepState, batch: FanOutInput, number: int) -> FanOutResult:
        last = batch.offset + len(batch.items) - 1
        return await self._fan_out_child(batch, f"{workflow.info().workflow_id}/{step.id}/{state.attempts}/{number}",
                                         f"{step.id}: {step.for_each.action} on items {batch.offset}-{last}")

    async def _fan_out_child(self, fan_out: FanOutInput, child_id: str, summary: str) -> FanOutResult:
        info = workflow.info()
        # The child runs only this batch, only as this run's child: sealed for its id and this run.
        sealed = await seal(fan_out, fan_out_place(child_id, info.workflow_id, info.run_id))
        try:
            return await workflow.execute_child_workflow(FanOutWorkflow.run, SealedFanOut(batch=fan_out, seal=sealed),
                                                         id=child_id, static_summary=summary)
        except ChildWorkflowError as exc:
            raise StepFailed(f"fan-out {fan_out.step_id}: {failure_message(exc)}") from None

    async def _parallel(self, step: ParallelStep, state: StepState | None = None) -> dict[str, Any]:
        outcomes = await asyncio.gather(*(self._run_step(child) for child in step.parallel), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, (RunAborted, DeadlineMissed)):
                raise outcome
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            raise StepFailed("; ".join(str(f) for f in failed))
        return {child.id: self._outputs.get(child.id, {}).get("outputs", {}) for child in step.parallel}

    # Requests arrive as raw JSON (the Web UI sends whatever was typed): parse_request turns a bad
    # field into one clear line in the validator instead of a converter error or a dropped signal.

    @workflow.update
    def approve(self, req: Any) -> ApprovalRecord:
        self._answered()
        return self._approve(parse_request(ApproveRequest, req))

    @approve.validator
    def _validate_approve(self, req: Any) -> None:
        self._check_approve(parse_request(ApproveRequest, req))

    @workflow.update
    def retry(self, req: Any) -> str:
        self._answered()
        return self._decide(parse_request(ControlRequest, req), "retry")

    @retry.validator
    def _validate_retry(self, req: Any) -> None:
        self._check_held(parse_request(ControlRequest, req), "retry")

    @workflow.update
    def skip(self, req: Any) -> str:
        self._answered()
        return self._decide(parse_request(ControlRequest, req), "skip")

    @skip.validator
    def _validate_skip(self, req: Any) -> None:
        self._check_held(parse_request(ControlRequest, req), "skip")

    @workflow.update
    def abort(self, req: Any) -> str:
        self._answered()
        return self._abort_run(parse_request(ControlRequest, req))

    @abort.validator
    def _validate_abort(self, req: Any) -> None:
        self._check_abort(parse_request(ControlRequest, req))

    @workflow.update
    def pause(self, req: Any) -> str:
        self._answered()
        return self._set_paused(parse_request(ControlRequest, req), "pause")

    @pause.validator
    def _validate_pause(self, req: Any) -> None:
        self._check_pausing(parse_request(ControlRequest, req), "pause")

    @workflow.update
    def resume(self, req: Any) -> str:
        self._answered()
        return self._set_paused(parse_request(ControlRequest, req), "resume")

    @resume.validator
    def _validate_resume(self, req: Any) -> None:
        self._check_pausing(parse_request(ControlRequest, req), "resume")

    def _answered(self) -> None:
        """Note the workflow task this Update's handler runs in (see _answers_land)."""
        self._answered_in = workflow.info().get_current_history_length()

    # Fire-and-forget twins of the Updates: same checks, a rejection is logged and kept in status.
    @workflow.signal(name="approve_signal")
    def approve_signal(self, req: Any) -> None:
        self._signal("approve", lambda: self._approve(parse_request(ApproveRequest, req)), req)

    @workflow.signal(name="retry_signal")
    def retry_signal(self, req: Any) -> None:
        self._signal("retry", lambda: self._decide(parse_request(ControlRequest, req), "retry"), req)

    @workflow.signal(name="skip_signal")
    def skip_signal(self, req: Any) -> None:
        self._signal("skip", lambda: self._decide(parse_request(ControlRequest, req), "skip"), req)

    @workflow.signal(name="abort_signal")
    def abort_signal(self, req: Any) -> None:
        self._signal("abort", lambda: self._abort_run(parse_request(ControlRequest, req)), req)

    @workflow.signal(name="pause_signal")
    def pause_signal(self, req: Any) -> None:
        self._signal("pause", lambda: self._set_paused(parse_request(ControlRequest, req), "pause"), req)

    @workflow.signal(name="resume_signal")
    def resume_signal(self, req: Any) -> None:
        self._signal("resume", lambda: self._set_paused(parse_request(ControlRequest, req), "resume"), req)

    def _signal(self, name: str, apply: Callable[[], object], req: Any) -> None:
        try:
            apply()
        except ValueError as exc:
            # A refused signal stays in the history with its token, for anyone with the Web UI to copy:
            # it is spent all the same, so it cannot be presented again in this run.
            token = req.get("identity_token") if isinstance(req, dict) else None
            if isinstance(token, str) and token:
                self._spend(token)
            # Bounded: anyone who can reach the Web UI can send signals, and a flood must not grow the run's state.
            self._rejected_signals.append(f"{name}: {exc}")
            del self._rejected_signals[:-_MAX_REJECTED_KEPT]
            workflow.logger.warning("signal rejected", extra={"signal": name, "reason": str(exc)})

    @workflow.query
    def status(self) -> RunStatus:
        running = [s.id for s in self._steps.values() if s.status in IN_PLAY]
        return self._run_status(list(self._steps.values()), running[-1] if running else None,
                                [s.id for s in self._steps.values() if s.status == "held"])

    def _run_status(self, steps: list[StepState], current_step: str | None, held: list[str]) -> RunStatus:
        """The run's status with these steps, current step and held steps (the status memo's upkeep keeps
        the last two from the steps that changed, workflows/step_changes.py)."""
        state = "paused" if self._paused and self._state == "running" else self._state
        return RunStatus(
            workflow_id=workflow.info().workflow_id,
            runbook=self._inp.runbook.metadata.name,
            target=self._inp.target_name,
            initiator=self._inp.initiator,
            drill=self._inp.drill,
            state=state,
            current_step=current_step,
            awaiting_approval=sorted(self._awaiting),
            held=held,
            started_at=self._started_at,
            ended_at=self._ended_at,
            steps=steps,
            error=self._error,
            controls=list(self._controls),
            identity_required=self._identity_required(),
            identity_source=({k: v for k, v in (("vault", identity.vault), ("provider", identity.provider),
                                                ("audience", identity.audience), ("ca_cert", identity.ca_cert)) if v}
                             if (identity := self._identity()) else {}),
            runbook_digest=self._inp.catalog.digest if self._inp.catalog else None,
            runbook_origin=self._inp.catalog.origin if self._inp.catalog else None,
            controller_version=self._inp.catalog.controller or None if self._inp.catalog else None,
            contracts_digest=self._inp.catalog.contracts or None if self._inp.catalog else None,
            approvers={step: self._may_approve(spec) for step, spec in sorted(self._awaiting.items())},
            skippers=self._skippers(),
            operators=self._operators(),
        )

    def _may_approve(self, spec: ApprovalSpec) -> list[str] | None:
        """Who may approve a step now: its approvers (None: anyone named), less the initiator under four eyes."""
        allowed = self._allowed_approvers(spec)
        if allowed is not None and self._four_eyes(spec):
            allowed = [name for name in allowed if name != self._inp.initiator]
        return allowed

    @workflow.query
    def plan(self) -> RunInput:
        return self._inp

    @workflow.query
    def rejected_signals(self) -> list[str]:
        return list(self._rejected_signals)


def _named_gates(gates: list[GateSpec]) -> list[tuple[GateSpec, str]]:
    """A ramp's gates with the names their readings carry: their own, else gateN by position."""
    return [(gate, gate.name or f"gate{g + 1}") for g, gate in enumerate(gates)]


def _keep_reading(state: StepState, reading: GateReading) -> None:
    """A step keeps its last readings only: a gate polled for hours must not grow the run's state."""
    state.add_reading(reading, _MAX_READINGS_KEPT)


def _seconds(delta: timedelta) -> str:
    return format_duration(round(delta.total_seconds(), 1))


def _clock(at: datetime) -> str:
    return at.strftime("%H:%M:%S.%f")[:-3] + "Z"


# How much of an approved action's resolved inputs the approval line shows (the status and Web UI carry it).
_SHOWN_INPUTS = 600


def _shown(args: Any) -> str:
    """An action's resolved inputs, as the approver reads them: compact JSON, cut to _SHOWN_INPUTS."""
    text = json.dumps(args, default=str, separators=(", ", ": "), sort_keys=True)
    return text if len(text) <= _SHOWN_INPUTS else text[: _SHOWN_INPUTS - 1] + "…"

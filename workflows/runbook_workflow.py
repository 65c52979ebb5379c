"""RunbookWorkflow: walks a validated runbook plan deterministically, step by step."""

from __future__ import annotations

import asyncio
import hashlib
import json
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from activities.retry import Retry
    from workflows import search
    from workflows.contract import (
        ApprovalRecord,
        ApproveRequest,
        ControlRecord,
        ControlRequest,
        FanOutInput,
        FanOutResult,
        GateReading,
        ResumeState,
        RunInput,
        RunResult,
        RunStatus,
        StepState,
        UndoRecord,
        parse_request,
    )
    from activities.oidc import IdentityKeys
    from workflows.history_tags import ActivityTag, tagged, timer_summary
    from workflows.identity import verify_identity_token
    from workflows.refs import RefError, iter_refs, resolve, split_path
    from workflows.spec import (
        ActionDefaults,
        ActionStep,
        ApprovalSpec,
        ApprovalStep,
        ForEachSpec,
        ForEachStep,
        GateSpec,
        GateStep,
        OnFailure,
        ParallelStep,
        RampStep,
        WaitStep,
    )

__all__ = ["FANOUT_CHILD_THRESHOLD", "FanOutWorkflow", "RunbookWorkflow", "READ_ACTIVITY", "compare"]

# Fan-outs larger than this run in a child workflow, so the parent's history stays small.
FANOUT_CHILD_THRESHOLD = 100
READ_ACTIVITY = "telemetry.read"
# Runs started before the loader pinned gate reads carry no defaults for them: these were theirs.
_READ_UNPINNED = ActionDefaults(name=READ_ACTIVITY, timeout=timedelta(seconds=30), retry=Retry(max_attempts=1))
IDENTITY_KEYS_ACTIVITY = "vault.identity_keys"
_MAX_READINGS_KEPT = 60
_OPERATOR_HELP = (
    "Approve from the Temporal Web UI (Send an Update) or `coldstart approve`. Update name: "
)


class StepFailed(Exception):
    def __init__(self, message: str, *, rollback: bool = False):
        super().__init__(message)
        self.rollback = rollback


class RunAborted(Exception):
    pass


def compare(value: float, comparator: str, threshold: float) -> bool:
    return {
        "<": value < threshold,
        "<=": value <= threshold,
        ">": value > threshold,
        ">=": value >= threshold,
        "==": value == threshold,
        "!=": value != threshold,
    }[comparator]


def _failure_message(exc: BaseException) -> str:
    """The innermost cause's message: what the activity itself said went wrong."""
    current: BaseException | None = exc
    message = str(exc)
    while current is not None:
        if str(current):
            message = str(current)
        current = current.__cause__
    return message


async def _execute_action(
    action: ActionDefaults,
    args: dict[str, Any],
    *,
    activity_id: str,
    summary: str,
    tag: ActivityTag,
    timeout: timedelta | None = None,
    retry: Retry | None = None,
) -> dict[str, Any]:
    try:
        with tagged(tag):
            result = await workflow.execute_activity(
                action.name,
                args,
                activity_id=activity_id,
                start_to_close_timeout=timeout or action.timeout,
                heartbeat_timeout=action.heartbeat,
                retry_policy=(retry or action.retry).policy(),
                summary=summary[:400],
            )
    except ActivityError as exc:
        raise StepFailed(f"{action.name}: {_failure_message(exc)}") from None
    if result is None:
        return {}
    return result if isinstance(result, dict) else {"value": result}


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def _referenced(context: dict[str, Any], value: Any) -> dict[str, Any]:
    """Only the parts of the context that `value` refers to: a fan-out's input stays small
    (otherwise a list of 1,000 items would travel twice, once as items and once inside params)."""
    kept: dict[str, Any] = {}
    for ref in iter_refs(value):
        parts = split_path(ref)
        root = parts[0]
        if root not in context:
            continue
        if len(parts) > 1 and isinstance(context[root], dict) and root in ("params", "steps", "target"):
            name = parts[1]
            if name in context[root]:
                kept.setdefault(root, {})[name] = context[root][name]
        else:
            kept[root] = context[root]
    return kept


async def run_fan_out(inp: FanOutInput) -> FanOutResult:
    """Run one action per item with bounded concurrency; stop launching once the threshold is exceeded."""
    spec: ForEachSpec = inp.spec
    allowed = spec.allowed_failures(len(inp.items))
    limiter = asyncio.Semaphore(spec.max_concurrency)
    results: list[Any] = [None] * len(inp.items)
    failures: list[str] = []
    done = 0

    async def one(index: int, item: Any) -> None:
        nonlocal done
        async with limiter:
            if len(failures) > allowed:
                return
            try:
                args = resolve(spec.with_, {**inp.context, spec.as_: item})
                results[index] = await _execute_action(
                    inp.action,
                    args,
                    activity_id=f"{inp.step_id}[{index}]#{inp.attempt}",
                    summary=f"{inp.step_id} [{index}]: {inp.action.name} {json.dumps(item, default=str)[:120]}",
                    tag=ActivityTag("fan-out", inp.step_id, item=index),
                    timeout=spec.timeout,
                )
                done += 1
            except (StepFailed, RefError) as exc:
                failures.append(f"[{index}] {json.dumps(item, default=str)[:80]}: {exc}")

    await asyncio.gather(*(one(i, item) for i, item in enumerate(inp.items)))
    return FanOutResult(
        total=len(inp.items),
        succeeded=done,
        failed=len(failures),
        failures=failures[:50],
        results=results,
    )


@workflow.defn
class FanOutWorkflow:
    """A large for_each fan-out, as a child so its activity events stay out of the parent's history."""

    @workflow.run
    async def run(self, inp: FanOutInput) -> FanOutResult:
        return await run_fan_out(inp)


def _metrics_step(runbook: str, step: str, outcome: str | None) -> None:
    """Worker metrics for infra's rules (replay-safe: the SDK drops them during replay)."""
    meter = workflow.metric_meter()
    labels = {"runbook": runbook, "step": step}
    meter.create_gauge("coldstart_step_in_progress", "1 while the step runs").set(0 if outcome else 1, labels)
    if outcome:
        meter.create_counter("coldstart_step_runs_total", "steps finished, by outcome").add(1, {**labels, "outcome": outcome})


def _metrics_gate(runbook: str, gate: str, reading: GateReading) -> None:
    meter = workflow.metric_meter()
    result = "error" if reading.error else ("pass" if reading.passed else "fail")
    labels = {"runbook": runbook, "gate": gate}
    meter.create_counter("coldstart_gate_evaluations_total", "gate readings, by result").add(1, {**labels, "result": result})
    meter.create_gauge("coldstart_gate_last_result", "1 if the gate's last reading passed").set(1 if reading.passed else 0, labels)


@workflow.defn
class RunbookWorkflow:
    """Interprets one runbook run. Operators steer it with Updates (or Signals) and read it with Queries."""

    @workflow.init
    def __init__(self, inp: RunInput) -> None:
        self._inp = inp
        self._steps: dict[str, StepState] = {}
        self._specs: dict[str, Any] = {}
        self._outputs: dict[str, dict[str, Any]] = {}
        self._undo: list[UndoRecord] = []
        self._paused = False
        self._abort: ControlRequest | None = None
        self._decisions: dict[str, str] = {}
        self._awaiting: dict[str, ApprovalSpec] = {}
        self._granted: dict[str, ApprovalRecord] = {}
        self._rejected_signals: list[str] = []
        self._state = "running"
        self._error: str | None = None
        self._ended_at = None
        self._seq = 0
        self._published: tuple[str | None, bool] | None = None
        self._identity_keys: IdentityKeys | None = None
        self._controls: list[ControlRecord] = []
        # Digests of identity tokens already used in this run: a token seen in the history is not reusable.
        self._used_tokens: list[str] = []
        self._index(inp.runbook.steps)
        if inp.resume is not None:
            self._steps.update(inp.resume.steps)
            self._undo = list(inp.resume.undo_stack)
            self._outputs = dict(inp.resume.outputs)
            self._paused = inp.resume.paused
            self._started_at = inp.resume.started_at
            self._identity_keys = inp.resume.identity_keys
            self._controls = list(inp.resume.controls)
            self._used_tokens = list(inp.resume.used_tokens)
        else:
            self._started_at = workflow.now()

    def _index(self, steps: list[Any]) -> None:
        for step in steps:
            self._specs[step.id] = step
            self._steps[step.id] = StepState(id=step.id, kind=step.kind, title=step.name or step.description)
            if isinstance(step, ParallelStep):
                self._index(step.parallel)

    # ---- run ---------------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: RunInput) -> RunResult:
        steps = inp.runbook.steps
        first = inp.resume.next_index if inp.resume else 0
        try:
            if inp.runbook.identity is not None and self._identity_keys is None:
                await self._capture_identity_keys()
            for index in range(first, len(steps)):
                if index > first and workflow.info().is_continue_as_new_suggested():
                    await self._continue_as_new(index)
                await self._run_step(steps[index])
            self._state = "succeeded"
        except RunAborted:
            self._state = "aborted"
            who = self._abort.actor if self._abort else "operator"
            self._error = f"aborted by {who}" + (f": {self._abort.reason}" if self._abort and self._abort.reason else "")
        except StepFailed as exc:
            self._error = str(exc)
            if exc.rollback:
                await self._rollback()
            else:
                self._state = "failed"
        self._ended_at = workflow.now()
        self._publish(None)
        workflow.set_current_details(self._details(None))
        await workflow.wait_condition(workflow.all_handlers_finished)
        result = RunResult(state=self._state, steps=list(self._steps.values()), error=self._error)
        if self._state != "succeeded":
            raise ApplicationError(
                f"runbook {inp.runbook.metadata.name} {self._state}: {self._error}",
                result.model_dump(mode="json"),
                type=f"Runbook{self._state.title().replace('_', '')}",
                non_retryable=True,
            )
        return result

    async def _continue_as_new(self, next_index: int) -> None:
        await workflow.wait_condition(workflow.all_handlers_finished)
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
        workflow.continue_as_new(self._inp.model_copy(update={"resume": resume}))

    async def _capture_identity_keys(self) -> None:
        """The keys that sign operators' identity tokens, read once so validators can check tokens offline."""
        policy = self._inp.runbook.identity
        assert policy is not None
        action = self._inp.actions[IDENTITY_KEYS_ACTIVITY]
        try:
            keys = await _execute_action(
                action,
                {"address": policy.vault},
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
        except asyncio.TimeoutError:
            return
        raise RunAborted()

    async def _run_step(self, step: Any) -> None:
        state = self._steps[step.id]
        if state.status in ("succeeded", "skipped"):
            return  # finished before a continue-as-new
        retry = step.retry or Retry()
        while True:
            await self._checkpoint()
            state.attempts += 1
            state.status = "running"
            state.error = None
            state.started_at = state.started_at or workflow.now()
            self._publish(step.id)
            workflow.set_current_details(self._details(step))
            workflow.logger.info("step started", extra={"step": step.id, "attempt": state.attempts})
            _metrics_step(self._inp.runbook.metadata.name, step.id, None)
            try:
                outputs = await self._execute(step, state)
            except StepFailed as exc:
                state.error = str(exc)
                workflow.logger.warning("step failed", extra={"step": step.id, "error": str(exc)})
                if step.on_failure == OnFailure.retry and not isinstance(step, ActionStep) and state.attempts < retry.max_attempts:
                    delay = retry.delay(state.attempts)
                    state.status = "failed"
                    await self._sleep(delay, timer_summary(step.id, f"retry in {delay}"))
                    continue
                if step.on_failure == OnFailure.hold:
                    decision = await self._hold(step, state)
                    if decision == "retry":
                        continue
                    state.status = "skipped"
                    state.ended_at = workflow.now()
                    _metrics_step(self._inp.runbook.metadata.name, step.id, "skipped")
                    self._outputs[step.id] = {"outputs": {}, "status": "skipped"}
                    return
                state.status = "failed"
                state.ended_at = workflow.now()
                _metrics_step(self._inp.runbook.metadata.name, step.id, "failed")
                raise StepFailed(f"step {step.id} failed: {exc}", rollback=step.on_failure == OnFailure.rollback) from None
            state.status = "succeeded"
            state.outputs = outputs
            state.ended_at = workflow.now()
            _metrics_step(self._inp.runbook.metadata.name, step.id, "ok")
            self._outputs[step.id] = {"outputs": outputs, "status": "succeeded"}
            self._publish(step.id)
            return

    async def _hold(self, step: Any, state: StepState) -> str:
        state.status = "held"
        state.awaiting = "operator: retry, skip or abort"
        self._publish(step.id)
        workflow.set_current_details(self._details(step))
        await workflow.wait_condition(lambda: step.id in self._decisions or self._abort is not None)
        state.awaiting = None
        if self._abort is not None:
            state.status = "aborted"
            raise RunAborted()
        return self._decisions.pop(step.id)

    async def _execute(self, step: Any, state: StepState) -> dict[str, Any]:
        run = {
            "action": self._action,
            "gate": self._gate_step,
            "approval": self._approval_step,
            "wait": self._wait_step,
            "ramp": self._ramp,
            "for_each": self._for_each,
            "parallel": self._parallel,
        }[step.kind]
        return await run(step, state)

    async def _gate_step(self, step: GateStep, state: StepState) -> dict[str, Any]:
        await self._gate(step.id, step.gate, step.gate.name or step.id)
        return {"last": state.readings[-1].value if state.readings else None}

    async def _approval_step(self, step: ApprovalStep, state: StepState) -> dict[str, Any]:
        record = await self._approval(step.id, step.approval)
        return record.model_dump(mode="json")

    async def _wait_step(self, step: WaitStep, state: StepState) -> dict[str, Any]:
        await self._sleep(step.wait, timer_summary(step.id, f"wait {step.wait}"))
        return {}

    async def _action(self, step: ActionStep, state: StepState) -> dict[str, Any]:
        action = self._inp.actions[step.action]
        args = self._resolve(step.with_)
        execution = _execute_action(
            action,
            args,
            activity_id=self._next_id(step.id),
            summary=f"{step.id}: {step.action} {json.dumps(args, default=str)[:200]}",
            tag=ActivityTag("action", step.id),
            timeout=step.timeout,
            retry=step.retry if step.on_failure == OnFailure.retry else None,
        )
        # Scheduling the action as a task reorders commands within a parallel group: runs
        # recorded before this change replay the old, direct way.
        if not workflow.patched("abortable-actions"):
            outputs = await execution
            self._remember_undo(step, action, args, outputs)
            return outputs
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
                await _execute_action(
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

    async def _read(self, step_id: str, gate: GateSpec, name: str, percent: int | None) -> GateReading:
        # The read's timeout and retries are what telemetry.read declares, pinned by the loader; its
        # single attempt means a failed read is a failed reading: the gate keeps polling and fails closed.
        action = self._inp.actions.get(READ_ACTIVITY, _READ_UNPINNED)
        try:
            with tagged(ActivityTag("gate", step_id, gate=name, percent=percent)):
                raw = await workflow.execute_activity(
                    READ_ACTIVITY,
                    {"source": gate.source, "endpoint": gate.endpoint, "query": gate.query},
                    activity_id=self._next_id(f"{step_id}/gate/{name}"),
                    start_to_close_timeout=action.timeout,
                    heartbeat_timeout=action.heartbeat,
                    retry_policy=action.retry.policy(),
                    summary=f"{step_id} gate {name}: {gate.query or gate.endpoint} {gate.comparator} {gate.threshold:g}"[:400],
                )
            value, error = raw.get("value"), raw.get("error")
        except ActivityError as exc:
            value, error = None, _failure_message(exc)
        passed = value is not None and error is None and compare(float(value), gate.comparator, gate.threshold)
        reading = GateReading(gate=name, at=workflow.now(), value=value, passed=passed, error=error, percent=percent)
        _metrics_gate(self._inp.runbook.metadata.name, name, reading)
        return reading

    def _resolved_gate(self, gate: GateSpec, ramp: dict[str, int] | None = None) -> GateSpec:
        # A ramp's gates may name ${{ ramp.percent }} (e.g. to read only once clients see this step).
        return GateSpec.model_validate(self._resolve(gate.model_dump(by_alias=True), **({"ramp": ramp} if ramp else {})))

    @staticmethod
    def _ramp_context(percent: int, previous: int) -> dict[str, int] | None:
        # Patched: before it, a ramp gate naming ${{ ramp.percent }} failed to resolve; runs in flight
        # then must replay that way.
        return {"percent": percent, "previous": previous} if workflow.patched("ramp-gate-context") else None

    async def _gate(self, step_id: str, gate: GateSpec, name: str, percent: int | None = None,
                    ramp: dict[str, int] | None = None) -> None:
        gate = self._resolved_gate(gate, ramp)
        state = self._steps[step_id]
        deadline = workflow.now() + gate.timeout
        streak = 0
        streak_since = None
        while True:
            reading = await self._read(step_id, gate, name, percent)
            state.readings.append(reading)
            del state.readings[:-_MAX_READINGS_KEPT]
            if reading.passed:
                streak += 1
                streak_since = streak_since or reading.at
                baked = gate.bake is None or reading.at - streak_since >= gate.bake
                if streak >= gate.consecutive and baked:
                    return
            else:
                streak, streak_since = 0, None
            if workflow.now() + gate.interval > deadline:
                last = reading.error or f"last value {reading.value:g}" if reading.value is not None else reading.error
                need = f"{gate.consecutive} consecutive" + (f" over {gate.bake}" if gate.bake else "")
                raise StepFailed(
                    f"gate {name}: {gate.query or gate.endpoint} {gate.comparator} {gate.threshold:g} "
                    f"not held ({need}) within {gate.timeout} ({last or 'no value'})"
                )
            await self._sleep(gate.interval, timer_summary(step_id, f"gate {name}: next reading"))

    async def _approval(self, step_id: str, spec: ApprovalSpec, percent: int | None = None) -> ApprovalRecord:
        state = self._steps[step_id]
        previous = state.status
        prompt = self._resolve(spec.prompt) if spec.prompt else ""
        state.status = "awaiting_approval"
        state.awaiting = str(prompt) or f"approve step {step_id}"
        if percent is not None:
            state.awaiting = f"{state.awaiting} (ramp to {percent}%)"
        self._awaiting[step_id] = spec
        self._publish(step_id)
        workflow.set_current_details(self._details(self._specs[step_id]))
        try:
            await workflow.wait_condition(
                lambda: step_id in self._granted or self._abort is not None,
                timeout=spec.timeout,
                timeout_summary=f"{step_id}: approval deadline",
            )
        except asyncio.TimeoutError:
            self._awaiting.pop(step_id, None)
            state.awaiting = None
            state.status = previous
            raise StepFailed(f"approval of {step_id} timed out after {spec.timeout}") from None
        self._awaiting.pop(step_id, None)
        state.awaiting = None
        if self._abort is not None:
            state.status = "aborted"
            raise RunAborted()
        record = self._granted.pop(step_id)
        record.percent = percent
        state.approvals.append(record)
        state.status = "running"
        self._publish(step_id)
        return record

    async def _ramp(self, step: RampStep, state: StepState) -> dict[str, Any]:
        spec = step.ramp
        action = self._inp.actions[spec.action]
        last_good = state.last_good if state.last_good is not None else spec.baseline
        for percent in [p for p in spec.schedule() if p > last_good]:
            await self._checkpoint()
            if spec.approval is not None:
                await self._approval(step.id, spec.approval, percent=percent)
            await self._ramp_set(step, action, percent, last_good)
            state.percent = percent
            self._publish(step.id)
            workflow.set_current_details(self._details(step))
            await self._sleep(spec.bake, timer_summary(step.id, f"bake at {percent}%"))
            try:
                context = self._ramp_context(percent, last_good)
                for g, gate in enumerate(spec.gates):
                    await self._gate(step.id, gate, gate.name or f"gate{g + 1}", percent, ramp=context)
            except StepFailed as exc:
                await self._ramp_set(step, action, last_good, percent)
                state.percent = last_good
                fallback = ""
                # Added after the first recorded histories: runs already in flight replay without it.
                if workflow.patched("ramp-confirm-step-back"):
                    fallback = await self._confirm_fallback(step, last_good, percent)
                raise StepFailed(f"at {percent}%: {exc}; stepped back to {last_good}%{fallback}") from None
            last_good = percent
            state.last_good = percent
        return {"percent": last_good}

    async def _confirm_fallback(self, step: RampStep, percent: int, failed: int) -> str:
        """One reading of each gate after stepping back, so the operator sees whether the fallback is healthy."""
        failing = []
        context = self._ramp_context(percent, failed)
        for g, gate in enumerate(step.ramp.gates):
            resolved = self._resolved_gate(gate, context)
            name = gate.name or f"gate{g + 1}"
            reading = await self._read(step.id, resolved, name, percent)
            self._steps[step.id].readings.append(reading)
            if not reading.passed:
                failing.append(name)
        return f" (gates at {percent}%: " + (f"still failing: {', '.join(failing)})" if failing else "passing)")

    async def _ramp_set(self, step: RampStep, action: ActionDefaults, percent: int, previous: int) -> None:
        args = self._resolve(step.ramp.with_, ramp={"percent": percent, "previous": previous})
        await _execute_action(
            action,
            args,
            activity_id=self._next_id(f"{step.id}@{percent}"),
            summary=f"{step.id}: {action.name} to {percent}% (from {previous}%)",
            tag=ActivityTag("ramp", step.id, percent=percent),
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
            context=_referenced(self._context(), spec.with_),
            action=self._inp.actions[spec.action],
            attempt=state.attempts,
        )
        if len(items) > FANOUT_CHILD_THRESHOLD:
            try:
                result = await workflow.execute_child_workflow(
                    FanOutWorkflow.run,
                    fan_out,
                    id=f"{workflow.info().workflow_id}/{step.id}/{state.attempts}",
                    static_summary=f"{step.id}: {spec.action} on {len(items)} items",
                )
            except ChildWorkflowError as exc:
                raise StepFailed(f"fan-out {step.id}: {_failure_message(exc)}") from None
        else:
            result = await run_fan_out(fan_out)
        allowed = spec.allowed_failures(len(items))
        outputs = result.model_dump(mode="json")
        state.outputs = outputs
        if result.failed > allowed:
            raise StepFailed(
                f"{result.failed} of {result.total} items failed, more than the {allowed} allowed: "
                + "; ".join(result.failures[:3])
            )
        return outputs

    async def _parallel(self, step: ParallelStep, state: StepState | None = None) -> dict[str, Any]:
        outcomes = await asyncio.gather(*(self._run_step(child) for child in step.parallel), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, RunAborted):
                raise outcome
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            raise StepFailed("; ".join(str(f) for f in failed))
        return {child.id: self._outputs.get(child.id, {}).get("outputs", {}) for child in step.parallel}

    # ---- visibility ------------------------------------------------------------------------

    def _publish(self, current: str | None) -> None:
        """Upsert the Web UI search attributes when they change (not on every event)."""
        awaiting = bool(self._awaiting)
        if self._published == (current, awaiting):
            return
        self._published = (current, awaiting)
        workflow.upsert_search_attributes(
            [search.CURRENT_STEP.value_set(current or self._state), search.AWAITING_APPROVAL.value_set(awaiting)]
        )

    def _details(self, step: Any) -> str:
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
            allowed = self._allowed_approvers(spec) if spec else []
            lines.append(f"Waiting for approval: {state.awaiting}")
            lines.append(
                _OPERATOR_HELP
                + "`approve`, input: "
                + f"`{self._example('approve', step=step.id, approver=allowed[0] if allowed else 'your-name', comment='checked')}`"
            )
            if allowed:
                lines.append(f"Allowed approvers: {', '.join(allowed)}")
            if spec and self._four_eyes(spec):
                lines.append(f"Four eyes: {self._inp.initiator} (who started the run) cannot approve.")
        if state.status == "held":
            lines.append(f"Held after failure: {state.error}")
            for name in ("retry", "skip", "abort"):
                lines.append(f"Update `{name}`: `{self._example(name, step=step.id, actor='your-name', reason='why')}`")
            approvers = self._inp.runbook.approvers
            lines.append(f"Skip needs an approver ({', '.join(approvers)})" if approvers else "Nobody may skip: the runbook names no approvers.")
            if state.skip_requested_by:
                lines.append(f"Skip requested by {state.skip_requested_by}; four eyes: a second approver must confirm.")
            operators = self._operators()
            if operators is not None:
                lines.append(f"Retry and abort: {', '.join(operators)}")
        return "\n\n".join(lines)

    def _allowed_approvers(self, spec: ApprovalSpec) -> list[str]:
        return list(spec.approvers if spec.approvers is not None else self._inp.runbook.approvers)

    def _four_eyes(self, spec: ApprovalSpec | None = None) -> bool:
        if spec is not None and spec.four_eyes is not None:
            return spec.four_eyes
        return self._inp.runbook.four_eyes

    def _needs_identity(self, verb: str) -> bool:
        policy = self._inp.runbook.identity
        return policy is not None and verb in policy.controls

    def _example(self, verb: str, **fields: Any) -> str:
        if self._needs_identity(verb):
            fields["identity_token"] = "<token from `coldstart identity token` or Vault>"
        return json.dumps(fields)

    # ---- operator controls -----------------------------------------------------------------
    # Each control is authorized twice over: the runbook says who may (approvers, operators, four
    # eyes) and, where it requires verified identity, a Vault-signed token says who is asking.

    def _identify(self, verb: str, name: str, token: str | None) -> tuple[str, str | None]:
        """The acting name and, with verified identity, the token's subject; ValueError otherwise."""
        if not self._needs_identity(verb):
            return name, None
        policy = self._inp.runbook.identity
        assert policy is not None
        if not token:
            raise ValueError(
                f"{verb} needs a verified identity: send identity_token, a token from Vault role "
                f"{policy.role!r} (`coldstart {verb} --vault-login` fetches one)"
            )
        if self._identity_keys is None:
            raise ValueError("the run has not captured its identity keys yet; try again in a moment")
        who = verify_identity_token(token, self._identity_keys, audience=policy.audience, now=workflow.now(),
                                    name_claim=policy.name_claim)
        if name != who.name:
            raise ValueError(f"the identity token is {who.name!r}'s, not {name!r}'s")
        if _digest(token) in self._used_tokens:
            raise ValueError("this identity token was already used in this run: fetch a new one")
        return who.name, who.subject

    def _spend(self, token: str | None) -> None:
        if token and self._inp.runbook.identity is not None:
            self._used_tokens.append(_digest(token))

    def _operators(self) -> list[str] | None:
        """Who may retry, pause, resume and abort; None when the runbook leaves it to anyone named."""
        book = self._inp.runbook
        return sorted(set(book.operators) | set(book.approvers)) if book.operators else None

    def _check_operator(self, verb: str, req: ControlRequest) -> str | None:
        name, subject = self._identify(verb, req.actor, req.identity_token)
        allowed = self._operators()
        if allowed is not None and name not in allowed:
            raise ValueError(f"{name!r} may not {verb} this run (operators: {', '.join(allowed)})")
        return subject

    def _check_approve(self, req: ApproveRequest) -> str | None:
        if req.step not in self._steps:
            raise ValueError(f"no step {req.step!r} in runbook {self._inp.runbook.metadata.name}")
        spec = self._awaiting.get(req.step)
        if spec is None or req.step in self._granted:
            raise ValueError(f"step {req.step!r} is not awaiting approval (it is {self._steps[req.step].status})")
        if not req.approver.strip():
            raise ValueError("an approval needs the approver's name")
        name, subject = self._identify("approve", req.approver, req.identity_token)
        allowed = self._allowed_approvers(spec)
        if allowed and name not in allowed:
            raise ValueError(f"{name!r} may not approve {req.step!r} (approvers: {', '.join(allowed)})")
        if self._four_eyes(spec) and name == self._inp.initiator:
            raise ValueError(f"four eyes: {name!r} started this run and cannot approve it")
        return subject

    def _held_step(self, req: ControlRequest, verb: str) -> str:
        if not req.actor.strip():
            raise ValueError(f"{verb} needs the operator's name (actor)")
        if req.step is None:
            held = [s for s, st in self._steps.items() if st.status == "held" and s not in self._decisions]
            if len(held) != 1:
                raise ValueError(f"{verb}: name the step (held: {', '.join(held) or 'none'})")
            return held[0]
        if req.step not in self._steps:
            raise ValueError(f"no step {req.step!r} in runbook {self._inp.runbook.metadata.name}")
        if self._steps[req.step].status != "held" or req.step in self._decisions:
            raise ValueError(f"step {req.step!r} is not held (it is {self._steps[req.step].status})")
        return req.step

    def _check_held(self, req: ControlRequest, verb: str) -> tuple[str, str | None]:
        """(the held step, the verified subject or None)."""
        step = self._held_step(req, verb)
        if verb != "skip":
            return step, self._check_operator(verb, req)
        # Skipping a held step (a failed health gate, most often) is the most dangerous act in a recovery.
        name, subject = self._identify("skip", req.actor, req.identity_token)
        approvers = self._inp.runbook.approvers
        if not approvers:
            raise ValueError(f"nobody may skip {step!r}: runbook {self._inp.runbook.metadata.name} names no approvers "
                             "(retry or abort instead)")
        if name not in approvers:
            raise ValueError(f"{name!r} may not skip {step!r} (approvers: {', '.join(approvers)})")
        first = self._steps[step].skip_requested_by
        if self._four_eyes() and first == name:
            raise ValueError(f"four eyes: {name!r} already asked to skip {step!r}; a second approver must confirm")
        return step, subject

    def _record(self, verb: str, step: str | None, actor: str, reason: str, subject: str | None) -> None:
        self._controls.append(ControlRecord(verb=verb, step=step, actor=actor, reason=reason,
                                            at=workflow.now(), subject=subject))
        workflow.logger.info(f"operator {verb}", extra={"step": step, "actor": actor, "subject": subject,
                                                          "reason": reason})

    def _decide(self, req: ControlRequest, verb: str) -> str:
        step, subject = self._check_held(req, verb)
        self._spend(req.identity_token)
        verified = f" (verified {subject})" if subject else ""
        state = self._steps[step]
        if verb == "skip" and self._four_eyes() and state.skip_requested_by is None:
            state.skip_requested_by = req.actor
            self._record("skip-requested", step, req.actor, req.reason, subject)
            return f"skip of {step} requested by {req.actor}{verified}; four eyes: a second approver must confirm"
        state.skip_requested_by = None
        self._decisions[step] = verb
        self._record(verb, step, req.actor, req.reason, subject)
        return f"{verb} {step} by {req.actor}{verified}"

    def _approve(self, req: ApproveRequest) -> ApprovalRecord:
        subject = self._check_approve(req)
        self._spend(req.identity_token)
        record = ApprovalRecord(step=req.step, approver=req.approver, comment=req.comment, at=workflow.now(),
                                subject=subject)
        self._granted[req.step] = record
        workflow.logger.info("approved", extra={"step": req.step, "approver": req.approver, "subject": subject})
        return record

    def _check_abort(self, req: ControlRequest) -> str | None:
        if not req.actor.strip():
            raise ValueError("abort needs the operator's name (actor)")
        if self._abort is not None:
            raise ValueError(f"already aborted by {self._abort.actor}")
        if self._state != "running":
            raise ValueError(f"the run has already {self._state}")
        return self._check_operator("abort", req)

    def _abort_run(self, req: ControlRequest) -> str:
        subject = self._check_abort(req)
        self._spend(req.identity_token)
        self._abort = req
        self._record("abort", req.step, req.actor, req.reason, subject)
        return f"abort requested by {req.actor}"

    def _check_pause(self, req: ControlRequest) -> str | None:
        if not req.actor.strip():
            raise ValueError("pause needs the operator's name (actor)")
        if self._paused:
            raise ValueError("the run is already paused")
        return self._check_operator("pause", req)

    def _pause(self, req: ControlRequest) -> str:
        subject = self._check_pause(req)
        self._spend(req.identity_token)
        self._paused = True
        self._record("pause", None, req.actor, req.reason, subject)
        workflow.set_current_details(self._details(None))
        return f"paused by {req.actor}; the current step finishes first"

    def _check_resume(self, req: ControlRequest) -> str | None:
        if not req.actor.strip():
            raise ValueError("resume needs the operator's name (actor)")
        if not self._paused:
            raise ValueError("the run is not paused")
        return self._check_operator("resume", req)

    def _resume(self, req: ControlRequest) -> str:
        subject = self._check_resume(req)
        self._spend(req.identity_token)
        self._paused = False
        self._record("resume", None, req.actor, req.reason, subject)
        return f"resumed by {req.actor}"

    # Requests arrive as raw JSON (the Web UI sends whatever was typed): parse_request turns a bad
    # field into one clear line in the validator instead of a converter error or a dropped signal.

    @workflow.update
    def approve(self, req: Any) -> ApprovalRecord:
        return self._approve(parse_request(ApproveRequest, req))

    @approve.validator
    def _validate_approve(self, req: Any) -> None:
        self._check_approve(parse_request(ApproveRequest, req))

    @workflow.update
    def retry(self, req: Any) -> str:
        return self._decide(parse_request(ControlRequest, req), "retry")

    @retry.validator
    def _validate_retry(self, req: Any) -> None:
        self._check_held(parse_request(ControlRequest, req), "retry")

    @workflow.update
    def skip(self, req: Any) -> str:
        return self._decide(parse_request(ControlRequest, req), "skip")

    @skip.validator
    def _validate_skip(self, req: Any) -> None:
        self._check_held(parse_request(ControlRequest, req), "skip")

    @workflow.update
    def abort(self, req: Any) -> str:
        return self._abort_run(parse_request(ControlRequest, req))

    @abort.validator
    def _validate_abort(self, req: Any) -> None:
        self._check_abort(parse_request(ControlRequest, req))

    @workflow.update
    def pause(self, req: Any) -> str:
        return self._pause(parse_request(ControlRequest, req))

    @pause.validator
    def _validate_pause(self, req: Any) -> None:
        self._check_pause(parse_request(ControlRequest, req))

    @workflow.update
    def resume(self, req: Any) -> str:
        return self._resume(parse_request(ControlRequest, req))

    @resume.validator
    def _validate_resume(self, req: Any) -> None:
        self._check_resume(parse_request(ControlRequest, req))

    # Fire-and-forget twins of the Updates: same checks, a rejection is logged and kept in status.
    @workflow.signal(name="approve_signal")
    def approve_signal(self, req: Any) -> None:
        self._signal("approve", lambda: self._approve(parse_request(ApproveRequest, req)))

    @workflow.signal(name="retry_signal")
    def retry_signal(self, req: Any) -> None:
        self._signal("retry", lambda: self._decide(parse_request(ControlRequest, req), "retry"))

    @workflow.signal(name="skip_signal")
    def skip_signal(self, req: Any) -> None:
        self._signal("skip", lambda: self._decide(parse_request(ControlRequest, req), "skip"))

    @workflow.signal(name="abort_signal")
    def abort_signal(self, req: Any) -> None:
        self._signal("abort", lambda: self._abort_run(parse_request(ControlRequest, req)))

    @workflow.signal(name="pause_signal")
    def pause_signal(self, req: Any) -> None:
        self._signal("pause", lambda: self._pause(parse_request(ControlRequest, req)))

    @workflow.signal(name="resume_signal")
    def resume_signal(self, req: Any) -> None:
        self._signal("resume", lambda: self._resume(parse_request(ControlRequest, req)))

    def _signal(self, name: str, apply: Any) -> None:
        try:
            apply()
        except ValueError as exc:
            self._rejected_signals.append(f"{name}: {exc}")
            workflow.logger.warning("signal rejected", extra={"signal": name, "reason": str(exc)})

    @workflow.query
    def status(self) -> RunStatus:
        running = [s.id for s in self._steps.values() if s.status in ("running", "awaiting_approval", "held")]
        state = "paused" if self._paused and self._state == "running" else self._state
        return RunStatus(
            workflow_id=workflow.info().workflow_id,
            runbook=self._inp.runbook.metadata.name,
            target=self._inp.target_name,
            initiator=self._inp.initiator,
            drill=self._inp.drill,
            state=state,
            current_step=running[-1] if running else None,
            awaiting_approval=sorted(self._awaiting),
            held=[s.id for s in self._steps.values() if s.status == "held"],
            started_at=self._started_at,
            ended_at=self._ended_at,
            steps=list(self._steps.values()),
            error=self._error,
            controls=list(self._controls),
            identity_required=list(self._inp.runbook.identity.controls) if self._inp.runbook.identity else [],
        )

    @workflow.query
    def plan(self) -> RunInput:
        return self._inp

    @workflow.query
    def rejected_signals(self) -> list[str]:
        return list(self._rejected_signals)

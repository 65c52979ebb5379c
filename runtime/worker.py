"""The coldstart worker: runs RunbookWorkflow and every action in the registry, and the gate readings at a bounded rate."""

from __future__ import annotations

import asyncio
import math
import os
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from datetime import timedelta
from types import TracebackType
from typing import Any, Self

import structlog
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.runtime import Runtime
from temporalio.service import RPCError
from temporalio.worker import Interceptor, UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.catalog import load_registry
from activities.contracts.telemetry import MAX_READS_PER_BATCH, READ_ACTIONS, READ_MANY_TIMEOUT
from activities.errors import InvalidInput
from activities.failure_bounds import FailureBoundsInterceptor
from activities.journal import ActionJournal, JournalInterceptor
from activities.registry import Registry
from activities.telemetry import pace_readings
from runtime.action_versions import catalog_build_id
from runtime.catalog import Catalog, CatalogWarmed, RunResolver
from runtime.connection import connect, web_ui_url
from runtime.deployment import deployment_build_id, deployment_config, take_place
from runtime.eviction_watch import EXIT_STUCK, watching_evictions
from runtime.notifications import Notifier
from runtime.notifications import from_environment as notifier_from_environment
from runtime.queues import deployment_name
from runtime.readiness.scheduled import ScheduledReadiness
from runtime.sealing import Sealer, SealKeys
from runtime.shedding import JOURNAL_LINES_DROPPED, worker_runtime
from runtime.step_load import StepLoad, StepLoadInterceptor
from workflows.contract import readings_queue
from workflows.fanout import FanOutWorkflow
from workflows.fleet import FleetWorkflow
from workflows.history_tags import HistoryTagInterceptor
from workflows.notices import set_event_sink
from workflows.readiness import ReadinessWorkflow
from workflows.runbook_workflow import RunbookWorkflow

# The SDK forwards an activity's heartbeats at most once per min(0.8 x its heartbeat timeout, this): with its
# default a 10 s heartbeat timeout keeps only 2 s of slack, and on a loaded machine a wait whose worker is
# alive can be handed to another. At 3 s the slack is 7 s.
HEARTBEAT_FORWARD_EVERY = timedelta(seconds=3)

__all__ = ["DEVELOPMENT_TARGETS_METRIC", "HEARTBEAT_FORWARD_EVERY", "READINGS_PER_SECOND_ENV", "READINGS_SHARE_ENV", "SANDBOXED_RUNNER", "UNSANDBOXED_RUNNER", "ControllerWorker", "build_worker", "reading_settings", "readings_in_flight", "run_until_stopped", "run_worker", "warm_up"]

log = structlog.get_logger("coldstart.worker")

# Identity tokens are verified inside Update validators: PyJWT and cryptography import submodules
# lazily at verify time, which the sandbox cannot re-import, so they pass through (pure, deterministic).
SANDBOXED_RUNNER = SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_modules("jwt", "cryptography"))
# Runs are unsandboxed in production: the SDK enters a run's sandbox once per payload in each visitor
# pass (five for an activation and its completion), a third of a gate flood's worker CPU. The tests run the same code in the
# sandbox (tests/support.worker), which fails a run reaching for the clock, randomness or I/O, and the
# replay tests hold it deterministic; FanOutWorkflow is unsandboxed either way (see its comment).
UNSANDBOXED_RUNNER = UnsandboxedWorkflowRunner()


# Every workflow type a worker runs: each is a way in for any Temporal client, held by tests/adversary.
RUN_WORKFLOWS = (RunbookWorkflow, FanOutWorkflow, FleetWorkflow, ReadinessWorkflow)

READINGS_PER_SECOND_ENV = "COLDSTART_READINGS_PER_SECOND"
# The part of that pace readings take while the worker runs steps (runtime/step_load.py).
READINGS_SHARE_ENV = "COLDSTART_READINGS_SHARE"
# A gate reads every few seconds; 10 a second per worker serves dozens of concurrent ramps (the drain
# runbook's two 0.25 s gates take 8), and caps what a flood of readings takes from the steps. On 2
# cores beside the dev server, one run's 50 parallel gates at 10 ms (read in batches)
# cost other runs' steps 1.01-1.09x at the median, 1.00-1.29x at p95; the same gates as 50 runs of one
# gate, a reading an activity, 1.30x / 1.72x: each costs the server a step's work (bench/shedding.py).
# Readings take a quarter of the pace while the worker runs steps (runtime/step_load.py).
_READINGS_PER_SECOND = 10.0
# Readings in flight wait for their slots inside their activity: at most what the slowest pace (the
# share, while steps run) takes in half of telemetry.read_many's timeout, so none times out waiting
# (8 at a quarter of 10 a second), and at least 3, so that a run's lone reading is in the worker taking
# turns with another run's batches, not in the server behind them. (Three full batches of 20 take 120 s
# at a twentieth of 10 a second, inside read_many's 180 s; a share set much lower, under steps that never
# stop, could time the last batch out, its gates reading an error that once, and going on.)
_READINGS_IN_FLIGHT = (3, 8)


class ControllerWorker:
    """The two Temporal workers of one coldstart worker: the runs and their actions on the task queue,
    and the gate readings on readings_queue(queue), rate-limited (`async with` runs both)."""

    def __init__(self, runs: Worker, readings: Worker | None) -> None:
        self.runs = runs
        self.readings = readings
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Self:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(self.runs)
            if self.readings is not None:
                await stack.enter_async_context(self.readings)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._stack.__aexit__(exc_type, exc, tb)


def build_worker(
    client: Client,
    queue: str,
    *,
    registry: Registry | None = None,
    executor: ThreadPoolExecutor | None = None,
    max_concurrent_activities: int = 100,
    journal: str | os.PathLike[str] | None = None,
    readings_per_second: float | None = None,
    readings_share: float | None = None,
    sandboxed: bool = False,
    catalog: Catalog | None = None,
    allow_development: bool = False,
    notifier: Notifier | None = None,
    interceptors: Sequence[Interceptor] = (),
    seal_keys: SealKeys | None = None,
    deployment: WorkerDeploymentVersion | None = None,
) -> ControllerWorker:
    """A worker for the runbook workflows and every registered action (sync ones on a thread pool).

    journal: append a line per action attempt to this file (activities/journal.py).
    readings_per_second: the gate readings this worker takes a second ($COLDSTART_READINGS_PER_SECOND,
    else 10); beyond it they wait in the server, fairly per run, and every other task goes first.
    readings_share: the part of that pace readings take for a second after a step's activity started
    or ended ($COLDSTART_READINGS_SHARE, else 0.25).
    sandboxed: run the workflows in Temporal's sandbox (the tests do; production does not, see UNSANDBOXED_RUNNER).
    catalog: the runbooks and targets this worker runs (runtime/catalog.py; default $COLDSTART_CATALOG and
    $COLDSTART_TARGETS, else runbooks/ and targets/): every new run is resolved against it first.
    allow_development: targets marked `development: true` run the starter's own runbooks (`--allow-development`;
    a given catalog must say the same); the worker's metrics say so (coldstart_worker_development_targets).
    notifier: where the runs' events go (runtime/notifications.py; one per process, never awaited by a step).
    interceptors: more of them for the runs' worker, innermost (a test's seam into its workflow tasks).
    seal_keys: the keys that seal and verify what runs hand on (runtime/sealing.py; default $COLDSTART_SEAL_KEYS).
    deployment: poll as this Worker Deployment version, every run PINNED to it (runtime/deployment.py); without
    it the worker is unversioned and reports the catalog's build id only."""
    if notifier is not None:
        set_event_sink(notifier.offer)
    registry = registry or load_registry()
    catalog = catalog or Catalog.from_environment(allow_development=allow_development)
    if catalog.allow_development != allow_development:
        # One setting, so what the worker says (its start line, its metrics) is what its catalog does.
        raise ValueError(f"the catalog {'allows' if catalog.allow_development else 'does not allow'} development "
                         f"targets, the worker was built with allow_development={allow_development}")
    _report_development(client, queue, allow_development)
    resolver = RunResolver(catalog, registry)
    readiness = ScheduledReadiness(catalog, registry)
    sealer = Sealer(seal_keys or SealKeys.from_environment())
    # Outermost: a failure is cut to size after every other interceptor has seen it whole.
    chain: list[Interceptor] = [FailureBoundsInterceptor(), HistoryTagInterceptor()]
    if journal:
        mutating = {name: spec.mutating for name, spec in registry.specs.items()}
        chain.append(JournalInterceptor(ActionJournal(
            journal, mutating=mutating, on_drop=lambda: JOURNAL_LINES_DROPPED.add("write_failed"))))
    rate, share = reading_settings()
    load = StepLoad(share=readings_share or share)
    # Reported with every poll: `coldstart readiness` compares it with its own catalog's.
    versioning: dict[str, Any] = ({"deployment_config": deployment_config(deployment)} if deployment
                                  else {"build_id": catalog_build_id(registry)})
    runs = Worker(
        client,
        task_queue=queue,
        workflows=list(RUN_WORKFLOWS),
        # telemetry.read is here too: a runbook's action step may call it (gates read on the readings queue).
        activities=[*registry.activities(), resolver.resolve, readiness.check, sealer.seal, sealer.verify],
        activity_executor=executor or ThreadPoolExecutor(max_workers=max_concurrent_activities),
        max_concurrent_activities=max_concurrent_activities,
        interceptors=[*chain, StepLoadInterceptor(load), *interceptors],
        workflow_runner=SANDBOXED_RUNNER if sandboxed else UNSANDBOXED_RUNNER,
        **versioning,
        max_heartbeat_throttle_interval=HEARTBEAT_FORWARD_EVERY,
    )
    rate = readings_per_second or rate
    # Each reading, alone or in a batch, takes a slot of this worker's pace, given to runs in turn, and
    # a quarter of it while the worker runs steps; the activities themselves are also limited to `rate`
    # a second, so single reads wait in the server.
    pace_readings(rate, queue, readings_queue(queue), share=load.share, slowed=load.slowed)
    reading_activities = [registry.implementation(name) for name in READ_ACTIONS if name in registry.specs]
    readings = None if not reading_activities else Worker(
        client,
        task_queue=readings_queue(queue),
        activities=reading_activities,
        max_concurrent_activities=readings_in_flight(rate, load.slowest_share),
        max_activities_per_second=rate,
        interceptors=chain,
        **versioning,
        max_heartbeat_throttle_interval=HEARTBEAT_FORWARD_EVERY,
    )
    return ControllerWorker(runs, readings)


DEVELOPMENT_TARGETS_METRIC = "coldstart_worker_development_targets"


def _report_development(client: Client, queue: str, allowed: bool) -> None:
    """The gauge on the client's metrics endpoint: 1 while this worker runs development targets, else 0."""
    runtime = client.service_client.config.runtime or Runtime.default()
    runtime.metric_meter.create_gauge(
        DEVELOPMENT_TARGETS_METRIC,
        "1 if the worker was started with --allow-development: targets marked development: true run the "
        "starter's own runbooks",
    ).set(1 if allowed else 0, {"task_queue": queue})


def readings_in_flight(per_second: float, share: float) -> int:
    """The reading activities a worker reading `per_second` runs at once, `share` of it while steps run."""
    fits = int(per_second * share * READ_MANY_TIMEOUT.total_seconds() / 2 / MAX_READS_PER_BATCH)
    return max(_READINGS_IN_FLIGHT[0], min(_READINGS_IN_FLIGHT[1], fits))


def reading_settings(environ: Mapping[str, str] = os.environ) -> tuple[float, float]:
    """The readings' pace and their share of it while steps run, from the environment or the defaults;
    ValueError naming the variable when one is not a number in range."""
    return (_setting(environ, READINGS_PER_SECOND_ENV, _READINGS_PER_SECOND),
            _setting(environ, READINGS_SHARE_ENV, StepLoad.SHARE, at_most=1.0))


def _setting(environ: Mapping[str, str], name: str, default: float, *, at_most: float | None = None) -> float:
    """A positive number from the environment (at most `at_most`), else `default`; a clear error otherwise."""
    raw = environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and 0 < value <= (at_most if at_most is not None else value)):
        bound = f"in (0, {at_most:g}]" if at_most is not None else "above 0"
        raise ValueError(f"${name} must be a number {bound}, not {raw!r}")
    return value


def warm_up(catalog: Catalog, registry: Registry) -> CatalogWarmed:
    """Before the first poll: parse the catalog's runbooks and inventories and build every action's models.

    Otherwise a worker's first run pays for them in its resolution and first steps (the models are built on
    first use, to keep them off the CLI's start): 0.6 s of a drain's first run on a loaded machine, against
    0.04 s for the runs after it. Returns what the catalog parsed, and the targets it refuses."""
    warmed = catalog.warm()
    registry.build_models()
    return warmed


STUCK_GRACE = timedelta(seconds=10)


async def run_worker(queue: str, metrics_address: str | None, journal: str | None = None, *,
                     allow_development: bool = False, deployment: str | None = None, versioned: bool = True,
                     make_current: bool = False) -> bool:
    """Connect, run until SIGINT or SIGTERM, then finish in-flight tasks. Returns True when it stopped cleanly
    (False: a run could not be evicted, see run_until_stopped). allow_development: see build_worker.

    versioned: poll as version `deployment_build_id` of Worker Deployment `deployment` (default
    deployment_name(queue)), the runs PINNED to it; the first version of a deployment becomes current, another
    only with `make_current` or `coldstart worker promote` (runtime/deployment.py)."""
    try:
        telemetry = worker_runtime(metrics_address)
    except ValueError as exc:  # the Prometheus exporter's port: Core says only "Address already in use"
        raise InvalidInput(f"the worker's metrics cannot listen on {metrics_address}: {exc}; choose another "
                           "address with --metrics, COLDSTART_METRICS or [worker] metrics ('' turns them off)") from None
    client = await connect(runtime=telemetry)
    catalog, registry = Catalog.from_environment(allow_development=allow_development), load_registry()
    version = (WorkerDeploymentVersion(deployment or deployment_name(queue), deployment_build_id(registry))
               if versioned else None)
    warmed = await asyncio.to_thread(warm_up, catalog, registry)
    for target, why in warmed.targets_refused.items():
        log.warning("target refused by the catalog", target=target, reason=why)
    if warmed.development and not allow_development:
        log.warning("targets marked development: true run catalogued runbooks only: the worker was not started "
                    "with --allow-development", targets=warmed.development)
    # Read (made, on a first start) before the first poll: a worker whose keys cannot be used never starts.
    seal_keys = SealKeys.from_environment()
    notifier = notifier_from_environment(link=lambda workflow_id: web_ui_url(client, workflow_id))
    worker = build_worker(client, queue, registry=registry, journal=journal, catalog=catalog, notifier=notifier,
                          allow_development=allow_development, seal_keys=seal_keys, deployment=version)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    async def started() -> None:
        # Once polling (the server knows a version by its pollers): its place decides which runs it takes.
        place = None
        if version is not None:
            try:
                place = (await take_place(client, version, make_current=make_current,
                                          identity=client.identity)).describe()
            except RPCError as exc:
                place = f"unknown: {exc.message}"
                log.error("the worker's deployment version could not be made current: new runs may wait",
                          deployment=version.deployment_name, build_id=version.build_id, error=exc.message)
        log.info("worker started", temporal=client.service_client.config.target_host, namespace=client.namespace,
                 task_queue=queue, metrics=metrics_address, actions=len(registry.names()),
                 namespaces=sorted({name.partition(".")[0] for name in registry.names()}), journal=journal,
                 pid=os.getpid(), catalog=str(catalog.runbooks_dir), targets=str(catalog.targets_dir),
                 runbooks=warmed.runbooks, targets_read=warmed.targets_parsed,
                 allow_development=allow_development, development_targets=warmed.development if allow_development else [],
                 seal_keys=str(seal_keys.path), sealing_key=seal_keys.current,
                 notify=[f"{s.name} ({s.kind})" for s in notifier.config.sinks] if notifier else None,
                 deployment=version.deployment_name if version else None,
                 build_id=version.build_id if version else catalog_build_id(registry), version=place)

    clean = await run_until_stopped(worker, stop, started=started)
    if notifier is not None:
        set_event_sink(None)
        await asyncio.to_thread(notifier.close)
    log.info("worker stopped")
    return clean


async def run_until_stopped(worker: ControllerWorker, stop: asyncio.Event, *, grace: timedelta = STUCK_GRACE,
                            started: Callable[[], Awaitable[None] | None] | None = None) -> bool:
    """Run `worker` until `stop` is set, then finish in-flight tasks; True when it stopped cleanly.

    A run the SDK cannot evict (runtime/eviction_watch.py) sets `stop` too: that run makes no progress in
    this worker and holds its shutdown, so the worker stops polling, gives in-flight activities `grace` to
    finish and leaves the process with EXIT_STUCK, for its supervisor to start it again. The run resumes by
    replay in the new process, as after any crash."""
    loop = asyncio.get_running_loop()

    def on_stuck(message: str) -> None:
        log.error("a run cannot be evicted from this worker: stopping it, for its supervisor to start again",
                  sdk=message, exit_code=EXIT_STUCK, grace_s=grace.total_seconds())
        loop.call_soon_threadsafe(stop.set)

    with watching_evictions(on_stuck) as watch:
        async with worker:
            if started is not None:
                ready = started()
                if ready is not None:
                    await ready
            await stop.wait()
            log.info("worker stopping: finishing in-flight tasks")
            if watch.stuck is not None:
                # The SDK's shutdown waits for the eviction, which never ends: leave after the grace.
                from runtime.serve import leave

                loop.call_later(grace.total_seconds(), leave, EXIT_STUCK)
    return watch.stuck is None

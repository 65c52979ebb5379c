"""Alert-triggered runs: an Alertmanager webhook receiver that starts allow-listed runbooks on their targets."""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import ssl
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client import Counter as PromCounter
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from activities.errors import LocatedErrors, Unavailable
from activities.strict import StrictModel
from workflows.loader import LocatedSource, RunbookInvalid, locate_pydantic_errors, parse_located_yaml, plan_run
from workflows.names import TargetName
from workflows.yaml_safety import YamlRefused, load_file, read_text

__all__ = [
    "MAX_ALERTS",
    "MAX_BODY_BYTES",
    "RECEIVER",
    "START_TIMEOUT_SECONDS",
    "Alert",
    "AlertmanagerPayload",
    "Planner",
    "Starter",
    "TemporalStarter",
    "TemporalUnavailable",
    "Trigger",
    "TriggersFile",
    "TriggersInvalid",
    "check",
    "create_app",
    "default_planner",
    "load_triggers",
    "read_token",
    "render_params",
    "serve",
    "temporal_starter",
    "warm_up",
]

MAX_BODY_BYTES = 1 << 20  # a webhook body over 1 MiB is refused (413) before it is parsed
# Alerts in one notification: each may plan and start a run at once, so a larger one is refused whole (413)
# before any is acted on. Alertmanager groups the lab's alerts by host: one alert a notification.
MAX_ALERTS = 100
START_TIMEOUT_SECONDS = 10.0  # a start that takes longer is answered 503, so Alertmanager retries
_HANDLED_MAX = 10_000  # firings remembered, oldest forgotten first
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_TEMPLATE = re.compile(r"\{\{\s*(labels|annotations)\.(" + _NAME + r")\s*\}\}")
_BEARER = re.compile(r"^Bearer[ \t]+(\S+)[ \t]*$", re.IGNORECASE)
_log = structlog.get_logger("coldstart.triggers")

# What a planner gets and gives: the runbook file, templated params, the target's inventory name and
# the initiator; a RunInput (workflows.contract), or RunbookInvalid / an inventory error.
Planner = Callable[..., Any]
# Starts a planned run; returns the workflow id. Raises runtime.runs.TargetBusy when the target already has a
# run, TemporalUnavailable (or ConnectionError, OSError, TimeoutError) when Temporal cannot be reached.
Starter = Callable[[Any], Awaitable[str]]


class TriggersInvalid(LocatedErrors):
    """A triggers file that cannot be used; every problem one `file:line:col: message` line."""


class TemporalUnavailable(Unavailable):
    """Temporal could not be reached to start a run: answered 503 so Alertmanager retries."""


class Trigger(StrictModel):
    """One allow-listed alert and the run it starts."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="names the trigger; initiator alertmanager:<name>")
    alertname: str = Field(min_length=1, description="the alert's alertname label, exactly")
    match: dict[str, str] = Field(default_factory=dict, description="further labels the alert must carry with these values")
    runbook: Path = Field(description="the runbook file, relative to the working directory of `coldstart triggers`")
    target: TargetName = Field(description="inventory name (targets/<name>.yaml)")
    params: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="runbook parameters; in strings only {{ labels.NAME }} and {{ annotations.NAME }} are replaced",
    )

    @field_validator("params")
    @classmethod
    def _templates(cls, params: dict[str, Any]) -> dict[str, Any]:
        for name, value in params.items():
            if isinstance(value, str):
                rest = _TEMPLATE.sub("", value)
                if "{{" in rest or "}}" in rest:
                    raise ValueError(f"parameter {name!r}: only {{{{ labels.NAME }}}} and {{{{ annotations.NAME }}}} "
                                     f"may be templated, got {value!r}")
        return params


class TriggersFile(StrictModel):
    """A triggers file: which alerts start which runbooks."""

    version: Literal[1] = 1
    triggers: list[Trigger] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> TriggersFile:
        seen = Counter(t.name for t in self.triggers)
        twice = sorted(n for n, c in seen.items() if c > 1)
        if twice:
            raise ValueError(f"trigger names must be unique: {', '.join(twice)}")
        return self


class Alert(BaseModel):
    """One alert of an Alertmanager webhook notification (other fields are kept, unused)."""

    model_config = ConfigDict(extra="allow")

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str | None = None  # Alertmanager's name
    fingerprint: str | None = None


class AlertmanagerPayload(BaseModel):
    """Alertmanager's webhook body, version 4."""

    model_config = ConfigDict(extra="allow")

    version: Literal["4"]
    status: str
    alerts: list[Alert]
    groupKey: str | None = None  # Alertmanager's name
    receiver: str | None = None


# ---- the triggers file ----------------------------------------------------------------------------
def load_triggers(path: str | Path) -> TriggersFile:
    """Read a triggers file with the guarded YAML reader; raises TriggersInvalid with located lines."""
    file = str(path)
    try:
        data = load_file(file)
    except YamlRefused as exc:
        raise TriggersInvalid([exc.located(file)]) from None
    except OSError as exc:
        raise TriggersInvalid([f"{file}:1:1: cannot read: {exc.strerror or exc}"]) from None
    if not isinstance(data, dict):
        raise TriggersInvalid([f"{file}:1:1: a triggers file is a mapping with version and triggers"])
    try:
        return TriggersFile.model_validate(data)
    except ValidationError as exc:
        source = _source(file)
        locate_pydantic_errors(exc, source, (), data)
        raise TriggersInvalid(source.formatted()) from None


def _source(file: str) -> LocatedSource:
    """The file's positions, walked only when a problem has to be located."""
    source = LocatedSource(file=file)
    parse_located_yaml(read_text(file), source)
    return source


def check(config_path: str | Path, *, registry: Any = None) -> TriggersFile:
    """Validate a triggers file and every runbook it names (as `coldstart validate` does); TriggersInvalid if not."""
    config = load_triggers(config_path)
    if registry is None:
        from activities.catalog import load_registry

        registry = load_registry()
    source: LocatedSource | None = None
    errors: list[str] = []
    for index, trigger in enumerate(config.triggers):
        where = ("triggers", index)
        if not trigger.runbook.is_file():
            source = source or _source(str(config_path))
            source.error(where + ("runbook",), f"triggers[{index}].runbook: no runbook file {str(trigger.runbook)!r} "
                                               f"(relative to the working directory {Path.cwd()})")
            continue
        try:
            planned = plan_run(trigger.runbook, registry=registry, placeholders=True)
        except RunbookInvalid as exc:
            errors.extend(exc.errors)
            continue
        declared = planned.runbook.params
        for name in trigger.params:
            if name not in declared:
                source = source or _source(str(config_path))
                source.error(where + ("params", name), f"triggers[{index}].params: {trigger.runbook} declares no "
                                                       f"parameter {name!r} (declared: {', '.join(declared) or 'none'})",
                             key=True)
        for name, param in declared.items():
            if param.default is None and name not in trigger.params:
                source = source or _source(str(config_path))
                source.error(where + ("params",), f"triggers[{index}].params: {trigger.runbook} needs parameter "
                                                  f"{name!r} (it has no default)")
    lines = (source.formatted() if source else []) + errors
    if lines:
        raise TriggersInvalid(lines)
    return config


def read_token(path: str | Path) -> str:
    """The bearer token Alertmanager sends (its credentials_file): the file's text, stripped."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the token file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not token or any(c.isspace() for c in token):
        raise ValueError(f"the token file {path} must hold one token (no whitespace inside), it holds {len(token)} characters")
    return token


# ---- matching and templating ----------------------------------------------------------------------
class _Missing(Exception):
    """The alert lacks a label or annotation a template needs: it does not match the trigger."""


def _matches(trigger: Trigger, alert: Alert) -> bool:
    if alert.labels.get("alertname") != trigger.alertname:
        return False
    return all(alert.labels.get(name) == value for name, value in trigger.match.items())


def render_params(trigger: Trigger, alert: Alert) -> dict[str, Any]:
    """The trigger's params with {{ labels.X }} / {{ annotations.X }} replaced from the alert.

    Raises ValueError naming what is missing when the alert lacks one (the alert then does not match).
    """
    try:
        return {name: _render(value, alert) for name, value in trigger.params.items()}
    except _Missing as exc:
        raise ValueError(str(exc)) from None


def _render(value: Any, alert: Alert) -> Any:
    if not isinstance(value, str):
        return value

    def one(found: re.Match[str]) -> str:
        kind, name = found.group(1), found.group(2)
        values = alert.labels if kind == "labels" else alert.annotations
        if name not in values:
            raise _Missing(f"the alert has no {kind[:-1]} {name!r}")
        return values[name]

    return _TEMPLATE.sub(one, value)


# ---- Temporal and planning seams ------------------------------------------------------------------
def default_planner(targets_dir: Path, *, registry: Any = None) -> Planner:
    """plan_run on the target's inventory (targets_dir/NAME.yaml); the action registry is loaded once."""
    from workflows.loader import load_inventory

    loaded: list[Any] = [registry] if registry is not None else []

    def planner(runbook: Path, *, params: dict[str, Any], target: str, initiator: str) -> Any:
        if not loaded:
            from activities.catalog import load_registry

            loaded.append(load_registry())
        inventory = load_inventory(target, targets_dir).as_target()
        return plan_run(runbook, registry=loaded[0], params=params, inventory=inventory, targets_dir=targets_dir,
                        initiator=initiator)

    return planner


def warm_up(config: TriggersFile, targets_dir: Path, registry: Any) -> dict[str, str]:
    """What the first alert's plan would otherwise pay for: every action's models built and each trigger's
    target inventory read once (its models too). Quiet, the first drain plan took 15 ms against 4 ms for the
    next; on a loaded machine that first-use cost was part of the slowest run's start. Returns the targets
    whose inventory could not be read, with why: their alerts are still planned, and refused, when they come."""
    from workflows.loader import load_inventory

    registry.build_models()
    unreadable: dict[str, str] = {}
    for target in sorted({t.target for t in config.triggers}):
        try:
            load_inventory(target, targets_dir)
        except (OSError, ValueError) as exc:  # missing, refused (YamlRefused) or invalid, as when planning
            unreadable[target] = _first_line(exc)
    return unreadable


class TemporalStarter:
    """runtime.runs.start_run through one client (runtime.connection.connect), connected by `connect()` or on
    first use."""

    def __init__(self, task_queue: str | None = None) -> None:
        self._task_queue = task_queue
        self._client: Any = None
        self._connecting = asyncio.Lock()

    async def connect(self) -> Any:
        """The client, connected once; TemporalUnavailable when Temporal does not answer (the next call tries again)."""
        from runtime.connection import connect

        async with self._connecting:
            if self._client is None:
                try:
                    self._client = await connect()
                except Exception as exc:  # noqa: BLE001 - any failure to connect is the same answer
                    raise TemporalUnavailable(f"cannot connect to Temporal: {_first_line(exc)}") from None
        return self._client

    async def warm(self) -> bool:
        """What the first alert would otherwise wait for: the SDK's imports and the connection. Whether it
        connected; a failure is logged, and the first start tries again."""
        import runtime.runs  # noqa: F401 - imported for its cost, here rather than inside the first start

        try:
            await self.connect()
        except TemporalUnavailable as exc:
            _log.warning("trigger_temporal_unavailable_at_start", error=str(exc))
            return False
        return True

    async def __call__(self, run: Any) -> str:
        from temporalio.service import RPCError, RPCStatusCode

        from runtime.connection import task_queue as default_queue
        from runtime.runs import start_run

        client = await self.connect()
        try:
            handle = await start_run(client, run, self._task_queue or default_queue())
        except RPCError as exc:
            if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED,
                              RPCStatusCode.RESOURCE_EXHAUSTED, RPCStatusCode.CANCELLED):
                raise TemporalUnavailable(f"Temporal did not answer: {_first_line(exc)}") from None
            raise
        return handle.id


def temporal_starter(task_queue: str | None = None) -> TemporalStarter:
    """A TemporalStarter for `task_queue` (default: runtime.connection.task_queue())."""
    return TemporalStarter(task_queue)


def _age_seconds(starts_at: str) -> float | None:
    """Seconds since an alert's startsAt (RFC 3339, as Alertmanager sends it), or None when it has none."""
    try:
        began = datetime.fromisoformat(starts_at)
    except ValueError:
        return None
    if began.tzinfo is None or began.year < 2000:  # Alertmanager's zero time: no start was given
        return None
    return round(time.time() - began.timestamp(), 3)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ---- the web app ----------------------------------------------------------------------------------
class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.alerts = PromCounter("coldstart_trigger_alerts", "Alerts received, by trigger and what was done",
                                  ["trigger", "outcome"], registry=self.registry)
        self.requests = PromCounter("coldstart_trigger_requests", "Webhook requests answered, by HTTP status",
                                    ["code"], registry=self.registry)
        self.start_seconds = Histogram("coldstart_trigger_start_seconds", "Time to start a run (Temporal call)",
                                       buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                                       registry=self.registry)
        self.alert_age = Histogram("coldstart_trigger_alert_age_seconds",
                                   "From an alert's startsAt (the rule evaluation that found it firing) to its run "
                                   "started: the alert path's delivery, Alertmanager and the start",
                                   buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
                                   registry=self.registry)


class HandledFirings:
    """Alerts already acted on: (trigger, alert identity, startsAt) -> workflow id. Alertmanager repeats a
    firing alert every repeat_interval; the same firing must not start a second run once the first has
    ended (single flight per target covers only a run still going), nor after the receiver restarts: with
    a `path`, each one is appended there (a JSON line) and read back at start."""

    def __init__(self, path: Path | None = None, most: int = _HANDLED_MAX) -> None:
        self.path, self.most = path, most
        self._seen: OrderedDict[tuple[str, str, str], str] = OrderedDict()
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                try:
                    trigger, alert, since, workflow_id = json.loads(line)
                except (ValueError, TypeError):
                    continue  # a line torn by a crash mid-write
                self._remember((trigger, alert, since), workflow_id)

    def __contains__(self, firing: tuple[str, str, str]) -> bool:
        return firing in self._seen

    def __getitem__(self, firing: tuple[str, str, str]) -> str:
        return self._seen[firing]

    def _remember(self, firing: tuple[str, str, str], workflow_id: str) -> bool:
        self._seen[firing] = workflow_id
        if len(self._seen) <= self.most:
            return False
        while len(self._seen) > self.most:
            self._seen.popitem(last=False)
        return True

    def add(self, firing: tuple[str, str, str], workflow_id: str) -> None:
        forgot = self._remember(firing, workflow_id)
        if self.path is None:
            return
        if forgot:  # rewrite what is remembered, so the file stays as bounded as memory
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps([*f, w]) + "\n" for f, w in self._seen.items()))
            tmp.replace(self.path)
        else:
            with self.path.open("a") as out:
                out.write(json.dumps([*firing, workflow_id]) + "\n")


class _Receiver:
    def __init__(self, config: TriggersFile, token: str, starter: Starter, planner: Planner,
                 handled: HandledFirings | None = None):
        self.config, self.token, self.starter, self.planner = config, token.encode(), starter, planner
        self.metrics = _Metrics()
        self.locks: dict[str, asyncio.Lock] = {}
        self.handled = handled or HandledFirings()

    def authorized(self, request: web.Request) -> bool:
        found = _BEARER.match(request.headers.get("Authorization", ""))
        given = found.group(1).encode() if found else b""
        # Compared even when absent, so a missing header costs the same as a wrong one.
        return hmac.compare_digest(given, self.token) and bool(found)

    async def alerts(self, request: web.Request) -> web.Response:
        response = await self._alerts(request)
        self.metrics.requests.labels(code=str(response.status)).inc()
        return response

    async def _alerts(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            _log.warning("trigger_unauthorized", remote=request.remote)
            return web.json_response({"error": "missing or wrong bearer token"}, status=401,
                                     headers={"WWW-Authenticate": 'Bearer realm="coldstart-triggers"'})
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            return _too_large()
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _too_large()
        try:
            payload = AlertmanagerPayload.model_validate_json(body)
        except ValidationError as exc:
            errors = [f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors(include_url=False)[:10]]
            return web.json_response({"error": "not an Alertmanager webhook payload (version 4)", "errors": errors},
                                     status=400)
        if len(payload.alerts) > MAX_ALERTS:
            _log.warning("trigger_too_many_alerts", group=payload.groupKey, alerts=len(payload.alerts))
            return web.json_response({"error": f"{len(payload.alerts)} alerts in one notification, over {MAX_ALERTS}: "
                                               "none acted on (cap them with max_alerts in Alertmanager's "
                                               "webhook_config)"}, status=413)
        results = await asyncio.gather(*(self._one(alert) for alert in payload.alerts))
        flat = [r for group in results for r in group]
        outcomes = Counter(r["outcome"] for r in flat)
        retry = outcomes["unavailable"] or outcomes["error"] or outcomes["busy"]
        status = 503 if retry else 422 if outcomes["invalid"] else 200
        _log.info("trigger_notification", group=payload.groupKey, alerts=len(payload.alerts), status=status,
                  **{f"n_{k}": v for k, v in outcomes.items()})
        return web.json_response({"results": flat, "counts": dict(outcomes)}, status=status)

    async def _one(self, alert: Alert) -> list[dict[str, Any]]:
        base = {"alertname": alert.labels.get("alertname"), "fingerprint": alert.fingerprint}
        if alert.status != "firing":
            return [self._count(None, {**base, "outcome": "ignored", "reason": "resolved"})]
        triggers = [t for t in self.config.triggers if _matches(t, alert)]
        if not triggers:
            reason = f"no trigger for alertname {alert.labels.get('alertname')!r} with these labels"
            return [self._count(None, {**base, "outcome": "ignored", "reason": reason})]
        return list(await asyncio.gather(*(self._fire(t, alert, base) for t in triggers)))

    async def _fire(self, trigger: Trigger, alert: Alert, base: dict[str, Any]) -> dict[str, Any]:
        result = {**base, "trigger": trigger.name, "target": trigger.target}
        firing = (trigger.name, alert.fingerprint or repr(sorted(alert.labels.items())), alert.startsAt or "")
        if firing in self.handled:
            return self._count(trigger, {**result, "outcome": "duplicate",
                                         "reason": f"this firing (since {alert.startsAt}) already started "
                                                   f"{self.handled[firing]}"})
        try:
            params = render_params(trigger, alert)
        except ValueError as exc:
            return self._count(trigger, {**result, "outcome": "ignored", "reason": str(exc)})
        initiator = f"alertmanager:{trigger.name}"
        try:
            run = await asyncio.to_thread(self.planner, trigger.runbook, params=params, target=trigger.target,
                                          initiator=initiator)
        except RunbookInvalid as exc:
            return self._count(trigger, {**result, "outcome": "invalid", "errors": exc.errors})
        except (OSError, ValueError) as exc:  # the inventory: missing, refused (YamlRefused) or invalid
            errors = getattr(exc, "errors", None) or [_first_line(exc)]
            return self._count(trigger, {**result, "outcome": "invalid", "errors": errors})
        return self._count(trigger, {**result, **await self._start(trigger, run, params, firing)})

    async def _start(self, trigger: Trigger, run: Any, params: dict[str, Any],
                     firing: tuple[str, str, str]) -> dict[str, Any]:
        from runtime.runs import TargetBusy

        # Single flight per target in this process too: two deliveries at once start one run.
        lock = self.locks.setdefault(trigger.target, asyncio.Lock())
        async with lock:
            if firing in self.handled:  # the other delivery of this firing got here first
                return {"outcome": "duplicate", "reason": f"already started {self.handled[firing]}"}
            started = time.monotonic()
            try:
                workflow_id = await asyncio.wait_for(self.starter(run), START_TIMEOUT_SECONDS)
            except TargetBusy as exc:
                # Another firing (say a second preempted host) while a run holds the target: answered 503,
                # so Alertmanager retries it and it starts once the target is free.
                return {"outcome": "busy", "reason": f"already running: {_first_line(exc)}"}
            except (TemporalUnavailable, ConnectionError, OSError, TimeoutError) as exc:
                _log.warning("trigger_start_unavailable", trigger=trigger.name, error=_first_line(exc))
                return {"outcome": "unavailable", "reason": _first_line(exc)}
            except Exception as exc:  # noqa: BLE001 - answered 503 so Alertmanager retries; logged in full
                _log.exception("trigger_start_failed", trigger=trigger.name)
                return {"outcome": "error", "reason": _first_line(exc)}
            finally:
                self.metrics.start_seconds.observe(time.monotonic() - started)
        try:
            self.handled.add(firing, workflow_id)
        except OSError as exc:  # the run started; only its record across a restart is lost
            _log.warning("trigger_state_unwritten", path=str(self.handled.path), error=_first_line(exc))
        age = _age_seconds(firing[2])
        if age is not None:
            self.metrics.alert_age.observe(max(age, 0.0))
        _log.info("trigger_started", trigger=trigger.name, target=trigger.target, workflow_id=workflow_id,
                  params=params, starts_at=firing[2] or None, alert_age_s=age)
        return {"outcome": "started", "workflow_id": workflow_id}

    def _count(self, trigger: Trigger | None, result: dict[str, Any]) -> dict[str, Any]:
        self.metrics.alerts.labels(trigger=trigger.name if trigger else "", outcome=result["outcome"]).inc()
        if result["outcome"] in ("ignored", "invalid", "duplicate", "busy"):
            _log.info("trigger_" + result["outcome"], trigger=trigger.name if trigger else None,
                      reason=result.get("reason"), errors=result.get("errors"))
        return result

    async def serve_metrics(self, request: web.Request) -> web.Response:
        # Behind the same token: what alerts came and what they started is not for anyone on the network.
        if not self.authorized(request):
            return web.json_response({"error": "missing or wrong bearer token"}, status=401,
                                     headers={"WWW-Authenticate": 'Bearer realm="coldstart-triggers"'})
        return web.Response(body=generate_latest(self.metrics.registry), content_type="text/plain", charset="utf-8")


RECEIVER: web.AppKey[_Receiver] = web.AppKey("coldstart_triggers_receiver")
_WARMING: web.AppKey[asyncio.Task[bool]] = web.AppKey("coldstart_triggers_warming")


def _too_large() -> web.Response:
    return web.json_response({"error": f"body over {MAX_BODY_BYTES} bytes"}, status=413)


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def create_app(config: TriggersFile, token: str, *, starter: Starter | None = None,
               planner: Planner | None = None, targets_dir: Path = Path("targets"),
               state: Path | None = None) -> web.Application:
    """The receiver: POST /alerts (Alertmanager webhook v4, bearer token), GET /healthz, GET /metrics (bearer token).

    starter defaults to temporal_starter() (connects on first use), planner to default_planner(targets_dir);
    state: where the firings acted on are kept across restarts (HandledFirings).
    """
    if not token:
        raise ValueError("an empty token would let anyone start runs")
    receiver = _Receiver(config, token, starter or temporal_starter(), planner or default_planner(targets_dir),
                         HandledFirings(state))
    # aiohttp refuses a larger body itself too (413) when it is read.
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[RECEIVER] = receiver
    app.router.add_post("/alerts", receiver.alerts)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", receiver.serve_metrics)
    return app


async def _warm_in_background(app: web.Application, starter: TemporalStarter, planning: Callable[[], dict[str, str]]) -> None:
    # A task, so the port answers (healthz, alerts) while Temporal is being reached and the plans' models built.
    async def warm() -> bool:
        connected = await starter.warm()
        try:
            for target, why in (await asyncio.to_thread(planning)).items():
                _log.warning("trigger_target_unreadable_at_start", target=target, error=why)
        except Exception:  # noqa: BLE001 - only a warm-up: the first alert plans as it always did
            _log.exception("trigger_warm_up_failed")
        return connected

    app[_WARMING] = asyncio.create_task(warm())  # kept: a task nobody holds may be collected


def serve(config_path: str | Path, host: str, port: int, token_file: str | Path, targets_dir: Path, *,
          state: Path | None = None, tls_cert: Path | None = None, tls_key: Path | None = None) -> None:
    """Check the triggers file and its runbooks, then answer Alertmanager on HOST:PORT until SIGINT/SIGTERM
    (over https with tls_cert and tls_key)."""
    from activities.catalog import load_registry
    from runtime.logs import configure_logging

    configure_logging()
    token = read_token(token_file)
    registry = load_registry()
    config = check(config_path, registry=registry)
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    ssl_context = None
    if tls_cert is not None and tls_key is not None:
        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_context.load_cert_chain(tls_cert, tls_key)
    starter = temporal_starter()
    app = create_app(config, token, starter=starter, planner=default_planner(targets_dir, registry=registry),
                     targets_dir=targets_dir, state=state)
    # Connected and planned-for before the first alert: the SDK's imports and the connection took about a second
    # of the first run's start on a busy host. Failing to connect or to read a target here is only logged; each
    # alert tries again.
    app.on_startup.append(lambda _: _warm_in_background(app, starter, lambda: warm_up(config, targets_dir, registry)))
    _log.info("triggers_serving", config=str(config_path), listen=f"{host}:{port}",
              triggers=[t.name for t in config.triggers])
    web.run_app(app, host=host, port=port, access_log=None, print=None, handle_signals=True, ssl_context=ssl_context)

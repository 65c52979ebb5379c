"""Run events to Slack, signed JSON webhooks and Alertmanager: retried beside the runs, shed when a sink falls behind."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import Field, ValidationError, field_validator, model_validator

from activities.errors import InvalidInput, LocatedErrors
from activities.retry import Duration, format_duration
from activities.strict import StrictModel
from runtime.readiness.transitions import READINESS_EVENTS
from runtime.shedding import ShedCounter
from workflows.notices import EVENT_KINDS

__all__ = [
    "NOTIFICATIONS_DELIVERED",
    "NOTIFICATIONS_DROPPED",
    "NOTIFY_ENV",
    "Notifier",
    "NotifyConfig",
    "SinkConfig",
    "load_config",
    "render_text",
    "signature",
    "slack_text",
]

NOTIFY_ENV = "COLDSTART_NOTIFY"  # the worker's notifications file
SIGNATURE_HEADER = "X-Coldstart-Signature"

EventKind = Literal["started", "awaiting_approval", "held", "step_failed", "step_back", "finished", "readiness_red",
                    "readiness_ready"]
assert set(EventKind.__args__) == {*EVENT_KINDS, *READINESS_EVENTS}  # type: ignore[attr-defined]

NOTIFICATIONS_DELIVERED = ShedCounter(
    "coldstart_notifications_delivered_total", "run events a sink accepted, by sink", labels=("sink",))
NOTIFICATIONS_DROPPED = ShedCounter(
    "coldstart_notifications_dropped_total",
    "run events never delivered, by sink and why: queue_full (the sink is behind; the run did not wait), "
    "gave_up (every attempt failed), stopped (the worker stopped first)", labels=("sink", "reason"))


class SinkConfig(StrictModel):
    """One place run events go."""

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]*$", max_length=63)]
    kind: Literal["slack", "webhook", "alertmanager"]
    url: Annotated[str, Field(pattern=r"^https?://")]
    events: list[EventKind] = Field(default_factory=lambda: [*EVENT_KINDS, *READINESS_EVENTS])
    secret_env: str | None = Field(
        default=None, description="webhook: the variable holding the HMAC-SHA256 key (the file names it, never holds it)")
    timeout: Duration = timedelta(seconds=5)
    attempts: Annotated[int, Field(ge=1, le=20)] = 5
    queue: Annotated[int, Field(ge=1, le=100_000)] = Field(
        default=1000, description="events waiting for this sink at most; beyond, new ones are dropped and counted")

    @field_validator("url")
    @classmethod
    def _https(cls, url: str) -> str:
        # Events carry approval prompts, errors and the Web UI link, and a webhook's signature is no secret
        # in transit: plain HTTP only where it never leaves the host (the tests' and the lab's receivers).
        if url.startswith("https://") or _loopback(urlsplit(url).hostname):
            return url
        raise ValueError("a sink's url must be https:// (http:// only to a loopback address: 127.0.0.0/8 or [::1])")

    @model_validator(mode="after")
    def _signed(self) -> SinkConfig:
        if self.kind == "webhook" and not self.secret_env:
            raise ValueError("a webhook sink signs its events: set secret_env to the variable holding the key")
        return self


def _loopback(host: str | None) -> bool:
    """Whether host is a loopback address literal; a name (even localhost) is not, as it resolves elsewhere too,
    nor an IPv4-mapped IPv6 address (::ffff:127.0.0.1), which Python 3.13's is_loopback reads as its IPv4 one."""
    try:
        address = ipaddress.ip_address(host) if host is not None else None
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return False
    return address is not None and address.is_loopback


class NotifyConfig(StrictModel):
    """The worker's notifications file ($COLDSTART_NOTIFY)."""

    sinks: list[SinkConfig]
    drills: bool = Field(default=True, description="false: drills' events go nowhere")


def load_config(path: str | os.PathLike[str]) -> NotifyConfig:
    """Read and check the notifications file; a problem is a LocatedErrors (file:line:col: message)."""
    from workflows.loader import LocatedSource, locate_pydantic_errors, parse_located_yaml
    from workflows.yaml_safety import YamlRefused, read_text

    source = LocatedSource(file=str(path))
    try:
        parse_located_yaml(read_text(str(path)), source)
    except OSError as exc:
        raise LocatedErrors([f"{path}:1:1: cannot read: {exc.strerror or exc}"]) from None
    except YamlRefused as exc:
        raise LocatedErrors([exc.located(str(path))]) from None
    if not source.errors:
        try:
            config = NotifyConfig.model_validate(source.data)
        except ValidationError as exc:
            locate_pydantic_errors(exc, source, (), source.data)
        else:
            named: set[str] = set()
            for index, sink in enumerate(config.sinks):
                if sink.name in named:
                    source.error(("sinks", index, "name"), f"sink name {sink.name!r} is used twice")
                named.add(sink.name)
                if sink.secret_env and not os.environ.get(sink.secret_env):
                    source.error(("sinks", index, "secret_env"), f"${sink.secret_env} is not set: sink {sink.name} "
                                                                 "cannot sign its events")
            if not source.errors:
                return config
    raise LocatedErrors(source.formatted())


def signature(key: bytes, body: bytes) -> str:
    """The webhook's signature header value: sha256=<hex HMAC-SHA256 of the body>."""
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def _next_commands(event: dict[str, Any]) -> list[str]:
    target, step = event["target"], event.get("step")
    kind = event["event"]
    if kind in READINESS_EVENTS:
        return [event["command"]]
    if kind == "awaiting_approval":
        login = " --vault-login" if event.get("verified") else ""
        return [f"coldstart approve {target} {step}{login}"]
    if kind == "held":
        return [f"coldstart retry {target} {step}", f"coldstart skip {target} {step}", f"coldstart abort {target}"]
    if kind in ("started", "step_back"):
        return [f"coldstart status {target} --follow"]
    if kind == "finished":
        return [f"coldstart scorecard {target}", f"coldstart timeline {target}"]
    return [f"coldstart status {target}"]


def render_text(event: dict[str, Any]) -> str:
    """The event as one short message a person acts on: what happened, why, and the next command."""
    kind, run = event["event"], f"{event['runbook']} on {event['target']}" + (" (drill)" if event.get("drill") else "")
    step = event.get("step")
    if kind == "readiness_red":
        head = f"recovery path NOT READY: {event['runbook']} on {event['target']}" + "".join(
            f"\n  {c['check']}: {c['evidence']}" for c in event.get("checks") or [])
    elif kind == "readiness_ready":
        head = f"recovery path ready again: {event['runbook']} on {event['target']}"
    elif kind == "started":
        head = f"{run} started by {event['initiator']}"
    elif kind == "awaiting_approval":
        who = ", ".join(event.get("approvers") or []) or "any approver"
        head = f"{run}: step {step} awaits approval ({who}): {event.get('prompt') or ''}".rstrip(": ")
    elif kind == "held":
        head = f"{run}: step {step} held: {event.get('error')}"
    elif kind == "step_failed":
        head = f"{run}: step {step} failed: {event.get('error')}"
    elif kind == "step_back":
        head = f"{run}: ramp {step} stepped back from {event['from_percent']}% to {event['to_percent']}%"
    else:
        wall = event.get("wall_s")
        head = f"{run} {event['state']}" + (f" in {format_duration(round(wall))}" if wall is not None else "")
        if event.get("error"):
            head += f": {event['error']}"
        for phase in event.get("phases") or []:
            took, objective = phase.get("took_s"), phase.get("objective_s")
            said = "not reached" if took is None else format_duration(round(took, 1))
            if objective is not None:
                said += f", objective {format_duration(objective)}"
                if took is not None:
                    said += ", met" if took <= objective else ", MISSED"
            head += f"\n  {phase['phase']}: {said}"
    lines = [head, *(f"  $ {command}" for command in _next_commands(event))]
    if event.get("web_ui"):
        lines.append(f"  {event['web_ui']}")
    return "\n".join(lines)


_SLACK_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def slack_text(event: dict[str, Any]) -> str:
    """render_text with Slack's control characters escaped (&, <, > as &amp; &lt; &gt;).

    Everything in the message is plain text, and much of it comes from the run (its initiator, prompts,
    errors, step and target names): escaped, none of it can become a mention (<!channel>) or a link
    whose text hides where it goes (<https://x|approve>)."""
    return render_text(event).translate(_SLACK_ESCAPES)


def _alert(event: dict[str, Any]) -> list[dict[str, Any]]:
    """Alertmanager's v2 API body: one alert per run and step, resolved (endsAt now) when the run finishes."""
    now = datetime.now(UTC).isoformat()
    readiness = event["event"] in READINESS_EVENTS
    # Both readiness events are one alert (ColdstartReadinessRed): red fires it, ready again resolves it.
    name = "ColdstartReadinessRed" if readiness else "ColdstartRun" + "".join(p.title() for p in event["event"].split("_"))
    labels = {"alertname": name, "runbook": event["runbook"], "target": event["target"],
              "severity": "page" if event["event"] in ("awaiting_approval", "held", "step_failed", "readiness_red")
              else "info"}
    if event.get("step"):
        labels["step"] = event["step"]
    alert: dict[str, Any] = {"labels": labels, "startsAt": now,
                             "annotations": {"summary": render_text(event).splitlines()[0],
                                             "commands": "\n".join(_next_commands(event))}}
    if event.get("web_ui"):
        alert["generatorURL"] = event["web_ui"]
    if event["event"] in ("finished", "readiness_ready"):
        alert["endsAt"] = now
    return [alert]


class _Sink:
    """One sink's queue and its sender thread: a sink that hangs holds only its own thread and queue."""

    def __init__(self, config: SinkConfig, transport: httpx.BaseTransport | None, sleep: Callable[[float], None]):
        self.config = config
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=config.queue)
        self._key = os.environ.get(config.secret_env, "").encode() if config.secret_env else b""
        self._http = httpx.Client(timeout=config.timeout.total_seconds(), transport=transport)
        self._sleep = sleep
        self._thread = threading.Thread(target=self._run, name=f"notify-{config.name}", daemon=True)
        self._thread.start()

    def offer(self, event: dict[str, Any]) -> None:
        try:
            self.queue.put_nowait(event)
        except queue.Full:
            NOTIFICATIONS_DROPPED.add(f"{self.config.name}:queue_full")

    def _request(self, event: dict[str, Any]) -> tuple[str, bytes, dict[str, str]]:
        kind, url = self.config.kind, self.config.url
        headers = {"Content-Type": "application/json"}
        if kind == "slack":
            body = json.dumps({"text": slack_text(event)}).encode()
        elif kind == "alertmanager":
            url = url.rstrip("/") + "/api/v2/alerts"
            body = json.dumps(_alert(event)).encode()
        else:
            body = json.dumps(event, sort_keys=True, default=str).encode()
            headers[SIGNATURE_HEADER] = signature(self._key, body)
        return url, body, headers

    def _deliver(self, event: dict[str, Any]) -> bool:
        url, body, headers = self._request(event)
        for attempt in range(self.config.attempts):
            if attempt:
                self._sleep(min(0.5 * 2 ** (attempt - 1), 30.0))
            try:
                if self._http.post(url, content=body, headers=headers).is_success:
                    return True
            except httpx.HTTPError:
                continue
        return False

    def _run(self) -> None:
        while (event := self.queue.get()) is not None:
            if self._deliver(event):
                NOTIFICATIONS_DELIVERED.add(self.config.name)
            else:
                NOTIFICATIONS_DROPPED.add(f"{self.config.name}:gave_up")

    def stop(self, within: float) -> None:
        """Deliver what is queued for up to `within` seconds; what is left is counted as stopped."""
        deadline = time.monotonic() + within
        while not self.queue.empty() and time.monotonic() < deadline:
            time.sleep(0.05)
        left = 0
        while True:
            try:
                left += self.queue.get_nowait() is not None
            except queue.Empty:
                break
        if left:
            NOTIFICATIONS_DROPPED.add(f"{self.config.name}:stopped", left)
        self.queue.put(None)
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()) + 0.1)


class Notifier:
    """The worker's event sink (workflows/notices.set_event_sink): `offer` sorts an event into the queues of the
    sinks that want it and returns; each sink's thread delivers, retrying with backoff, and sheds when behind.

    link: the run's Web UI page for a workflow id (runtime/connection.web_ui_url); transport: httpx's test seam."""

    def __init__(self, config: NotifyConfig, *, link: Callable[[str], str] | None = None,
                 transport: httpx.BaseTransport | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config
        self._link = link
        self._sinks = [_Sink(sink, transport, sleep) for sink in config.sinks]

    def offer(self, event: dict[str, Any]) -> None:
        if event.get("drill") and not self.config.drills:
            return
        if self._link is not None and "web_ui" not in event and "workflow_id" in event:
            event = {**event, "web_ui": self._link(event["workflow_id"])}
        event = {"at": datetime.now(UTC).isoformat(), **event}
        for sink in self._sinks:
            if event["event"] in sink.config.events:
                sink.offer(event)

    def close(self, within: float = 5.0) -> None:
        for sink in self._sinks:
            sink.stop(within)


def from_environment(link: Callable[[str], str] | None = None) -> Notifier | None:
    """The notifier $COLDSTART_NOTIFY configures, or None when it is unset."""
    path = os.environ.get(NOTIFY_ENV, "").strip()
    if not path:
        return None
    if not Path(path).is_file():
        raise InvalidInput(f"${NOTIFY_ENV}: {path} is not a file")
    return Notifier(load_config(path), link=link)

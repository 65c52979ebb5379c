"""Run events to real local HTTP sinks: one that accepts (a signed JSON webhook), one that refuses and one that
hangs. The run keeps its pace whatever the sinks do, nothing accepted is lost, and what is dropped is counted."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp import web

from activities.errors import LocatedErrors
from runtime.notifications import (
    NOTIFICATIONS_DELIVERED,
    NOTIFICATIONS_DROPPED,
    SIGNATURE_HEADER,
    Notifier,
    load_config,
    render_text,
    signature,
    slack_text,
)
from tests import support
from workflows.notices import set_event_sink

KEY = "webhook-key"


class Receiver:
    """A local HTTP endpoint that accepts, refuses (500) or never answers; it keeps what it was sent."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._hung = asyncio.Event()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.received.append((dict(request.headers), body))
        if self.mode == "hang":
            await self._hung.wait()
        return web.Response(status=500 if self.mode == "refuse" else 200)

    async def start(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        self._hung.set()
        if self._runner:
            await self._runner.cleanup()


async def test_events_reach_the_sinks_without_holding_the_run(env, task_queue, tmp_path, monkeypatch):
    monkeypatch.setenv("COLDSTART_TEST_WEBHOOK_KEY", KEY)
    accept, refuse, hang = [await Receiver(mode).start() for mode in ("accept", "refuse", "hang")]
    prom = await support.ScriptedPrometheus().start()
    prom.script("ready_up", 0)
    config_file = tmp_path / "notify.yaml"
    config_file.write_text(f"""
sinks:
  - {{name: ops-hook, kind: webhook, url: "{accept.url}/events", secret_env: COLDSTART_TEST_WEBHOOK_KEY}}
  - {{name: chat, kind: slack, url: "{refuse.url}/slack", attempts: 2}}
  - {{name: pager, kind: alertmanager, url: "{hang.url}", queue: 1, timeout: 60s, attempts: 5,
      events: [started, held, awaiting_approval, finished]}}
""")
    notifier = Notifier(load_config(config_file), link=lambda wid: f"http://ui.example/workflows/{wid}",
                        sleep=lambda _s: None)
    target = f"notify-{task_queue[-8:]}"
    book = support.write_runbook(tmp_path, """
        metadata: {name: notified, owner: sre}
        target: any
        approvers: [alice, bob]
        objectives: {rto: 1m, phases: {ready: {until: ready, within: 30s}, done: {until: bye, within: 30s}}}
        steps:
          - id: ready
            gate: {name: up, endpoint: "${{ target.telemetry.prometheus }}", query: ready_up, comparator: ">=", threshold: 1, interval: 0.2s, timeout: 1s}
            on_failure: hold
          - id: go
            approval: {prompt: "carry on?"}
          - id: bye
            action: core.note
            with: {message: bye}
    """)
    delivered_before, gave_up_before = NOTIFICATIONS_DELIVERED.value("ops-hook"), NOTIFICATIONS_DROPPED.value("chat:gave_up")
    full_before = NOTIFICATIONS_DROPPED.value("pager:queue_full")
    try:
        async with support.worker(env.client, task_queue, notifier=notifier):
            started = time.monotonic()
            handle = await support.start(env.client, book, task_queue, target={
                "name": target, "telemetry": {"prometheus": prom.url}}, initiator="alice")
            await support.wait_for(lambda: _status_of(handle, "ready", "held"), timeout=30)
            prom.script("ready_up", 1)
            await handle.execute_update("retry", {"actor": "bob", "step": "ready", "reason": "fixed"})
            await support.wait_for(lambda: _status_of(handle, "go", "awaiting_approval"), timeout=30)
            await handle.execute_update("approve", {"step": "go", "approver": "bob", "comment": "ok"})
            await handle.result()
            run_took = time.monotonic() - started
            # Every event the accepting sink was sent arrives: delivery goes on beside the run.
            await support.wait_for(lambda: _at_least(accept, 4), timeout=20)
    finally:
        set_event_sink(None)
        await asyncio.to_thread(notifier.close, 1.0)
        for server in (accept, refuse, hang, prom):
            await server.stop()

    # The pager never answers and was asked to try five times, 60 s each: the run did not wait for it.
    assert run_took < 30, run_took
    events = [json.loads(body) for _, body in accept.received]
    assert [e["event"] for e in events] == ["started", "held", "awaiting_approval", "finished"], events
    for headers, body in accept.received:
        assert headers[SIGNATURE_HEADER] == signature(KEY.encode(), body)
    held, asked, finished = events[1], events[2], events[3]
    assert held["step"] == "ready" and "up" in (held["error"] or ""), held
    assert asked["step"] == "go" and asked["prompt"] == 'carry on?; then bye runs core.note with {"message": "bye"}' and asked["web_ui"].endswith(handle.id), asked
    assert finished["state"] == "succeeded" and [p["phase"] for p in finished["phases"]] == ["ready", "done"]
    assert all(p["took_s"] is not None and p["took_s"] <= p["objective_s"] for p in finished["phases"]), finished
    assert NOTIFICATIONS_DELIVERED.value("ops-hook") - delivered_before == 4
    # The refusing sink was tried twice per event and gave each up; the hanging one held one event, queued
    # one, and dropped the rest as they came.
    assert len(refuse.received) == 8 and NOTIFICATIONS_DROPPED.value("chat:gave_up") - gave_up_before == 4
    assert json.loads(refuse.received[0][1])["text"].startswith("notified on " + target)
    assert len(hang.received) == 1 and NOTIFICATIONS_DROPPED.value("pager:queue_full") - full_before == 2
    [alert] = json.loads(hang.received[0][1])
    assert alert["labels"]["alertname"] == "ColdstartRunStarted" and alert["labels"]["target"] == target


async def _status_of(handle, step: str, wanted: str) -> bool:
    # Until the worker has resolved the request the run holds no step yet.
    return next((s.status for s in (await support.status(handle)).steps if s.id == step), None) == wanted


async def _at_least(receiver: Receiver, count: int) -> bool:
    return len(receiver.received) >= count


def test_messages_say_what_to_do_next():
    asked = {"event": "awaiting_approval", "runbook": "consul-cold-start", "target": "prod", "drill": False,
             "initiator": "alice", "step": "approve-restore", "prompt": "restore 14:05?", "approvers": ["bob"],
             "verified": True, "web_ui": "http://ui/workflows/x"}
    text = render_text(asked)
    assert text.splitlines() == [
        "consul-cold-start on prod: step approve-restore awaits approval (bob): restore 14:05?",
        "  $ coldstart approve prod approve-restore --vault-login",
        "  http://ui/workflows/x"]
    finished = {"event": "finished", "runbook": "demo", "target": "lab", "drill": True, "initiator": "a",
                "state": "succeeded", "error": None, "wall_s": 5400.0,
                "phases": [{"phase": "consul-stable", "took_s": 2000.0, "objective_s": 1800.0},
                           {"phase": "players-100", "took_s": None, "objective_s": 7200.0}]}
    assert render_text(finished).splitlines()[:3] == [
        "demo on lab (drill) succeeded in 1h30m", "  consul-stable: 33m20s, objective 30m, MISSED",
        "  players-100: not reached, objective 2h"]


def test_a_bad_notifications_file_is_refused_where_it_is_wrong(tmp_path, monkeypatch):
    monkeypatch.delenv("COLDSTART_TEST_UNSET_KEY", raising=False)
    path = tmp_path / "notify.yaml"
    path.write_text("sinks:\n  - {name: a, kind: webhook, url: 'https://x', secret_env: COLDSTART_TEST_UNSET_KEY}\n"
                    "  - {name: b, kind: pager, url: 'https://x'}\n")
    with pytest.raises(LocatedErrors) as refused:
        load_config(path)
    assert refused.value.errors == [f"{path}:3:21: sinks[1].kind: Input should be 'slack', 'webhook' or 'alertmanager'"]
    path.write_text("sinks:\n  - {name: a, kind: webhook, url: 'https://x', secret_env: COLDSTART_TEST_UNSET_KEY}\n")
    with pytest.raises(LocatedErrors) as refused:
        load_config(path)
    assert refused.value.errors == [
        f"{path}:2:60: $COLDSTART_TEST_UNSET_KEY is not set: sink a cannot sign its events"]


@pytest.mark.parametrize("url", ["http://hooks.example/x", "http://localhost:9093", "http://127.0.0.1@hooks.example/",
                                 "http://127.0.0.1.hooks.example/", "http://[::ffff:127.0.0.1]/"])
def test_a_plain_http_sink_is_refused_unless_it_is_on_this_host(tmp_path, url):
    path = tmp_path / "notify.yaml"
    path.write_text(f"sinks:\n  - {{name: chat, kind: slack, url: '{url}'}}\n")
    with pytest.raises(LocatedErrors) as refused:
        load_config(path)
    said = "a sink's url must be https:// (http:// only to a loopback address: 127.0.0.0/8 or [::1])"
    assert refused.value.errors == [f"{path}:2:36: sinks[0].url: {said}"]


@pytest.mark.parametrize("url", ["https://hooks.slack.com/services/T/B/x", "http://127.0.0.1:8080/hook",
                                 "http://127.9.9.9/", "http://[::1]:9093"])
def test_https_and_loopback_sinks_are_accepted(tmp_path, url):
    path = tmp_path / "notify.yaml"
    path.write_text(f"sinks:\n  - {{name: chat, kind: slack, url: '{url}'}}\n")
    assert load_config(path).sinks[0].url == url


def test_run_supplied_text_cannot_become_slack_markup():
    started = {"event": "started", "runbook": "demo", "target": "lab", "initiator": "<!channel> <https://x|approve> & co"}
    assert slack_text(started).splitlines()[0] == (
        "demo on lab started by &lt;!channel&gt; &lt;https://x|approve&gt; &amp; co")
    asked = {"event": "awaiting_approval", "runbook": "demo", "target": "lab", "step": "go", "verified": False,
             "approvers": ["<@U123>"], "prompt": "<!here> ok? <https://evil|yes>"}
    text = slack_text(asked)
    assert "<" not in text and ">" not in text, text
    assert text.splitlines()[0] == ("demo on lab: step go awaits approval (&lt;@U123&gt;): "
                                    "&lt;!here&gt; ok? &lt;https://evil|yes&gt;")
    held = {"event": "held", "runbook": "demo", "target": "lab", "step": "s", "error": "x <!everyone> y"}
    assert slack_text(held).splitlines()[0] == "demo on lab: step s held: x &lt;!everyone&gt; y"
    # The plain text (Alertmanager's summary, the CLI) stays as the run said it.
    assert render_text(held).splitlines()[0] == "demo on lab: step s held: x <!everyone> y"


def test_a_slack_sink_sends_the_escaped_text():
    import httpx

    sent: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.content)
        return httpx.Response(200)

    from runtime.notifications import NotifyConfig, SinkConfig

    notifier = Notifier(NotifyConfig(sinks=[SinkConfig(name="chat", kind="slack", url="https://hooks.example/x")]),
                        transport=httpx.MockTransport(handler))
    notifier.offer({"event": "started", "runbook": "demo", "target": "lab", "initiator": "<!channel>"})
    notifier.close(5.0)
    [body] = sent
    assert json.loads(body)["text"].startswith("demo on lab started by &lt;!channel&gt;\n")


def test_a_ramp_stepping_back_and_a_failed_step_are_events():
    from datetime import UTC, datetime

    from workflows.contract import RunStatus, StepState
    from workflows.notices import Snapshot, run_events

    def status(percent: int, state: str, failed: bool) -> RunStatus:
        return RunStatus(workflow_id="coldstart-lab", runbook="cold", target="lab", initiator="a", drill=True,
                         state=state, started_at=datetime(2026, 1, 1, tzinfo=UTC), steps=[
                             StepState(id="players", kind="ramp", status="running", percent=percent, last_good=20),
                             StepState(id="tiers", kind="action", status="failed" if failed else "pending",
                                       error="boom" if failed else None)])

    before = Snapshot.of(status(30, "running", False))
    events = run_events(before, status(20, "running", True))
    assert [(e["event"], e["step"]) for e in events] == [("step_back", "players"), ("step_failed", "tiers")]
    assert (events[0]["from_percent"], events[0]["to_percent"]) == (30, 20)
    assert run_events(Snapshot.of(status(20, "running", True)), status(20, "running", True)) == []

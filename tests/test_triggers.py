"""Alert-triggered runs: the Alertmanager webhook receiver (triggers/receiver.py) on a stand-in starter, on the real dev
server and start path, and the real Alertmanager."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import structlog.testing
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from temporalio.client import WorkflowFailureError
from typer.testing import CliRunner

from lab.alerting import ALERTMANAGER_BINARY, alertmanager_argv, alertmanager_config
from runtime.processes import free_port
from runtime.runs import TargetBusy
from tests import support
from tests.real import unavailable
from triggers.receiver import (
    MAX_ALERTS,
    MAX_BODY_BYTES,
    Alert,
    TriggersFile,
    TriggersInvalid,
    create_app,
    load_triggers,
    render_params,
)
from workflows.loader import RunbookInvalid

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

CONFIG = TriggersFile.model_validate({
    "version": 1,
    "triggers": [{
        "name": "preempted-host",
        "alertname": "HostPreemptionNotice",
        "match": {"severity": "page"},
        "runbook": "runbooks/preempted-host-drain.yaml",
        "target": "lab",
        "params": {"host": "{{ labels.host }}", "deadline": "{{annotations.deadline}}", "margin": "2s"},
    }],
})


def _alert(status: str = "firing", **labels: str) -> dict[str, Any]:
    labels = {"alertname": "HostPreemptionNotice", "severity": "page", "host": "c1", **labels}
    return {"status": status, "labels": {k: v for k, v in labels.items() if v != ""},
            "annotations": {"deadline": "1712345678.000", "summary": "x"},
            "startsAt": "2024-04-05T19:34:08Z", "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "",
            "fingerprint": "abc"}


def _payload(*alerts: dict[str, Any]) -> dict[str, Any]:
    return {"version": "4", "status": "firing", "receiver": "coldstart", "groupKey": "{}:{host=\"c1\"}",
            "truncatedAlerts": 0, "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://am", "alerts": list(alerts)}


def _planner(runbook: Path, *, params: dict[str, Any], target: str, initiator: str) -> Any:
    return SimpleNamespace(runbook=runbook, params=params, target_name=target, initiator=initiator)


class FakeTemporal:
    """A starter that holds each target like start_run does: a second start while one runs is TargetBusy."""

    def __init__(self, delay: float = 0.0, fail: Exception | None = None):
        self.delay, self.fail = delay, fail
        self.calls: list[Any] = []
        self.running: set[str] = set()

    async def __call__(self, run: Any) -> str:
        self.calls.append(run)
        if self.fail is not None:
            raise self.fail
        busy = run.target_name in self.running  # checked before the (slow) start, as a race would
        await asyncio.sleep(self.delay)
        if busy:
            raise TargetBusy(f"target {run.target_name} is busy: run coldstart-{run.target_name} is still running")
        self.running.add(run.target_name)
        return f"coldstart-{run.target_name}"


async def _client(starter: Any, planner: Any = _planner, config: TriggersFile = CONFIG) -> TestClient:
    client = TestClient(TestServer(create_app(config, TOKEN, starter=starter, planner=planner)))
    await client.start_server()
    return client


async def test_bad_or_missing_token_is_401_and_starts_nothing():
    starter = FakeTemporal()
    client = await _client(starter)
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                        {"Authorization": f"Bearer {TOKEN}x"}):
            response = await client.post("/alerts", json=_payload(_alert()), headers=headers)
            assert response.status == 401
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert starter.calls == []
    finally:
        await client.close()


async def test_matching_alert_starts_one_run_with_templated_params():
    starter = FakeTemporal()
    client = await _client(starter)
    try:
        response = await client.post("/alerts", json=_payload(_alert()), headers=AUTH)
        assert response.status == 200, await response.text()
        body = await response.json()
        assert body["results"] == [{"alertname": "HostPreemptionNotice", "fingerprint": "abc", "trigger": "preempted-host",
                                    "target": "lab", "outcome": "started", "workflow_id": "coldstart-lab"}]
        [run] = starter.calls
        assert run.params == {"host": "c1", "deadline": "1712345678.000", "margin": "2s"}
        assert run.initiator == "alertmanager:preempted-host"
        assert run.target_name == "lab"
        assert run.runbook == Path("runbooks/preempted-host-drain.yaml")
    finally:
        await client.close()


async def test_two_deliveries_at_once_start_one_run():
    starter = FakeTemporal(delay=0.2)
    client = await _client(starter)
    try:
        first, second = await asyncio.gather(
            client.post("/alerts", json=_payload(_alert()), headers=AUTH),
            client.post("/alerts", json=_payload(_alert()), headers=AUTH),
        )
        assert first.status == second.status == 200
        outcomes = sorted([(await first.json())["results"][0]["outcome"], (await second.json())["results"][0]["outcome"]])
        assert outcomes == ["duplicate", "started"]
        assert len(starter.running) == 1
        # The second delivery waited for the first under the target's lock, then found its firing handled.
        assert len(starter.calls) == 1
        # Another firing for the target (a second host) while the run goes: 503, so Alertmanager retries it
        # until the target is free, then it starts.
        later = _alert(host="c2")
        later["fingerprint"] = "def"
        busy = await client.post("/alerts", json=_payload(later), headers=AUTH)
        assert busy.status == 503
        assert (await busy.json())["results"][0]["outcome"] == "busy"
        assert "already running" in (await busy.json())["results"][0]["reason"]
        starter.running.clear()
        retried = await client.post("/alerts", json=_payload(later), headers=AUTH)
        assert retried.status == 200 and (await retried.json())["results"][0]["outcome"] == "started"
        assert starter.calls[-1].params["host"] == "c2"
    finally:
        await client.close()


async def test_a_repeated_firing_starts_nothing_after_its_run_ended_but_a_new_one_does():
    starter = FakeTemporal()
    client = await _client(starter)
    try:
        first = await (await client.post("/alerts", json=_payload(_alert()), headers=AUTH)).json()
        assert first["results"][0]["outcome"] == "started"
        starter.running.clear()  # the run ended; Alertmanager repeats the same firing a minute later
        repeat = await (await client.post("/alerts", json=_payload(_alert()), headers=AUTH)).json()
        assert repeat["results"][0]["outcome"] == "duplicate"
        assert "already started coldstart-lab" in repeat["results"][0]["reason"]
        assert len(starter.calls) == 1
        fresh = {**_alert(), "startsAt": "2024-04-05T20:00:00Z"}  # resolved, then a new notice
        again = await (await client.post("/alerts", json=_payload(fresh), headers=AUTH)).json()
        assert again["results"][0]["outcome"] == "started"
        assert len(starter.calls) == 2
    finally:
        await client.close()


async def test_non_matching_and_resolved_alerts_are_ignored():
    starter = FakeTemporal()
    client = await _client(starter)
    try:
        response = await client.post("/alerts", headers=AUTH, json=_payload(
            _alert(severity="ticket"), _alert(alertname="SomethingElse"), _alert(status="resolved"),
            _alert(severity=""),
        ))
        assert response.status == 200
        body = await response.json()
        assert [r["outcome"] for r in body["results"]] == ["ignored"] * 4
        assert body["results"][2]["reason"] == "resolved"
        assert body["counts"] == {"ignored": 4}
        assert starter.calls == []
    finally:
        await client.close()


async def test_missing_label_or_annotation_is_ignored_with_the_reason():
    starter = FakeTemporal()
    client = await _client(starter)
    try:
        no_host = _alert(host="")
        no_deadline = _alert(host="c2")
        no_deadline["annotations"] = {}
        body = await (await client.post("/alerts", json=_payload(no_host, no_deadline), headers=AUTH)).json()
        assert [(r["outcome"], r["trigger"], r["reason"]) for r in body["results"]] == [
            ("ignored", "preempted-host", "the alert has no label 'host'"),
            ("ignored", "preempted-host", "the alert has no annotation 'deadline'"),
        ]
        assert starter.calls == []
    finally:
        await client.close()


async def test_temporal_unreachable_is_503_so_alertmanager_retries():
    starter = FakeTemporal(fail=ConnectionRefusedError("connection refused"))
    client = await _client(starter)
    try:
        response = await client.post("/alerts", json=_payload(_alert()), headers=AUTH)
        assert response.status == 503
        assert (await response.json())["results"][0]["outcome"] == "unavailable"
    finally:
        await client.close()


async def test_invalid_run_is_422_and_the_others_still_reported():
    def planner(runbook: Path, *, params: dict[str, Any], target: str, initiator: str) -> Any:
        if params["host"] == "bad":
            raise RunbookInvalid([f"{runbook}:20:3: parameter 'deadline' (given): not a time"])
        return _planner(runbook, params=params, target=target, initiator=initiator)

    starter = FakeTemporal()
    client = await _client(starter, planner)
    try:
        response = await client.post("/alerts", json=_payload(_alert(host="bad"), _alert(host="c1")), headers=AUTH)
        assert response.status == 422
        bad, good = (await response.json())["results"]
        assert bad["outcome"] == "invalid" and bad["errors"][0].endswith("not a time")
        assert good["outcome"] == "started"
        assert len(starter.calls) == 1
    finally:
        await client.close()


async def test_oversized_and_malformed_bodies():
    starter = FakeTemporal()
    client = await _client(starter)
    try:
        big = await client.post("/alerts", data=b"{" + b" " * MAX_BODY_BYTES + b"}", headers=AUTH)
        assert big.status == 413
        for body in (b"not json", json.dumps({"version": "3", "alerts": []}).encode(),
                     json.dumps({"version": "4", "status": "firing", "alerts": [{"status": "firing"}]}).encode()):
            response = await client.post("/alerts", data=body, headers={**AUTH, "Content-Type": "application/json"})
            assert response.status == 400, body
        assert starter.calls == []
    finally:
        await client.close()


async def test_a_notification_with_too_many_alerts_is_refused_whole():
    starter = FakeTemporal()
    client = await _client(starter)
    try:
        many = [_alert(host=f"c{i}") for i in range(MAX_ALERTS + 1)]
        response = await client.post("/alerts", json=_payload(*many), headers=AUTH)
        assert response.status == 413
        body = await response.json()
        assert body == {"error": f"{MAX_ALERTS + 1} alerts in one notification, over {MAX_ALERTS}: none acted on "
                                 "(cap them with max_alerts in Alertmanager's webhook_config)"}
        assert starter.calls == []
        # At the cap, every alert is looked at (one firing here: one run, the rest its duplicates).
        response = await client.post("/alerts", json=_payload(*many[:MAX_ALERTS]), headers=AUTH)
        assert response.status == 200, await response.text()
        assert len((await response.json())["results"]) == MAX_ALERTS and len(starter.calls) == 1
    finally:
        await client.close()


async def test_healthz_and_metrics_count():
    starter = FakeTemporal()
    client = await _client(starter)
    try:
        assert await (await client.get("/healthz")).text() == "ok"
        await client.post("/alerts", json=_payload(_alert()), headers=AUTH)
        await client.post("/alerts", json=_payload(_alert(), _alert(status="resolved")), headers=AUTH)
        await client.post("/alerts", json=_payload(_alert()), headers={})
        assert (await client.get("/metrics")).status == 401  # behind the token too
        metrics = await (await client.get("/metrics", headers=AUTH)).text()
        assert 'coldstart_trigger_alerts_total{outcome="started",trigger="preempted-host"} 1.0' in metrics
        assert 'coldstart_trigger_alerts_total{outcome="duplicate",trigger="preempted-host"} 1.0' in metrics
        assert 'coldstart_trigger_alerts_total{outcome="ignored",trigger=""} 1.0' in metrics
        assert 'coldstart_trigger_requests_total{code="200"} 2.0' in metrics
        assert 'coldstart_trigger_requests_total{code="401"} 1.0' in metrics
        assert "coldstart_trigger_start_seconds_count 1.0" in metrics  # the repeat is answered from memory
    finally:
        await client.close()


async def test_the_alert_age_at_start_is_measured_from_its_startsat():
    """How late a run starts after the rule found its alert firing: a histogram, and a field of the start's log
    line; an alert without a start time (Alertmanager's zero time) is not counted."""
    from datetime import UTC, datetime, timedelta

    fired = (datetime.now(UTC) - timedelta(seconds=3)).isoformat().replace("+00:00", "Z")
    started = []
    for starts_at in (fired, "0001-01-01T00:00:00Z"):
        client = await _client(FakeTemporal())
        try:
            with structlog.testing.capture_logs() as logs:
                answer = await client.post("/alerts", json=_payload({**_alert(), "startsAt": starts_at}), headers=AUTH)
            assert answer.status == 200
            started += [e for e in logs if e["event"] == "trigger_started"]
            metrics = await (await client.get("/metrics", headers=AUTH)).text()
        finally:
            await client.close()
        if starts_at == fired:
            assert "coldstart_trigger_alert_age_seconds_count 1.0" in metrics
            assert 'coldstart_trigger_alert_age_seconds_bucket{le="2.5"} 0.0' in metrics
            assert 'coldstart_trigger_alert_age_seconds_bucket{le="5.0"} 1.0' in metrics
        else:
            assert "coldstart_trigger_alert_age_seconds_count 0.0" in metrics
    assert [e["starts_at"] for e in started] == [fired, "0001-01-01T00:00:00Z"]
    assert 3.0 <= started[0]["alert_age_s"] < 30 and started[1]["alert_age_s"] is None


async def test_a_repeated_firing_starts_nothing_after_the_receiver_restarts(tmp_path):
    """The firings acted on are kept in --state: Alertmanager's repeat after a restart is a duplicate."""
    state = tmp_path / "handled.jsonl"
    starter = FakeTemporal()
    for _ in range(2):  # the same firing, to a receiver started afresh each time
        client = TestClient(TestServer(create_app(CONFIG, TOKEN, starter=starter, planner=_planner, state=state)))
        await client.start_server()
        try:
            response = await client.post("/alerts", json=_payload(_alert()), headers=AUTH)
            outcomes = [r["outcome"] for r in (await response.json())["results"]]
        finally:
            await client.close()
        starter.running.clear()  # the first run has ended meanwhile
    assert outcomes == ["duplicate"] and len(starter.calls) == 1


def test_the_kept_firings_stay_bounded(tmp_path):
    from triggers.receiver import HandledFirings

    state = tmp_path / "handled.jsonl"
    kept = HandledFirings(state, most=3)
    for i in range(5):
        kept.add(("t", f"a{i}", "since"), f"w{i}")
    again = HandledFirings(state, most=3)
    assert ("t", "a4", "since") in again and ("t", "a1", "since") not in again
    assert len(state.read_text().splitlines()) <= 4


def test_templates_are_only_labels_and_annotations():
    alert = Alert.model_validate(_alert())
    trigger = CONFIG.triggers[0]
    assert render_params(trigger, alert)["host"] == "c1"
    # Nothing else is evaluated: Jinja statements are plain text.
    literal = trigger.model_copy(update={"params": {"note": "{% if x %}on {{ labels.host }}{% endif %}"}})
    assert render_params(literal, alert) == {"note": "{% if x %}on c1{% endif %}"}
    for bad in ("{{ labels.host | upper }}", "{{ params.x }}", "{{ labels.host }}}}", "{{labels['host']}}"):
        with pytest.raises(ValueError, match="may be templated"):
            TriggersFile.model_validate({"triggers": [{**trigger.model_dump(mode="json"), "params": {"host": bad}}]})


@pytest.mark.parametrize(("text", "expected"), [
    ("version: 1\ntriggers:\n  - name: a\n    alertname: X\n    runbook: r.yaml\n    target: lab\n    colour: red\n",
     ":7:5: unknown field 'colour'"),
    ("version: 1\ntriggers:\n  - name: a\n    name: b\n", ":4:5: duplicate key 'name'"),
    (("version: 1\ntriggers:\n  - name: a\n    alertname: X\n    runbook: r.yaml\n    target: lab\n"
      "    params: {host: '{{ labels.host | upper }}'}\n"), ":7:13: triggers[0].params: parameter 'host': only"),
    ("version: 1\ntriggers: []\n", ":2:11: triggers: List should have at least 1 item"),
])
def test_bad_triggers_file_is_reported_with_file_line_col(tmp_path: Path, text: str, expected: str):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(TriggersInvalid) as raised:
        load_triggers(path)
    assert any(line.startswith(f"{path}{expected}") for line in raised.value.errors), raised.value.errors


def test_cli_triggers_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from cli.main import app

    monkeypatch.chdir(ROOT)
    runner = CliRunner()
    result = runner.invoke(app, ["triggers", "check", "triggers/lab.yaml"])
    assert result.exit_code == 0, result.output
    assert "triggers/lab.yaml: ok" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ntriggers:\n  - name: a\n    alertname: X\n    runbook: runbooks/preempted-host-drain.yaml\n"
                   "    target: lab\n    params: {hots: '{{ labels.host }}'}\n")
    result = runner.invoke(app, ["triggers", "check", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}:7:14: triggers[0].params: runbooks/preempted-host-drain.yaml declares no parameter 'hots'" in result.output


async def test_real_alertmanager_delivers_the_alert_with_the_bearer_token(tmp_path: Path):
    if not ALERTMANAGER_BINARY.exists():
        unavailable(f"{ALERTMANAGER_BINARY} is missing (apt-get install prometheus-alertmanager)")
    starter = FakeTemporal()
    seen_auth: list[str] = []

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        seen_auth.append(request.headers.get("Authorization", ""))
        return await handler(request)

    app = create_app(CONFIG, TOKEN, starter=starter, planner=_planner)
    app.middlewares.append(record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    hook_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", hook_port).start()

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    config = tmp_path / "alertmanager.yml"
    config.write_text(alertmanager_config(f"http://127.0.0.1:{hook_port}/alerts", token_file))
    am_port = free_port()
    with (tmp_path / "am.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *alertmanager_argv(ALERTMANAGER_BINARY, config, tmp_path / "data", f"127.0.0.1:{am_port}"),
            stdout=subprocess.DEVNULL, stderr=log,
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{am_port}", timeout=2) as http:
            deadline = time.monotonic() + 10
            while True:
                try:
                    if (await http.get("/-/ready")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert process.returncode is None, (tmp_path / "am.log").read_text()
                assert time.monotonic() < deadline, "alertmanager not ready within 10 s"
                await asyncio.sleep(0.1)
            alert = {"labels": {"alertname": "HostPreemptionNotice", "severity": "page", "host": "c7"},
                     "annotations": {"deadline": "1712345678.000"}}
            noise = {"labels": {"alertname": "Unrelated", "host": "c7"}}
            response = await http.post("/api/v2/alerts", json=[alert, noise])
            assert response.status_code == 200, response.text
            deadline = time.monotonic() + 10
            while not starter.calls and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        assert starter.calls, f"no webhook within 10 s; log: {(tmp_path / 'am.log').read_text()[-2000:]}"
        [run] = starter.calls
        assert run.params["host"] == "c7" and run.params["deadline"] == "1712345678.000"
        assert run.initiator == "alertmanager:preempted-host"
        assert seen_auth and all(a == f"Bearer {TOKEN}" for a in seen_auth)
    finally:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()
        await runner.cleanup()


def test_the_receiver_serves_https_with_its_certificate(tmp_path):
    """`coldstart triggers serve --tls-cert --tls-key`: Alertmanager reaches it over https only. It reaches for
    Temporal at start-up, before any alert (here none answers: it says so and serves on)."""
    import os
    import sys

    from tests.cluster.certs import Authority

    ca = Authority(tmp_path / "ca")
    cert, key = ca.issue("triggers", ips=["127.0.0.1"], server=True)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    port = free_port()
    serving = subprocess.Popen(
        [str(Path(sys.prefix) / "bin" / "coldstart"), "triggers", "serve", "--config", "triggers/lab.yaml", "--port",
         str(port), "--token-file", str(token), "--tls-cert", str(cert), "--tls-key", str(key)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"})
    trusted = ssl.create_default_context(cafile=str(ca.path))  # httpx deprecates verify=<path>
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                answer = httpx.get(f"https://127.0.0.1:{port}/healthz", verify=trusted, timeout=2)
                break
            except httpx.TransportError:
                assert serving.poll() is None, serving.stderr.read() if serving.stderr else ""
                assert time.monotonic() < deadline, "the receiver did not answer within 30 s"
                time.sleep(0.2)
        assert answer.text == "ok"
        with pytest.raises(httpx.TransportError):  # plain http is not answered
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
        assert serving.stderr is not None
        said = b""
        while b"trigger_temporal_unavailable_at_start" not in said:  # the warm-up, logged while it serves
            line = serving.stderr.readline()
            assert line, f"the receiver exited: {said.decode()[-2000:]}"
            said += line
        assert httpx.get(f"https://127.0.0.1:{port}/healthz", verify=trusted, timeout=2).text == "ok"
    finally:
        serving.terminate()
        serving.wait(timeout=15)


async def test_the_receiver_starts_real_runs_and_answers_busy_from_the_real_start_path(env, task_queue, tmp_path,
                                                                                      monkeypatch):
    """The receiver against the real dev server: the real planner on a target's inventory file, the real starter
    (`runtime.runs.start_run`), a worker resolving the run; a second host's alert while the run holds the target is
    503 from the real single-flight check, and starts once the target is free."""
    from triggers.receiver import default_planner, temporal_starter
    from workflows.contract import ControlRequest

    targets = tmp_path / "targets"
    name = f"alerts-{task_queue[-8:]}"
    support.development_target(targets, name)
    book = support.write_runbook(tmp_path, """
        metadata: {name: alert-hold}
        target: t
        operators: [oncall]
        params:
          host: {type: string}
        steps:
          - id: hold
            approval: {prompt: "drain ${{ params.host }}?"}
    """)
    config = TriggersFile.model_validate({"version": 1, "triggers": [{
        "name": "preempted-host", "alertname": "HostPreemptionNotice", "match": {"severity": "page"},
        "runbook": str(book), "target": name, "params": {"host": "{{ labels.host }}"}}]})
    monkeypatch.setenv("TEMPORAL_ADDRESS", env.client.service_client.config.target_host)
    app = create_app(config, TOKEN, starter=temporal_starter(task_queue),
                     planner=default_planner(targets, registry=support.registry()))
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        async with support.worker(env.client, task_queue):
            started = await client.post("/alerts", json=_payload(_alert(host="c1")), headers=AUTH)
            assert started.status == 200, await started.text()
            [result] = (await started.json())["results"]
            assert (result["outcome"], result["workflow_id"]) == ("started", f"coldstart-{name}")
            handle = env.client.get_workflow_handle(result["workflow_id"])
            await support.wait_for(lambda: _awaiting(handle, "hold"))

            other = _alert(host="c2")
            other["fingerprint"] = "c2-notice"
            busy = await client.post("/alerts", json=_payload(other), headers=AUTH)
            assert busy.status == 503
            [refused] = (await busy.json())["results"]
            assert refused["outcome"] == "busy" and f"target {name} is busy" in refused["reason"]

            await handle.execute_update("abort", ControlRequest(actor="oncall", reason="test"))
            with pytest.raises(WorkflowFailureError):
                await handle.result()
            retried = await client.post("/alerts", json=_payload(other), headers=AUTH)
            assert retried.status == 200 and (await retried.json())["results"][0]["outcome"] == "started"
            status = await support.status(env.client.get_workflow_handle(f"coldstart-{name}"))
            assert status.initiator == "alertmanager:preempted-host"
            run = env.client.get_workflow_handle(f"coldstart-{name}")

            async def resolved() -> dict:  # the run shows its plan once the worker has resolved its request
                plan = await run.query("plan")
                return plan if plan["params"] else {}
            plan = await support.wait_for(resolved)
            assert plan["params"] == {"host": "c2"}
            await env.client.get_workflow_handle(f"coldstart-{name}").execute_update(
                "abort", ControlRequest(actor="oncall", reason="test done"))
    finally:
        await client.close()


async def _awaiting(handle, step: str) -> bool:
    return step in (await support.status(handle)).awaiting_approval


async def test_the_starter_connects_before_the_first_alert_and_a_temporal_down_then_is_only_logged(env, monkeypatch):
    """`triggers serve` warms its starter at start-up: the first alert finds the SDK imported and the client
    connected (one client, reused). With Temporal down then, the warm-up says so and raises nothing; a start
    then answers TemporalUnavailable, and tries to connect again."""
    from triggers.receiver import TemporalUnavailable, temporal_starter

    monkeypatch.setenv("TEMPORAL_ADDRESS", env.client.service_client.config.target_host)
    starter = temporal_starter("unused")
    assert await starter.warm() is True
    assert await starter.connect() is await starter.connect()

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setenv("TEMPORAL_ADDRESS", f"127.0.0.1:{closed.getsockname()[1]}")
        down = temporal_starter("unused")
        assert await down.warm() is False
        with pytest.raises(TemporalUnavailable, match="cannot connect to Temporal"):
            await down.connect()


def test_the_receiver_builds_the_plans_models_and_reads_its_targets_before_the_first_alert(tmp_path):
    """warm_up builds the models an action's first plan would (a deferred one here, so that nothing else built it
    first) and reads each trigger's target once; a target it cannot read is reported with why, not raised."""
    from pydantic import BaseModel, ConfigDict

    from activities.registry import Registry, declare
    from triggers.receiver import warm_up

    class Deferred(BaseModel):
        model_config = ConfigDict(defer_build=True)
        host: str

    registry = Registry()
    declare("test.deferred", Deferred, Deferred, doc="A model built on first use.", registry=registry)
    assert not Deferred.__pydantic_complete__
    (tmp_path / "lab.yaml").write_text("name: lab\ntelemetry: {prometheus: 'http://127.0.0.1:9'}\n")
    (tmp_path / "broken.yaml").write_text("name: broken\ntelemetry: {prometheus: 7}\n")
    config = TriggersFile.model_validate({"version": 1, "triggers": [
        {**CONFIG.triggers[0].model_dump(), "name": name, "target": target}
        for name, target in (("lab", "lab"), ("again", "lab"), ("broken", "broken"), ("gone", "gone"))]})

    unreadable = warm_up(config, tmp_path, registry)

    assert Deferred.__pydantic_complete__
    assert sorted(unreadable) == ["broken", "gone"]
    assert "broken.yaml:2:25: telemetry.prometheus" in unreadable["broken"] and "no inventory for target 'gone'" in unreadable["gone"]

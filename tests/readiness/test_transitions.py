"""Readiness turning red, and ready again, is one event each to the notification sinks (a real local receiver)."""

from __future__ import annotations

import asyncio
import json
import time

from runtime.notifications import Notifier, NotifyConfig, SinkConfig
from runtime.readiness.model import Report, Result
from runtime.readiness.transitions import LastStates, offer_transition
from tests.test_notifications import Receiver

COMMAND = "coldstart readiness runbooks/consul-cold-start.yaml --target lab"


def _report(*states: str) -> Report:
    results = [Result(f"check{i}", "secret", state, f"evidence of check{i}: {state}", 0.1)
               for i, state in enumerate(states)]
    return Report("consul-cold-start", "lab", time.time(), results)


def test_only_a_change_to_red_or_back_to_ready_is_an_event(tmp_path) -> None:
    states = LastStates(tmp_path / "readiness.json")
    seen: list[dict] = []
    for report in (_report("ready", "ready"), _report("ready", "not_ready"), _report("not_ready", "not_ready"),
                   _report("ready", "unknown"), _report("ready", "ready"), _report("ready", "not_ready")):
        offer_transition(report, command=COMMAND, offer=seen.append, states=states)
    assert [e["event"] for e in seen] == ["readiness_red", "readiness_ready", "readiness_red"]
    assert seen[0]["checks"] == [{"check": "check1", "evidence": "evidence of check1: not_ready"}]
    # unknown after red is neither: the red stands until every check is ready
    assert json.loads((tmp_path / "readiness.json").read_text()) == {"consul-cold-start@lab": "not_ready"}
    first = LastStates(tmp_path / "other.json")
    assert offer_transition(_report("not_ready"), command=COMMAND, offer=None, states=first) is not None


async def test_red_pages_through_alertmanager_and_slack_and_ready_resolves(tmp_path) -> None:
    manager, slack = await Receiver("accept").start(), await Receiver("accept").start()
    try:
        notifier = Notifier(NotifyConfig(sinks=[SinkConfig(name="am", kind="alertmanager", url=f"{manager.url}/api/v2/alerts"),
                                                SinkConfig(name="chat", kind="slack", url=f"{slack.url}/hook")]))
        states = LastStates(tmp_path / "readiness.json")
        offer_transition(_report("ready", "not_ready"), command=COMMAND, offer=notifier.offer, states=states)
        offer_transition(_report("ready", "ready"), command=COMMAND, offer=notifier.offer, states=states)
        await asyncio.to_thread(notifier.close, 5.0)
        fired, resolved = (json.loads(body)[0] for _, body in manager.received)
        assert fired["labels"] == {"alertname": "ColdstartReadinessRed", "runbook": "consul-cold-start",
                                   "target": "lab", "severity": "page"}
        assert "endsAt" not in fired and resolved["labels"]["alertname"] == "ColdstartReadinessRed"
        assert "endsAt" in resolved
        red_text = json.loads(slack.received[0][1])["text"]
        assert red_text.splitlines() == ["recovery path NOT READY: consul-cold-start on lab",
                                         "  check1: evidence of check1: not_ready", f"  $ {COMMAND}"]
        assert json.loads(slack.received[1][1])["text"].startswith("recovery path ready again")
    finally:
        await manager.stop()
        await slack.stop()

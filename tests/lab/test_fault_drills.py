"""Faults survived on the lab, nothing lost, nothing done twice (issue 10).

One lab for the module (csf/10.216, apart from tests/lab's cst/10.214 and the drill's csd/10.215),
one Temporal dev server on a persistent database, the real worker in a process of its own writing
the action journal. Each case runs runbooks/fault-drill.yaml through one fault and asserts
(a) the end state read back from the lab, (b) that no step ran twice (activities/journal.py),
(c) that the run's status, timeline or history tell what happened. The driver is
lab/drills/faults.py (shared with bench/faults.py).
"""

from __future__ import annotations

import subprocess
from datetime import UTC

import pytest

from tests.lab.conftest import opened

# Per test, the module's lab, server and worker start included (about 20 s); a case takes 25-100 s.
pytestmark = [pytest.mark.timeout(300), pytest.mark.lab]


@pytest.fixture(scope="module")
def drills(tmp_path_factory, loop):
    from lab.drills.faults import FAULT_LAB, FaultDrills

    yield from opened(loop, lambda: FaultDrills(tmp_path_factory.mktemp("faults")))
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not [n for n in names.splitlines() if n.startswith(FAULT_LAB["prefix"] + "-")], names


def _run(drills, loop, name):
    report = loop.run_until_complete(drills.run_case(name))
    # (a) the run finished and the lab holds its end state: DNS at the ramp's last step (read back
    # from PowerDNS), every flag and the closing key written by this run (read from Consul).
    assert report.state == "succeeded", (report.status.error if report.status else None, report.timeline_markdown)
    assert report.dns_percent_end == 40
    assert report.flags_ok and report.last_run_ok
    # (b) no step ran twice; anything interrupted was retried and finished; nothing left dangling.
    assert report.repeats == [], [str(r) for r in report.repeats]
    assert report.journal.unfinished == []
    assert all(outcome == "ok" for _, _, _, outcome in report.journal.interrupted_retried)
    players = next(s for s in report.status.steps if s.id == "players")
    assert players.last_good == 40 and players.percent == 40
    return report, players


def _entries(report, event):
    return [e for e in report.timeline.entries if e.event == event]


def test_worker_killed_mid_ramp(drills, loop):
    report, players = _run(drills, loop, "worker-killed-mid-ramp")
    journal = report.journal
    killed, new = report.notes["killed_pid"], report.notes["new_pid"]
    workers = {a.worker.split("@")[0] for a in journal.attempts}
    assert {str(killed), str(new)} <= workers
    # The 40 % set ran once, on the new worker; the 20 % set once, on the killed one.
    sets = {a.activity_id.split("#")[0]: a for a in journal.attempts if a.activity_type == "dns.steer.set"}
    assert sets["players@20"].worker.startswith(f"{killed}@") and sets["players@40"].worker.startswith(f"{new}@")
    assert len([a for a in journal.attempts if a.activity_type == "dns.steer.set"]) == 2
    assert players.attempts == 1  # the step was not restarted, the run went on where it was
    # (c) the history says another worker took the run over.
    took_over = [f for f in report.history if f.kind == "worker took over"]
    assert took_over and took_over[0].who.startswith(f"{new}@")
    # It moved again; how soon is bench/faults.py's figure (seconds), the bound only catches a stall.
    assert report.recovery_s is not None and report.recovery_s < 300


def test_worker_killed_mid_fan_out(drills, loop):
    report, _ = _run(drills, loop, "worker-killed-mid-fan-out")
    journal = report.journal
    flags = [a for a in journal.attempts if a.activity_id.startswith("flags[")]
    # Every item completed ok exactly once (the interrupted ones on a later attempt of the same id).
    ok = [a.activity_id for a in flags if a.outcome == "ok"]
    assert sorted(ok) == sorted(set(ok)) and len(ok) == 40
    # The kill landed with writes in flight: each is reported as interrupted and retried, not repeated.
    assert report.notes["in_flight_at_kill"] > 0
    assert len(journal.interrupted_retried) == report.notes["in_flight_at_kill"], journal.summary()
    for activity_id, attempt, retry_attempt, outcome in journal.interrupted_retried:
        assert activity_id.startswith("flags[") and retry_attempt > attempt and outcome == "ok"
    # (c) the history shows the retry of the interrupted item (its RetryPolicy, after the timeout) and
    # the new worker taking the run over.
    retried = [f for f in report.history if f.kind == "activity retried"]
    assert {f.detail.split()[0] for f in retried} >= {a for a, *_ in journal.interrupted_retried}
    assert any("timeout" in f.detail.lower() for f in retried)
    assert [f for f in report.history if f.kind == "worker took over"]


def test_temporal_server_restarted(drills, loop):
    report, players = _run(drills, loop, "temporal-server-restarted")
    assert players.attempts == 1
    assert report.journal.interrupted_retried == []
    # (c) the timeline has nothing from the outage and goes on after it, every step once; a workflow
    # task the server lost with its process shows in the history as timed out and given again, and one the
    # restarted server refused for events that came in meanwhile (UnhandledCommand) as superseded: none failed.
    down, up = report.notes["down_at"], report.notes["up_at"]
    at = [e.at.replace(tzinfo=UTC) for e in report.timeline.entries]
    assert not [t for t in at if down < t < up] and [t for t in at if t > up]
    assert len([e for e in _entries(report, "action completed") if e.step == "players"]) == 2
    benign = ("workflow task timed out", "workflow task superseded")
    assert all(f.kind in benign for f in report.history), report.history
    # It moved again; how soon is bench/faults.py's figure (seconds), the bound only catches a stall.
    assert report.recovery_s is not None and report.recovery_s < 300


def test_prometheus_down_during_gate(drills, loop):
    report, players = _run(drills, loop, "prometheus-down-during-gate")
    down, up = report.notes["down_at"], report.notes["up_at"]
    readings = [r for r in players.readings if r.percent == 20]
    failed_closed = [r for r in readings if r.error]
    # The gate held while Prometheus was down: readings with an error and no value, none passed...
    assert len(failed_closed) >= 3 and all(not r.passed and r.value is None for r in failed_closed)
    assert not [r for r in readings if r.passed and down < r.at < up]
    # ...and passed once it was back, without a hold or a retry: the step ran once.
    assert [r for r in readings if r.passed and r.at > up]
    assert players.attempts == 1
    assert not _entries(report, "retry (update)")
    # (c) the timeline has the failed readings with their error.
    errors = [e for e in report.timeline.entries if e.event == "gate reading" and e.outcome == "error"]
    assert len(errors) >= 3 and "no value" in errors[0].detail


def test_vault_down_when_a_step_needs_a_token(drills, loop):
    report, players = _run(drills, loop, "vault-down-when-a-step-needs-a-token")
    # Failed closed: the 40 % set could not read its TSIG key; DNS stayed at 20 % (read back).
    assert report.dns_percent_during == 20
    assert "8200" in (report.held_error or "") and "dns.steer.set" in report.held_error
    # Retried twice over: by the activity RetryPolicy (5 attempts of one activity id, all failed,
    # Vault still down), then held, and retried by drill-bot once Vault was back (a new activity
    # for the same step label, allowed because the first failed).
    journal = report.journal
    first = [a for a in journal.attempts if a.activity_id.startswith("players@40#") and a.outcome == "failed"]
    assert len(first) == 5 and len({a.activity_id for a in first}) == 1
    assert ("players@40", "retried after failure") in {(label, why) for label, _, why in journal.rescheduled}
    assert players.attempts == 2
    retries = _entries(report, "retry (update)")
    assert [e.actor for e in retries] == ["drill-bot"]
    failed = [e for e in _entries(report, "action failed") if e.step == "players"]
    assert failed and "8200" in failed[0].detail
    assert any(f.kind == "activity retried" and "attempt 5" in f.detail for f in report.history)


def test_powerdns_down_during_ramp_step(drills, loop):
    report, players = _run(drills, loop, "powerdns-down-during-ramp-step")
    # The 40 % set failed with PowerDNS down; read back once it was up, before the retry: still 20 %.
    assert report.dns_percent_during == 20
    assert "10.216.0.40:53" in (report.held_error or "")
    assert players.attempts == 2
    actors = {(e.event, e.actor) for e in report.timeline.entries if e.event.endswith("(update)")}
    assert {("pause (update)", "drill-bot"), ("resume (update)", "drill-bot"), ("retry (update)", "drill-bot")} <= actors
    failed = [e for e in _entries(report, "action failed") if e.step == "players"]
    assert failed and "53" in failed[0].detail


def test_gate_fails_mid_ramp(drills, loop):
    report, players = _run(drills, loop, "gate-fails-mid-ramp")
    # The admitted-players gate failed at 40 %, the ramp stepped back to 20 % (read back from DNS)
    # and held, saying why and whether the fallback is healthy.
    assert report.dns_percent_during == 20
    assert "at 40%" in report.held_error and "admitted-on-target" in report.held_error
    assert "stepped back to 20%" in report.held_error
    at_40 = [r for r in players.readings if r.percent == 40 and r.gate == "admitted-on-target"]
    assert at_40 and not at_40[0].passed
    # The step-back and the forward set after the retry reuse step labels: the journal says why.
    whys = {(label, why) for label, _, why in report.journal.rescheduled}
    assert ("players@20", "ramp step-back after a failed gate") in whys
    assert ("players@40", "ramp forward again after a step-back") in whys
    assert [e.actor for e in _entries(report, "retry (update)")] == ["drill-bot"]
    assert players.attempts == 2
    # The timeline names the step-back as one (the history's tag says the gate failed), the others as actions.
    sets = [e for e in report.timeline.entries
            if e.step == "players" and e.event in ("action completed", "step-back completed")]
    assert [e.event for e in sets] == ["action completed", "action completed", "step-back completed",
                                       "action completed"], [(e.event, e.detail) for e in sets]  # 20, 40, 20, 40
    assert sets[2].detail.startswith("to 20% after a failed gate: "), sets[2].detail


def test_a_task_the_server_refused_for_new_events_is_superseded_not_failed():
    """No lab: a history read back as the restart case sees it. UnhandledCommand (events came in while the task ran)
    is Temporal asking for the task again; any other cause is a failed workflow task."""
    import asyncio
    from types import SimpleNamespace

    from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
    from temporalio.api.history.v1 import History, HistoryEvent

    from lab.drills.faults import history_facts

    def failed(event_id: int, cause: int, message: str) -> HistoryEvent:
        event = HistoryEvent(event_id=event_id, event_type=EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
        event.event_time.GetCurrentTime()
        event.workflow_task_failed_event_attributes.cause = cause  # pyright: ignore[reportAttributeAccessIssue]
        event.workflow_task_failed_event_attributes.failure.message = message
        return event

    history = History(events=[
        failed(1, WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND, "UnhandledCommand"),
        failed(2, WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_NON_DETERMINISTIC_ERROR, "nondeterminism"),
    ])

    async def fetch_history():
        return SimpleNamespace(events=history.events)

    client = SimpleNamespace(get_workflow_handle=lambda *_, **__: SimpleNamespace(fetch_history=fetch_history))
    facts = asyncio.run(history_facts(client, "wf"))
    assert [(f.kind, f.detail) for f in facts] == [("workflow task superseded", "UnhandledCommand"),
                                                   ("workflow task failed", "nondeterminism")]

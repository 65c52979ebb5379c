"""The preempted-host drill on the lab (issue 12): a notice, nothing typed, the host drained inside it.

A lab of its own (csp/10.217, scraped every second) with 12 session containers on the container
host, the real Temporal dev server, worker, Alertmanager and `coldstart triggers serve`. The
preemption notice fires HostPreemptionNotice; Alertmanager posts it; the trigger starts
runbooks/preempted-host-drain.yaml; the test asserts what the lab holds afterwards (no container,
no store entry of the host, the router's stuck episodes ended), that nothing ran twice, and that a
second round on a fresh host works the same. The driver is lab/drills/drain.py (bench/drain.py
runs it with 200 containers).
"""

from __future__ import annotations

import pytest

from tests.lab.conftest import opened

pytestmark = [pytest.mark.timeout(600), pytest.mark.lab]

CONTAINERS = 12


@pytest.fixture(scope="module")
def drill(tmp_path_factory, loop):
    from lab.drills.drain import DrainDrill

    yield from opened(loop, lambda: DrainDrill(tmp_path_factory.mktemp("drain"), containers=CONTAINERS, log=print))


def test_notice_drains_the_host_through_alert_trigger_and_runbook(drill, loop):
    report = loop.run_until_complete(drill.round())
    assert report.state == "succeeded", report.error
    # Started by the alert, not by a person.
    assert report.run_initiator == "alertmanager:preempted-host"
    assert report.killed == CONTAINERS and report.released == CONTAINERS
    # The lab agrees: no container process left, no store entry of the host, nothing stuck any more.
    assert report.containers_left == 0 and report.entries_left == 0
    # A session is stuck from its container's death to its entry's release: the router (polling every
    # 0.25 s) may not even see it. Each episode it saw has ended (the histogram observes an episode when it ends),
    # at most one per container, and none is stuck now: the release ended them. How long they lasted is
    # bench/drain.py's figure, not a verdict on a loaded machine.
    stuck = report.histogram_after.minus(report.histogram_before)
    sessions = loop.run_until_complete(drill.router_sessions())
    assert stuck.count <= CONTAINERS and not sessions["stuck"], (stuck, sessions)
    # Inside the notice, with room to spare (the runbook's margin is 2 s).
    assert report.notice_to_drained_s is not None and report.notice_to_drained_s < report.notice_s - 2
    assert report.repeats == [] and report.journal.unfinished == []


def test_a_second_notice_on_the_replaced_host_drains_it_again_and_a_cordoned_host_takes_no_container(drill, loop):
    import httpx

    report = loop.run_until_complete(drill.round())
    assert report.state == "succeeded", report.error
    assert report.killed == CONTAINERS and report.released == CONTAINERS
    assert report.containers_left == 0 and report.entries_left == 0 and report.repeats == []
    # One run per notice: Alertmanager's repeats of a firing are answered from the trigger's memory.
    assert loop.run_until_complete(_runs(drill)) == 2
    # The runbook cordoned the host: the platform refuses to place a container there.
    r = httpx.post(f"{drill.agent}/containers/start", json={"repls": ["r9999"]}, timeout=30)
    assert r.status_code == 409 and "cordoned" in r.json()["error"]


def test_the_replaced_host_frees_the_entries_its_old_containers_left_and_only_those(drill, loop):
    """A set-up cut short (a graceful stop that timed out under load, say) leaves entries pointing at containers
    the replaced host no longer runs, and every later start of those repls is refused (409). The host's reset
    frees them; another host's entry stays."""
    import json

    import httpx

    from lab.services import Secrets

    kv = f"{drill.cfg.consul_url}/v1/kv/{drill.cfg.session_store_prefix}repls"
    headers = {"X-Consul-Token": Secrets(drill.cfg).read("consul-token")}
    for repl, host in (("r0777", drill.cfg.container_host), ("r0778", "cache1")):
        entry = {"repl": repl, "container": f"{host}-{repl}", "host": host}
        httpx.put(f"{kv}/{repl}", content=json.dumps(entry), headers=headers, timeout=10).raise_for_status()
    try:
        refused = httpx.post(f"{drill.agent}/containers/start", json={"repls": ["r0777"]}, timeout=30)
        assert refused.status_code == 409  # cordoned by the last round, and held by the stale entry
        answer = httpx.post(f"{drill.agent}/_lab/reset", timeout=30).json()
        assert answer["stale_entries_released"] == 1 and answer["cordoned"] is False
        assert loop.run_until_complete(drill.store_entries()) == 0
        assert httpx.get(f"{kv}/r0778", headers=headers, timeout=10).status_code == 200
    finally:
        httpx.delete(f"{kv}/r0778", headers=headers, timeout=10)


async def _runs(drill) -> int:
    from runtime.runs import workflow_id_for

    count = 0
    async for _ in drill.client.list_workflows(f"WorkflowId = '{workflow_id_for('lab')}'"):
        count += 1
    return count

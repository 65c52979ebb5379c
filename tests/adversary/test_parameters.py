"""What a starter's parameters may choose, and what an approver is shown before a change."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from activities.catalog import load_registry
from tests import support
from workflows.loader import RunbookInvalid, plan_run

ROOT = Path(__file__).resolve().parents[2]
COLD_START = ROOT / "runbooks" / "consul-cold-start.yaml"
CASES = ROOT / "runbooks" / "cases" / "consul-cold-start.yaml"

# Objects the cold-start runbook destroys or overwrites: where the forensic snapshot (every ACL token) goes,
# the KV prefix deleted, the job redeployed from scratch, the rows written into the cache.
_DESTRUCTIVE = {"forensics_dir", "scheduling_prefix", "cache_job", "cache_port_label", "warm_query"}


def _case_inventory() -> dict:
    return yaml.safe_load(CASES.read_text())["target"]


def test_the_cold_start_runbook_takes_what_it_destroys_from_the_inventory_not_from_parameters():
    params = yaml.safe_load(COLD_START.read_text())["params"]
    assert not _DESTRUCTIVE & set(params), sorted(_DESTRUCTIVE & set(params))
    free_text = sorted(name for name, spec in params.items()
                       if (spec or {}).get("type", "string") == "string" and not (spec or {}).get("one_of")
                       and name != "incident_start")
    assert free_text == [], f"free-text parameters: {free_text}"


@pytest.mark.parametrize("name", sorted(_DESTRUCTIVE))
def test_a_starter_cannot_point_a_destructive_step_elsewhere(name):
    with pytest.raises(RunbookInvalid) as refused:
        plan_run(COLD_START, registry=load_registry(), inventory=_case_inventory(), initiator="mallory", drill=True,
                 params={"incident_start": "2021-10-28T13:37:00+00:00", "slow_servers": ["consul-2"], name: "/etc"})
    assert name in str(refused.value)


def test_the_cold_start_plan_acts_on_the_inventorys_facts():
    inventory = _case_inventory()
    run = plan_run(COLD_START, registry=load_registry(), inventory=inventory, initiator="sre-oncall", drill=True,
                   params={"incident_start": "2021-10-28T13:37:00+00:00", "slow_servers": ["consul-2"]})
    steps = {step.id: step for step in run.runbook.steps}
    facts = inventory["facts"]
    assert steps["forensic-snapshot"].with_["directory"] == facts["forensics_dir"]
    assert steps["purge-scheduling"].with_["prefix"] == facts["cache_scheduling_prefix"]
    assert steps["redeploy-cache"].with_["job"] == facts["cache_job"]
    assert steps["warm-cache"].with_["query"] == facts["cache_warm_query"]


async def test_an_approval_before_a_change_shows_the_inputs_the_change_will_act_on(env, task_queue, tmp_path):
    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: shown}}
        target: t
        approvers: [bob]
        params:
          label: {{type: string, one_of: [blue, green], default: green}}
        steps:
          - id: go
            approval: {{prompt: "change it?"}}
          - id: change
            action: test.append
            with: {{path: "{out}", label: "${{{{ params.label }}}}"}}
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)

        async def awaiting():
            status = await support.status(handle)
            return next((s.awaiting for s in status.steps if s.id == "go" and s.awaiting), None)
        shown = await support.wait_for(awaiting, timeout=30)
        await handle.terminate("seen")
    assert shown.startswith("change it?; then change runs test.append with ")
    assert f'"path": "{out}"' in shown and '"label": "green"' in shown
    assert not out.exists()

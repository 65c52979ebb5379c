"""Alert-started runs verify before they destroy: a host the inventory lacks, or a deadline already past or
implausibly far ahead, plans nothing, so the drain's on_miss (release without asking the host) never fires."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from activities.catalog import load_registry
from runtime.catalog import Catalog, CatalogRefused
from triggers.receiver import default_planner
from workflows.loader import RunbookInvalid, plan_run

DRAIN = Path("runbooks/preempted-host-drain.yaml")


@pytest.fixture
def targets(tmp_path: Path) -> Path:
    """A target with two container hosts, c1 and c2, and what the drain runbook references."""
    inventory = {
        "name": "fleet",
        "telemetry": {"prometheus": "http://127.0.0.1:9"},
        "consul": {"address": "http://127.0.0.1:8500"},
        "groups": {"container_hosts": [{"name": h, "kind": "netns", "netns": f"ns-{h}"} for h in ("c1", "c2")]},
        "facts": {"sessions": {"store_prefix": "sessions/", "cgroup_parent": "coldstart",
                               "metadata": {h: f"http://10.0.0.1/{h}" for h in ("c1", "c2")}}},
    }
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(inventory))
    return tmp_path


def _params(host: str, ahead: float) -> dict[str, str]:
    return {"host": host, "deadline": f"{time.time() + ahead:.3f}"}


def _plan(targets: Path, host: str, ahead: float):
    planner = default_planner(targets, registry=load_registry())
    return planner(DRAIN, params=_params(host, ahead), target="fleet", initiator="alertmanager:t")


def test_a_notice_for_a_host_in_the_inventory_plans(targets):
    run = _plan(targets, "c2", 30)
    assert run.params["host"] == "c2" and run.runbook.deadline is not None


@pytest.mark.parametrize("host, ahead, said", [
    ("c9", 30, "parameter 'host': 'c9' is not one of c1, c2"),
    ("c1", -5, "is already 5s past: nothing is started"),
    # deadline=1, the attack in the review (an id of its own: the offset changes every run, and test
    # workers must collect the same ids)
    pytest.param("c1", 1.0 - time.time(), "past: nothing is started", id="c1-epoch-past"),
    ("c1", 6 * 3600, "is 6h ahead, more than max_ahead (15m): nothing is started"),
])
def test_an_unknown_host_or_an_implausible_deadline_plans_nothing(targets, host, ahead, said):
    with pytest.raises(RunbookInvalid) as refused:
        _plan(targets, host, ahead)
    assert any(said in line for line in refused.value.errors), refused.value.errors
    assert all(line.startswith(f"{DRAIN}:") for line in refused.value.errors)


def test_the_worker_refuses_them_too_whatever_the_starter_planned(targets):
    """The catalog re-plans on the worker: a request that skipped the planner's checks is refused there."""
    catalog = Catalog(Path("runbooks"), targets)
    good = _plan(targets, "c1", 30)
    assert catalog.resolve(good.request, load_registry()).params["host"] == "c1"
    forged = good.request.model_copy(update={"params": _params("c9", 30)})
    with pytest.raises(CatalogRefused, match="'c9' is not one of c1, c2"):
        catalog.resolve(forged, load_registry())
    past = good.request.model_copy(update={"params": {"host": "c1", "deadline": "1"}})
    with pytest.raises(CatalogRefused, match="past: nothing is started"):
        catalog.resolve(past, load_registry())


def test_one_of_a_list_and_a_mapping(tmp_path):
    book = tmp_path / "choices.yaml"
    book.write_text("""\
metadata: {name: choices}
target: t
params:
  colour: {type: string, one_of: [red, green]}
  host: {type: string, one_of: "${{ target.hosts }}"}
steps:
  - {id: say, action: core.note, with: {message: "${{ params.colour }} ${{ params.host }}"}}
""")
    inventory = {"name": "t", "hosts": {"h1": {"address": "10.0.0.1"}}}
    assert plan_run(book, registry=load_registry(), inventory=inventory, params={"colour": "red", "host": "h1"})
    with pytest.raises(RunbookInvalid) as refused:
        plan_run(book, registry=load_registry(), inventory=inventory, params={"colour": "blue", "host": "h2"})
    assert [line.split(": ", 1)[1] for line in refused.value.errors] == [
        "parameter 'colour': 'blue' is not one of red, green", "parameter 'host': 'h2' is not one of h1"]

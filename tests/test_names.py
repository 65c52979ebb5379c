"""Target and runbook names are names, never paths: refused wherever they enter (the run request, the catalog, the
CLI, a trigger, a schedule, a fleet) with one line naming the value and the pattern, and no inventory is read from
outside the targets directory, whatever a starter sends."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from pydantic import ValidationError

from cli.fleet import FleetInvalid, wave_of
from cli.schedules import schedule_id_for
from runtime.catalog import Catalog, CatalogRefused
from tests import support
from triggers.receiver import Trigger, TriggersFile, create_app, default_planner
from workflows.contract import RunRequest
from workflows.loader import load_inventory, read_inventory, runbook_digest
from workflows.names import NAME_PATTERN, NameRefused, check_name, named_file
from workflows.readiness import ReadinessRequest
from workflows.yaml_safety import load_file

REPO = Path(__file__).resolve().parents[1]

MINE = """\
metadata: {name: mine}
target: any
steps:
  - id: say
    action: core.note
    with: {message: hello}
"""

# Beside the catalog, where a name taken as a path would lead: each inventory marked `development: true`, as a
# local user could write one, so that reaching it would run the starter's own runbook.
DEVELOPMENT = "development: true\ntelemetry: {prometheus: 'http://127.0.0.1:9'}\n"


@pytest.fixture
def escapes(tmp_path: Path) -> tuple[Path, list[str]]:
    """A targets directory, and the names that reach an inventory outside it: an absolute path (/elsewhere/x),
    a parent (../x), a subdirectory (a/b) and the empty name (targets/.yaml)."""
    targets = tmp_path / "targets"
    (targets / "a").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.yaml").write_text("name: x\n" + DEVELOPMENT)
    (tmp_path / "x.yaml").write_text("name: x\n" + DEVELOPMENT)
    (targets / "a" / "b.yaml").write_text("name: b\n" + DEVELOPMENT)
    (targets / ".yaml").write_text("name: hidden\n" + DEVELOPMENT)
    return targets, [str(tmp_path / "elsewhere" / "x"), "../x", "a/b", ""]


def _one_line(message: str, value: str) -> None:
    """A refusal: one line, naming the value and the pattern."""
    assert "\n" not in message and repr(value[:80]) in message and NAME_PATTERN in message, message


def _request(**fields: Any) -> dict[str, Any]:
    return {"runbook": "mine", "digest": runbook_digest(MINE), "text": MINE, "source": "mine.yaml", "target": "t",
            "initiator": "alice", **fields}


# ---- the models that cross Temporal ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["/elsewhere/x", "../x", "a/b", "", ".hidden", "x\n", "x y", "a" * 129])
def test_a_request_naming_no_target_is_refused_by_the_model(name):
    with pytest.raises(ValidationError) as refused:
        RunRequest.model_validate(_request(target=name))
    [error] = refused.value.errors()
    assert error["loc"] == ("target",)
    _one_line(error["msg"].removeprefix("Value error, "), name)


@pytest.mark.parametrize("name", ["/elsewhere/x", "../x", "a/b", ""])
def test_a_request_naming_no_runbook_is_refused_by_the_model(name):
    with pytest.raises(ValidationError) as refused:
        RunRequest.model_validate(_request(runbook=name))
    [error] = refused.value.errors()
    assert error["loc"] == ("runbook",)
    _one_line(error["msg"].removeprefix("Value error, "), name)


@pytest.mark.parametrize(("field", "name"), [("target", "/elsewhere/x"), ("target", "../x"), ("runbook", "a/b"),
                                             ("runbook", "")])
def test_a_scheduled_readiness_check_names_its_runbook_and_target(field, name):
    with pytest.raises(ValidationError) as refused:
        ReadinessRequest.model_validate({"runbook": "demo", "target": "local", field: name})
    _one_line(refused.value.errors()[0]["msg"].removeprefix("Value error, "), name)
    with pytest.raises(NameRefused):
        schedule_id_for(*(("demo", name) if field == "target" else (name, "local")))


def test_every_name_the_repository_and_its_tests_use_is_a_name():
    """The pattern takes what is there: the catalogued runbooks, the shipped targets, the tests' and benches' own."""
    catalog = Catalog(REPO / "runbooks", REPO / "targets")
    assert catalog.runbooks()
    for entry in catalog.runbooks().values():
        check_name("runbook", entry.name)
    for path in (REPO / "targets").glob("*.yaml"):
        check_name("target", path.stem)
        check_name("target", (load_file(path) or {}).get("name", path.stem))
    queue = f"tq-{uuid.uuid4()}"
    for name in (f"t-{queue}", f"prod-{queue}-2", f"oncall-{uuid.uuid4().hex[:8]}-approvals", "soak-000",
                 "replay-everything", "play.elsewhere.lab", "Local_1", "a" * 128):
        assert check_name("target", name) == name


# ---- the catalog --------------------------------------------------------------------------------

def test_the_catalog_reads_no_inventory_outside_its_directory(escapes):
    targets, names = escapes
    catalog = Catalog(None, targets)
    for name in names:
        with pytest.raises(CatalogRefused) as refused:
            catalog.inventory(name)
        _one_line(str(refused.value), name)
    assert catalog.warm().targets_refused.keys() == {".yaml"}  # targets/.yaml is no target's file


def test_a_request_that_skipped_the_models_checks_is_refused_at_resolution(escapes):
    """The worker resolves what arrives: a request built without validation (as raw JSON can be) naming an inventory
    outside the catalog, marked development: true there, runs nothing of the starter's."""
    targets, names = escapes
    catalog = Catalog(targets.parent / "no-runbooks", targets)
    for name in names:
        # The inventory it brings is the one it reached, so nothing but the name stands in its way.
        reached = read_inventory(targets / f"{name}.yaml", default_name=name).as_target()
        request = RunRequest.model_construct(**_request(target=name, inventory=reached, params={}, drill=False,
                                                        identity_token=None))
        with pytest.raises(CatalogRefused) as refused:
            catalog.resolve(request, support.registry(), "coldstart-x")
        _one_line(str(refused.value), name)


def test_a_file_named_by_a_name_stays_in_its_directory(tmp_path):
    linked = tmp_path / "linked.yaml"
    linked.symlink_to(tmp_path.parent)  # the operator's own link is theirs to place; the name only names it
    assert named_file(tmp_path, "target", "linked") == linked
    for name in ("../x", "/x", "a/b", "", "."):
        with pytest.raises(NameRefused):
            named_file(tmp_path, "target", name)


# ---- the CLI ------------------------------------------------------------------------------------

def _cli(targets: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False,
                          env={**os.environ, "COLDSTART_TARGETS": str(targets), "TEMPORAL_ADDRESS": "127.0.0.1:1"})


def test_the_cli_refuses_a_target_that_is_no_name(escapes, tmp_path):
    """validate and run --target, before anything is read or started (exit 2, one line): not the inventory outside
    the directory, not a connection attempt (this Temporal is unreachable, which would be exit 4)."""
    targets, names = escapes
    book = tmp_path / "mine.yaml"
    book.write_text(MINE)
    outside, parent = names[0], names[1]
    for args in (("validate", str(book), "--target", outside), ("run", str(book), "--target", parent)):
        result = _cli(targets, *args)
        assert result.returncode == 2, (args, result.returncode, result.stderr)
        [line] = result.stderr.splitlines()
        assert line.startswith("error: "), line
        _one_line(line, args[-1])


def test_drill_schedule_names_a_runbook_not_a_path(tmp_path):
    """`coldstart drill schedule NAME` reads runbooks/NAME.yaml: an absolute NAME is refused, not read (the plan
    would succeed and the schedule be made with this unreachable Temporal's exit 4)."""
    (tmp_path / "lab.yaml").write_text("name: lab\ndrill: true\n" + DEVELOPMENT)
    (tmp_path / "evil.yaml").write_text(MINE.replace("target: any", "target: lab"))
    result = _cli(tmp_path, "drill", "schedule", str(tmp_path / "evil"), "--cron", "0 0 * * *")
    assert result.returncode == 2, (result.returncode, result.stderr)
    [line] = result.stderr.splitlines()
    _one_line(line, str(tmp_path / "evil"))


def test_a_fleet_names_its_targets():
    for name in ("/elsewhere/x", "../x", "a/b", ""):
        with pytest.raises(FleetInvalid) as refused:
            wave_of(["t-1", name], None)
        assert str(refused.value).startswith("--targets: ")
        _one_line(str(refused.value), name)


# ---- a trigger ----------------------------------------------------------------------------------

def test_a_triggers_file_names_its_targets_with_the_same_pattern(tmp_path):
    for name in ("a" * 129, "../x", "a/b", ""):
        with pytest.raises(ValidationError) as refused:
            Trigger.model_validate({"name": "t", "alertname": "A", "runbook": "runbooks/demo.yaml", "target": name})
        _one_line(refused.value.errors()[0]["msg"].removeprefix("Value error, "), name)


def test_the_trigger_planner_reads_no_inventory_outside_its_directory(escapes, tmp_path):
    targets, names = escapes
    book = tmp_path / "mine.yaml"
    book.write_text(MINE)
    planner = default_planner(targets, registry=support.registry())
    for name in names:
        with pytest.raises(NameRefused) as refused:
            planner(book, params={}, target=name, initiator="alertmanager:t")
        _one_line(str(refused.value), name)
        with pytest.raises(NameRefused):
            load_inventory(name, targets)


async def test_an_alert_whose_trigger_names_no_target_starts_nothing(escapes, tmp_path):
    """The receiver's own path (a trigger built without the file's checks): the alert is answered invalid with the
    refusal, and nothing is started."""
    targets, names = escapes
    book = tmp_path / "mine.yaml"
    book.write_text(MINE)
    started: list[Any] = []

    async def starter(run: Any) -> str:
        started.append(run)
        return "coldstart-x"

    trigger = Trigger.model_construct(name="t", alertname="A", match={}, runbook=book, target=names[0], params={})
    config = TriggersFile.model_construct(version=1, triggers=[trigger])
    client = TestClient(TestServer(create_app(config, "token", starter=starter,
                                              planner=default_planner(targets, registry=support.registry()))))
    await client.start_server()
    try:
        answer = await client.post("/alerts", headers={"Authorization": "Bearer token"}, json={
            "version": "4", "status": "firing", "alerts": [{"status": "firing", "labels": {"alertname": "A"}}]})
        [result] = (await answer.json())["results"]
    finally:
        await client.close()
    assert answer.status == 422 and result["outcome"] == "invalid", result
    _one_line(result["errors"][0], names[0])
    assert started == []

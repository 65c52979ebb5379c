"""The controller's catalog on a real dev server: a run executes what the worker's catalog holds, or nothing."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError

from activities.catalog import load_registry
from cli.timeline import build_timeline, render_markdown
from runtime import catalog as catalog_module
from runtime.action_versions import catalog_build_id
from runtime.catalog import Catalog, CatalogRefused
from runtime.runs import start_run
from runtime.version import controller_version
from runtime.worker import warm_up
from tests import support
from workflows.contract import (
    RESOLVE_RUN_ACTIVITY,
    ApproveRequest,
    ControlRequest,
    RunInput,
    RunRequest,
    RunStart,
    RunStatus,
)
from workflows.loader import plan_run, runbook_digest
from workflows.runbook_workflow import RunbookWorkflow

GUARDED = """\
metadata: {name: guarded}
target: prod
approvers: [alice, bob]
four_eyes: true
steps:
  - id: go
    approval: {prompt: "change it?"}
  - id: change
    action: test.append
    with: {path: "OUT", label: "changed"}
"""


@pytest.fixture
def catalog(tmp_path: Path, task_queue: str):
    """A catalog with one runbook (an approval before a mutating step), production targets PROD and PROD-2 and
    a development target DEV, named for the test (a target holds one run at a time); development targets are
    allowed, as in a worker started with --allow-development."""
    runbooks, targets = tmp_path / "catalog", tmp_path / "targets"
    runbooks.mkdir()
    targets.mkdir()
    out = tmp_path / "out.txt"
    (runbooks / "guarded.yaml").write_text(GUARDED.replace("OUT", str(out)))
    for name, extra in ((PROD, ""), (DEV, "development: true\n"), (PROD + "-2", "")):
        (targets / f"{name}{task_queue}.yaml").write_text(
            f"name: {name}{task_queue}\n{extra}telemetry: {{prometheus: 'http://127.0.0.1:9'}}\n")
    return Catalog(runbooks, targets, allow_development=True), out


PROD, DEV = "prod-", "dev-"


def _inventory(catalog: Catalog, name: str) -> dict:
    return catalog.inventory(name)


async def _activities(handle) -> list[str]:
    names = []
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            names.append(event.activity_task_scheduled_event_attributes.activity_type.name)
    return names


async def _refusal(handle) -> str:
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    return str(failed.value.cause)


async def _start(env, task_queue, file: Path, catalog: Catalog, target: str, *, inventory: dict | None = None,
                 text: str | None = None):
    run = plan_run(file, registry=support.registry(), inventory=inventory or _inventory(catalog, target),
                   initiator="carol", text=text)
    return await start_run(env.client, run, task_queue)


async def test_a_catalogued_runbook_runs_and_its_status_records_the_version(env, task_queue, catalog):
    cat, out = catalog
    file = cat.runbooks_dir / "guarded.yaml"
    async with support.worker(env.client, task_queue, catalog=cat):
        handle = await _start(env, task_queue, file, cat, PROD + task_queue)
        await support.wait_for(lambda: _awaiting(handle))
        state = await support.status(handle)
        assert state.runbook_digest == runbook_digest(file.read_text())
        assert state.runbook_origin == "catalog"
        # Which controller resolved it: its version and its actions' contracts.
        assert (state.controller_version, state.contracts_digest) == (controller_version(),
                                                                      catalog_build_id(support.registry()))
        await handle.terminate()
    timeline = await build_timeline(env.client, handle.id)
    assert (timeline.runbook_digest, timeline.runbook_origin) == (state.runbook_digest, "catalog")
    assert (timeline.controller, timeline.contracts) == (state.controller_version, state.contracts_digest)
    assert f"- runbook version: `{state.runbook_digest}` (catalog)" in render_markdown(timeline)
    assert f"- controller: coldstart {controller_version()}, actions `{state.contracts_digest}`" in render_markdown(timeline)
    assert any(e.event == "runbook resolved" and str(cat.runbooks_dir / "guarded.yaml") in e.detail
               for e in timeline.entries)
    assert not out.exists()


def _uncatalogued(tmp_path: Path, name: str, out: Path) -> Path:
    """A runbook of the starter's own, not in the catalog: one mutating step."""
    return support.write_runbook(tmp_path, f"""
        metadata: {{name: {name}}}
        target: any
        steps:
          - id: change
            action: test.append
            with: {{path: "{out}", label: "changed"}}
    """, name=name)


async def _awaiting(handle) -> bool:
    state: RunStatus = await support.status(handle)
    return "go" in state.awaiting_approval


async def test_a_modified_copy_without_its_approval_is_refused_before_any_action(env, task_queue, catalog, tmp_path):
    cat, out = catalog
    text = (cat.runbooks_dir / "guarded.yaml").read_text()
    # The attack: the same runbook, its approval, approvers and four eyes deleted.
    data = yaml.safe_load(text)
    for key in ("approvers", "four_eyes"):
        data.pop(key)
    data["steps"] = [s for s in data["steps"] if s["id"] != "go"]
    copy = tmp_path / "guarded-copy.yaml"
    copy.write_text(yaml.safe_dump(data))
    async with support.worker(env.client, task_queue, catalog=cat):
        handle = await _start(env, task_queue, copy, cat, PROD + task_queue)
        message = await _refusal(handle)
        assert await _activities(handle) == [RESOLVE_RUN_ACTIVITY]
    assert "is a modified copy" in message and "guarded.yaml" in message and "\n" not in message
    assert not out.exists()


async def test_a_runbook_outside_the_catalog_is_refused(env, task_queue, catalog, tmp_path):
    cat, out = catalog
    other = _uncatalogued(tmp_path, "stranger", out)
    async with support.worker(env.client, task_queue, catalog=cat):
        handle = await _start(env, task_queue, other, cat, PROD + task_queue)
        message = await _refusal(handle)
        assert await _activities(handle) == [RESOLVE_RUN_ACTIVITY]
    assert "'stranger'" in message and "is not in the controller's catalog" in message
    assert not out.exists()


async def test_a_run_that_brings_other_endpoints_is_refused(env, task_queue, catalog):
    cat, out = catalog
    inventory = {**_inventory(cat, PROD + task_queue), "telemetry": {"prometheus": "http://attacker.invalid:9090"}}
    async with support.worker(env.client, task_queue, catalog=cat):
        handle = await _start(env, task_queue, cat.runbooks_dir / "guarded.yaml", cat, PROD + task_queue, inventory=inventory)
        message = await _refusal(handle)
        assert await _activities(handle) == [RESOLVE_RUN_ACTIVITY]
    assert "differs from the controller's at telemetry.prometheus" in message
    assert not out.exists()


async def test_a_target_outside_the_catalog_is_refused(env, task_queue, catalog):
    cat, out = catalog
    inventory = {"name": "elsewhere", "telemetry": {"prometheus": "http://127.0.0.1:9"}}
    async with support.worker(env.client, task_queue, catalog=cat):
        handle = await _start(env, task_queue, cat.runbooks_dir / "guarded.yaml", cat, "elsewhere", inventory=inventory)
        message = await _refusal(handle)
    assert "target 'elsewhere' is not in the controller's catalog" in message
    assert not out.exists()


async def test_a_development_target_runs_a_runbook_from_the_starters_file(env, task_queue, catalog, tmp_path):
    cat, out = catalog
    mine = _uncatalogued(tmp_path, "mine", out)
    async with support.worker(env.client, task_queue, catalog=cat):
        handle = await _start(env, task_queue, mine, cat, DEV + task_queue)
        await handle.result()
        state = await support.status(handle)
    assert state.runbook_origin == "development" and state.runbook_digest == runbook_digest(mine.read_text())
    assert support.lines(out)[0].endswith("changed")


async def test_a_worker_without_allow_development_runs_catalogued_runbooks_only(env, task_queue, tmp_path):
    """A target marked development: true (an inventory anyone who can write the targets directory could add) and
    the starter's own runbook, on a worker started without --allow-development: refused before any action,
    saying why."""
    runbooks, targets = tmp_path / "catalog", tmp_path / "targets"
    runbooks.mkdir()
    targets.mkdir()
    name, out = DEV + task_queue, tmp_path / "out.txt"
    (targets / f"{name}.yaml").write_text(f"name: {name}\ndevelopment: true\ntelemetry: {{prometheus: 'http://127.0.0.1:9'}}\n")
    strict = Catalog(runbooks, targets)
    mine = _uncatalogued(tmp_path, "mine", out)
    async with support.worker(env.client, task_queue, catalog=strict):
        handle = await _start(env, task_queue, mine, strict, name)
        message = await _refusal(handle)
        assert await _activities(handle) == [RESOLVE_RUN_ACTIVITY]
    assert "marked development: true but the worker was not started with --allow-development" in message
    assert "'mine'" in message and "\n" not in message
    assert not out.exists()


def test_development_targets_exist_only_in_a_catalog_that_allows_them(tmp_path):
    """Without allow_development no target is a development target: a catalogued runbook runs there, the
    starter's own does not; with it, the starter's own runs (origin development). warm() names such targets."""
    runbooks, targets = tmp_path / "catalog", tmp_path / "targets"
    runbooks.mkdir()
    targets.mkdir()
    (runbooks / "noted.yaml").write_text(NOTED)
    (targets / "dev.yaml").write_text("name: dev\ndevelopment: true\ntelemetry: {prometheus: 'http://127.0.0.1:9'}\n")
    mine = NOTED.replace("name: noted", "name: mine")
    strict, registry = Catalog(runbooks, targets), load_registry()
    request = RunRequest(runbook="mine", digest=runbook_digest(mine), text=mine, source="mine.yaml", target="dev",
                         inventory=strict.inventory("dev"), initiator="alice")
    with pytest.raises(CatalogRefused) as refused:
        strict.resolve(request, registry, "coldstart-dev")
    assert "not started with --allow-development" in str(refused.value) and "\n" not in str(refused.value)
    catalogued = request.model_copy(update={"runbook": "noted", "text": NOTED, "digest": runbook_digest(NOTED)})
    assert _origin(strict.resolve(catalogued, registry, "coldstart-dev")) == "catalog"
    assert Catalog.from_environment({"COLDSTART_CATALOG": str(runbooks), "COLDSTART_TARGETS": str(targets)}).target(
        request)[1] is False
    allowing = Catalog(runbooks, targets, allow_development=True)
    assert _origin(allowing.resolve(request, registry, "coldstart-dev")) == "development"
    assert strict.warm().development == allowing.warm().development == ["dev"]


def _origin(plan: RunInput) -> str | None:
    return plan.catalog.origin if plan.catalog is not None else None


async def test_a_worker_and_its_catalog_say_the_same_about_development_targets(env, task_queue):
    """What the worker reports (its start line, its metrics) is what its catalog does: they cannot differ."""
    from runtime.worker import build_worker

    with pytest.raises(ValueError, match="allow_development=False"):
        build_worker(env.client, task_queue, catalog=Catalog(Path("runbooks"), Path("targets"), allow_development=True))
    with pytest.raises(ValueError, match="allow_development=True"):
        build_worker(env.client, task_queue, catalog=Catalog(Path("runbooks"), Path("targets")), allow_development=True)


async def test_a_new_run_cannot_bring_its_own_plan_or_resume_state(env, task_queue, catalog):
    """The resolved plan replaces what the starter sent: its runbook model, its target and any resume state."""
    cat, out = catalog
    run = plan_run(cat.runbooks_dir / "guarded.yaml", registry=support.registry(), inventory=_inventory(cat, PROD + task_queue),
                   initiator="carol")
    # A hand-made input: the runbook model stripped of its approval, the request left honest.
    stripped = run.runbook.model_copy(update={"steps": run.runbook.steps[1:], "approvers": [], "four_eyes": False})
    async with support.worker(env.client, task_queue, catalog=cat):
        handle = await start_run(env.client, run.model_copy(update={"runbook": stripped}), task_queue)
        await support.wait_for(lambda: _awaiting(handle))  # the catalog's approval step is back
        await handle.terminate()
        # Only the request crosses the door: a start input of nothing else is refused before any step.
        no_request = await env.client.start_workflow(RunbookWorkflow.run, RunStart(), id=f"coldstart-{PROD}-2{task_queue}",
                                                     task_queue=task_queue)
        assert "carries no request" in await _refusal(no_request)
    assert not out.exists()


def test_the_catalog_holds_the_repositorys_runbooks_by_digest():
    catalog = Catalog(Path("runbooks"), Path("targets"))
    names = {entry.name for entry in catalog.runbooks().values()}
    assert {"consul-cold-start", "demo", "preempted-host-drain"} <= names
    for entry in catalog.runbooks().values():
        assert entry.digest == runbook_digest(textwrap.dedent(entry.path.read_text()))


def test_the_catalog_reads_its_files_at_each_resolution_whatever_it_parsed_before(tmp_path):
    """What is parsed is kept only while a file's text is the same: an edit, a new or a removed file counts at once."""
    runbooks, targets = tmp_path / "catalog", tmp_path / "targets"
    runbooks.mkdir()
    targets.mkdir()
    (runbooks / "guarded.yaml").write_text(GUARDED)
    (targets / "prod.yaml").write_text("name: prod\ntelemetry: {prometheus: 'http://127.0.0.1:9'}\n")
    catalog = Catalog(runbooks, targets)
    assert [e.name for e in catalog.runbooks().values()] == ["guarded"]
    first = catalog.inventory("prod")
    assert first["telemetry"]["prometheus"] == "http://127.0.0.1:9"
    first["telemetry"]["prometheus"] = "http://mallory:9"  # a caller's change stays its own
    assert catalog.inventory("prod")["telemetry"]["prometheus"] == "http://127.0.0.1:9"

    (runbooks / "guarded.yaml").write_text(GUARDED.replace("name: guarded", "name: guarded-v2"))
    (runbooks / "other.yaml").write_text(GUARDED.replace("name: guarded", "name: other"))
    (targets / "prod.yaml").write_text("name: prod\ntelemetry: {prometheus: 'http://127.0.0.1:19'}\n")
    assert sorted(e.name for e in catalog.runbooks().values()) == ["guarded-v2", "other"]
    assert catalog.inventory("prod")["telemetry"]["prometheus"] == "http://127.0.0.1:19"

    (runbooks / "other.yaml").unlink()
    (targets / "prod.yaml").write_text("name: prod\ntelemetry: {prometheus: 7}\n")
    assert [e.name for e in catalog.runbooks().values()] == ["guarded-v2"]
    with pytest.raises(CatalogRefused, match="inventory is invalid"):
        catalog.inventory("prod")
    (targets / "prod.yaml").unlink()
    with pytest.raises(CatalogRefused, match="not in the controller's catalog"):
        catalog.inventory("prod")


NOTED = """\
metadata: {name: noted}
target: prod
steps:
  - id: say
    action: core.note
    with: {message: hello}
"""


def test_the_worker_warms_the_catalog_and_the_action_models_before_its_first_run(tmp_path, monkeypatch):
    """warm_up parses what a first resolution would: a resolution after it parses neither the catalog's runbooks
    nor the target's inventory, a broken target is reported (its runs are still refused), and every action's
    models are built."""
    runbooks, targets = tmp_path / "catalog", tmp_path / "targets"
    runbooks.mkdir()
    targets.mkdir()
    (runbooks / "noted.yaml").write_text(NOTED)
    (runbooks / "notes.yaml").write_text("just: a file\n")  # no runbook: not in the catalog
    (targets / "prod.yaml").write_text("name: prod\ntelemetry: {prometheus: 'http://127.0.0.1:9'}\n")
    (targets / "broken.yaml").write_text("name: broken\ntelemetry: {prometheus: 7}\n")
    catalog, registry = Catalog(runbooks, targets), load_registry()

    warmed = warm_up(catalog, registry)
    assert warmed.runbooks == ["noted"] and warmed.runbooks_parsed == 2 and warmed.targets_parsed == ["prod"]
    assert list(warmed.targets_refused) == ["broken"] and "inventory is invalid" in warmed.targets_refused["broken"]
    assert all(spec.input_model.__pydantic_complete__ for spec in registry.specs.values())

    request = RunRequest(runbook="noted", digest=runbook_digest(NOTED), text=NOTED, source="noted.yaml",
                         target="prod", inventory=catalog.inventory("prod"), initiator="alice")

    def parsed_again(*_args):
        raise AssertionError("parsed again after warm_up")

    with monkeypatch.context() as patched:
        patched.setattr(catalog_module, "_runbook_name", parsed_again)
        patched.setattr(catalog_module, "load_inventory", parsed_again)
        assert catalog.resolve(request, registry, "coldstart-prod").runbook.metadata.name == "noted"
    again = catalog.warm()
    assert (again.runbooks_parsed, again.targets_parsed) == (0, [])
    with pytest.raises(CatalogRefused, match="inventory is invalid"):
        catalog.inventory("broken")


WIDENING = """\
metadata: {name: widening}
target: any
approvers: [alice, bob, mallory]
steps:
  - id: flaky
    action: test.maybe_fail
    with: {path: "OUT", label: flaky, fail_until_file_exists: "NEVER"}
    on_failure: hold
  - id: go
    approval: {prompt: "go on?"}
"""


async def test_the_targets_policy_holds_whatever_the_runbook_says(env, task_queue, tmp_path):
    """Start, approve, skip, retry, abort, pause and resume are each refused for an actor the target's policy does
    not name, though the catalogued runbook names them (it may narrow the policy, never widen it)."""
    runbooks, targets = tmp_path / "catalog", tmp_path / "targets"
    runbooks.mkdir()
    targets.mkdir()
    out = tmp_path / "out.txt"
    (runbooks / "widening.yaml").write_text(WIDENING.replace("OUT", str(out)).replace("NEVER", str(tmp_path / "never")))
    name = "policed-" + task_queue
    (targets / f"{name}.yaml").write_text(f"""name: {name}
telemetry: {{prometheus: 'http://127.0.0.1:9'}}
policy: {{starters: [carol], approvers: [alice, bob], operators: [olga], four_eyes: true}}
""")
    cat = Catalog(runbooks, targets)
    file = runbooks / "widening.yaml"
    async with support.worker(env.client, task_queue, catalog=cat):
        refused = await start_run(env.client, plan_run(file, registry=support.registry(), inventory=cat.inventory(name),
                                                       initiator="mallory"), task_queue)
        assert "'mallory' may not start runs on target" in await _refusal(refused)
        handle = await start_run(env.client, plan_run(file, registry=support.registry(), inventory=cat.inventory(name),
                                                      initiator="carol"), task_queue)
        await support.wait_for(lambda: _held(handle))
        for verb in ("skip", "retry", "abort", "pause"):
            message = await _update_refused(handle, verb, ControlRequest(step=None if verb in ("abort", "pause") else "flaky",
                                                                        actor="mallory"))
            assert "'mallory' may not" in message, (verb, message)
        # Four eyes comes from the target though the runbook does not ask for it: one skip is not enough.
        first = await handle.execute_update("skip", ControlRequest(step="flaky", actor="alice"))
        assert "a second approver must confirm" in first
        await handle.execute_update("pause", ControlRequest(actor="olga"))
        message = await _update_refused(handle, "resume", ControlRequest(actor="mallory"))
        assert message == "'mallory' may not resume this run (operators: alice, bob, olga)"
        await handle.execute_update("resume", ControlRequest(actor="olga"))
        await handle.execute_update("skip", ControlRequest(step="flaky", actor="bob"))
        await support.wait_for(lambda: _awaiting(handle))
        message = await _update_refused(handle, "approve", ApproveRequest(step="go", approver="mallory"))
        assert message == "'mallory' may not approve 'go' (approvers: alice, bob)"
        await handle.execute_update("approve", ApproveRequest(step="go", approver="alice"))
        await handle.result()


async def _held(handle) -> bool:
    return "flaky" in (await support.status(handle)).held


async def _update_refused(handle, name: str, body) -> str:
    with pytest.raises(WorkflowUpdateFailedError) as failure:
        await handle.execute_update(name, body)
    return str(failure.value.cause.message if hasattr(failure.value.cause, "message") else failure.value.cause)


async def test_the_drill_approver_acts_on_drill_runs_only(env, task_queue, tmp_path):
    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: drilled}}
        target: t
        approvers: [drill-bot, alice]
        steps:
          - id: go
            approval: {{prompt: "go on?"}}
          - id: after
            action: test.append
            with: {{path: "{out}", label: after}}
    """)
    async with support.worker(env.client, task_queue):
        incident = await support.start(env.client, book, task_queue, target={"name": "prod-" + task_queue})
        await support.wait_for(lambda: _awaiting(incident))
        message = await _update_refused(incident, "approve", ApproveRequest(step="go", approver="drill-bot"))
        assert message == "'drill-bot' is a drill approver: it acts on drill runs only, and this run is no drill"
        message = await _update_refused(incident, "abort", ControlRequest(actor="drill-bot"))
        assert "acts on drill runs only" in message
        await incident.execute_update("approve", ApproveRequest(step="go", approver="alice"))
        await incident.result()
        drill = await start_run(env.client, plan_run(book, registry=support.registry(), drill=True, initiator="drill",
                                                     inventory={"name": "lab-" + task_queue, "drill": True}), task_queue)
        await support.wait_for(lambda: _awaiting(drill))
        await drill.execute_update("approve", ApproveRequest(step="go", approver="drill-bot"))
        await drill.result()


async def test_a_runs_kept_controls_are_bounded(env, task_queue, tmp_path):
    """Pausing and resuming without end cannot grow what the run carries: the newest MAX_CONTROLS_KEPT stay."""
    from workflows.controls import MAX_CONTROLS_KEPT

    book = support.write_runbook(tmp_path, """
        metadata: {name: bounded}
        target: t
        operators: [op]
        steps:
          - id: go
            approval: {prompt: "go on?"}
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        await support.wait_for(lambda: _awaiting(handle))
        for _ in range(MAX_CONTROLS_KEPT // 2 + 5):
            await handle.execute_update("pause", ControlRequest(actor="op"))
            await handle.execute_update("resume", ControlRequest(actor="op"))
        controls = (await support.status(handle)).controls
        await handle.terminate()
    assert len(controls) == MAX_CONTROLS_KEPT and controls[-1].verb == "resume"


async def test_a_run_under_another_targets_id_is_refused(env, task_queue, catalog):
    """Single flight per target holds for what the run resolves to, not for the id its starter chose."""
    cat, out = catalog
    run = plan_run(cat.runbooks_dir / "guarded.yaml", registry=support.registry(),
                   inventory=_inventory(cat, PROD + task_queue), initiator="carol")
    async with support.worker(env.client, task_queue, catalog=cat):
        handle = await env.client.start_workflow(RunbookWorkflow.run, RunStart(request=run.request),
                                                 id=f"coldstart-elsewhere-{task_queue}", task_queue=task_queue)
        message = await _refusal(handle)
    assert f"is not target {PROD + task_queue}'s (coldstart-{PROD + task_queue})" in message
    assert not out.exists()


LAST_RESORT = """\
metadata: {name: last-resort}
target: prod
approvers: [alice, bob]
deadline:
  within: 1h
  on_miss:
    - id: hand-over
      approval: {prompt: "hand the host over?", four_eyes: FOUR_EYES}
steps:
  - id: change
    action: test.append
    with: {path: "/dev/null", label: "changed"}
"""


@pytest.mark.parametrize("four_eyes", [True, False])
def test_an_approval_under_four_eyes_in_on_miss_needs_a_verified_starter(tmp_path: Path, four_eyes: bool) -> None:
    """Four eyes compares verified people wherever its approval is: in deadline.on_miss too."""
    runbooks = tmp_path / "catalog"
    runbooks.mkdir()
    book = runbooks / "last-resort.yaml"
    book.write_text(LAST_RESORT.replace("FOUR_EYES", str(four_eyes).lower()))
    inventory = {"name": "prod", "telemetry": {"prometheus": "http://127.0.0.1:9"},
                 "policy": {"identity": {"vault": "https://vault.example:8200", "provider": "coldstart",
                                         "audience": "cli", "controls": ["approve"]}}}
    run = plan_run(book, registry=support.registry(), inventory=inventory, initiator="alice")
    assert run.request is not None
    catalog = Catalog(runbooks, None, inventories={"prod": inventory})
    if not four_eyes:
        assert catalog.resolve(run.request, support.registry(), "coldstart-prod").initiator == "alice"
        return
    with pytest.raises(CatalogRefused, match=r"needs a verified starter \(four eyes compares verified people\)"):
        catalog.resolve(run.request, support.registry(), "coldstart-prod")

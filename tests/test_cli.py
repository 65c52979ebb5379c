"""The `coldstart` command against a real dev server: run, status, approve, busy target, list, timeline."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import support

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
async def prom():
    server = await support.ScriptedPrometheus().start()
    yield server
    await server.stop()


def cli(env_vars: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, **env_vars}, check=False,
    )


async def acli(env_vars, *args):
    return await asyncio.to_thread(cli, env_vars, *args)


async def test_operator_session(env, task_queue, tmp_path, prom):
    targets = tmp_path / "targets"
    targets.mkdir()
    (targets / "cli-t.yaml").write_text(f"name: cli-t\ndrill: true\ntelemetry: {{prometheus: '{prom.url}'}}\n")
    journal = tmp_path / "journal.jsonl"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: cli-demo, owner: sre}}
        target: cli-t
        approvers: [alice, bob, carol]
        four_eyes: true
        steps:
          - id: hello
            action: core.note
            with: {{message: "hello from ${{{{ run.initiator }}}}", journal: "{journal}"}}
          - id: healthy
            gate: {{name: up, endpoint: "${{{{ target.telemetry.prometheus }}}}", query: up, comparator: ">=", threshold: 1, interval: 0.2s, consecutive: 2, timeout: 10s}}
          - id: ok
            approval: {{prompt: "continue after ${{{{ steps.hello.outputs.key }}}}?"}}
          - id: bye
            action: core.note
            with: {{message: bye, journal: "{journal}"}}
    """)
    env_vars = {
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "COLDSTART_TASK_QUEUE": task_queue,
        "COLDSTART_TARGETS": str(targets),
        "COLDSTART_USER": "alice",
    }
    planned = await acli(env_vars, "plan", str(book), "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["runbook"]["steps"][1]["gate"]["endpoint"] == prom.url

    async with support.worker(env.client, task_queue):
        started = await acli(env_vars, "run", str(book), "--json")
        assert started.returncode == 0, started.stderr
        workflow_id = json.loads(started.stdout)["workflow_id"]
        assert workflow_id == "coldstart-cli-t"

        busy = await acli(env_vars, "run", str(book))
        assert busy.returncode == 3
        # The plan's note on the 0.2 s gate interval, then one line: the target's run is still going.
        note, refused_line = busy.stderr.splitlines()
        assert ": note: step healthy: gate interval 0.2s is under a second" in note, busy.stderr
        assert "coldstart-cli-t" in refused_line and "is still running" in refused_line

        async def awaiting():
            result = await acli(env_vars, "status", "cli-t", "--json")
            return result.returncode == 0 and json.loads(result.stdout)["awaiting_approval"] == ["ok"]

        await support.wait_for(awaiting, timeout=30, interval=0.3)
        # The table reads the status the run keeps in its memo (the server, not the worker).
        table = await acli(env_vars, "status", "cli-t")
        assert table.returncode == 0 and "awaiting_approval" in table.stdout, table.stdout + table.stderr
        assert "approve with: coldstart approve cli-t ok" in table.stdout
        refused = await acli(env_vars, "approve", "cli-t", "ok", "--as", "mallory")
        assert refused.returncode == 5 and "may not approve" in refused.stderr
        assert "(the name is --as NAME, else $COLDSTART_USER, else your login" in refused.stderr, refused.stderr
        own = await acli(env_vars, "approve", "cli-t", "ok")  # alice started the run: four eyes
        assert own.returncode == 5 and "four eyes" in own.stderr
        approved = await acli(env_vars, "approve", "cli-t", "ok", "--as", "bob", "-m", "gate looked fine")
        assert approved.returncode == 0, approved.stderr
        await env.client.get_workflow_handle(workflow_id).result()
        table = await acli(env_vars, "status", "cli-t")
        assert table.returncode == 0 and ": succeeded" in table.stdout, table.stdout + table.stderr

    listed = await acli(env_vars, "list", "--all", "--json")
    rows = [r for r in json.loads(listed.stdout) if r["workflow_id"] == workflow_id]
    assert rows and rows[0]["runbook"] == "cli-demo" and rows[0]["status"] == "completed"

    timeline = await acli(env_vars, "timeline", "cli-t", "--format", "json")
    assert timeline.returncode == 0, timeline.stderr
    data = json.loads(timeline.stdout)
    assert data["outcome"] == "succeeded" and data["initiator"] == "alice"
    approvals = [e for e in data["entries"] if e["event"] == "approve (update)"]
    assert len(approvals) == 1 and approvals[0]["actor"] == "bob"
    assert approvals[0]["detail"] == "gate looked fine"
    readings = [e for e in data["entries"] if e["event"] == "gate reading"]
    assert len(readings) >= 2 and all(e["step"] == "healthy" for e in readings)
    steps = {s["step"]: s for s in data["steps"]}
    assert set(steps) >= {"hello", "healthy", "ok", "bye"}
    assert all(s["duration_s"] >= 0 for s in steps.values())

    markdown = await acli(env_vars, "timeline", "cli-t")
    assert "| ok |" in markdown.stdout and "bob" in markdown.stdout and "up: up = 1.0" in markdown.stdout

    # The timeline reads steps from the header the workflow writes on every activity, not from ids.
    from workflows.history_tags import activity_tag

    history = await env.client.get_workflow_handle(workflow_id).fetch_history()
    tags = [activity_tag(e.activity_task_scheduled_event_attributes.header) for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")]
    assert tags and None not in tags
    # The run's first activity resolves it against the worker's catalog; it belongs to no step.
    assert {(t.role, t.step) for t in tags} == {("resolve", None), ("action", "hello"), ("gate", "healthy"), ("action", "bye")}
    assert {t.gate for t in tags if t.role == "gate"} == {"up"}


def test_unreachable_temporal_is_exit_4(tmp_path):
    result = cli({"TEMPORAL_ADDRESS": "127.0.0.1:1"}, "status", "nothing")
    assert result.returncode == 4
    assert result.stderr.startswith("error: cannot reach Temporal at 127.0.0.1:1")
    assert "Traceback" not in result.stderr


def test_version_prints_the_installed_version_or_the_source_tree_s():
    import tomllib
    from importlib import metadata

    try:
        expected = metadata.version("coldstart")
    except metadata.PackageNotFoundError:
        expected = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    result = cli({}, "--version")
    assert (result.returncode, result.stdout, result.stderr) == (0, f"coldstart {expected}\n", "")


def test_version_without_an_install_reads_pyproject(monkeypatch):
    import importlib.metadata
    import tomllib

    from typer.testing import CliRunner

    import cli.main

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    result = CliRunner().invoke(cli.main.app, ["--version"])
    assert (result.exit_code, result.stdout) == (0, f"coldstart {declared}\n")


def test_abort_undo_is_sent_with_abort_only(monkeypatch):
    """`coldstart abort --undo` asks the run to undo what it changed; any other control refuses the flag."""
    from typer.testing import CliRunner

    import cli.main

    sent: list = []
    monkeypatch.setattr(cli.main, "_update", lambda ref, name, body: sent.append((name, body)))
    runner = CliRunner()
    assert runner.invoke(cli.main.app, ["abort", "local", "--as", "op", "--undo"]).exit_code == 0
    assert runner.invoke(cli.main.app, ["abort", "local", "--as", "op"]).exit_code == 0
    refused = runner.invoke(cli.main.app, ["pause", "local", "--as", "op", "--undo"])
    assert isinstance(refused.exception, cli.main.CliError) and refused.exception.code == 2
    assert str(refused.exception) == "--undo goes with abort only"
    assert [(name, body.undo) for name, body in sent] == [("abort", True), ("abort", False)]

"""Recovery objectives and scorecards: each phase's time against its objective, split into what it waited on, for
one run (`coldstart scorecard`) and across drills (`coldstart report`, a table and a trend PNG)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from runtime.runs import start_run
from tests import support
from tests.test_cli import acli
from workflows.loader import RunbookInvalid, plan_run

_BOOK = """
    metadata: {name: scored, owner: sre}
    target: any
    approvers: [alice, bob]
    objectives:
      rto: 1m
      phases:
        ready: {until: ready, within: 30s}
        decided: {until: go, within: 1s}
        settled: {until: settle, within: 30s}
        finished: {until: bye, within: 30s}
    steps:
      - id: hello
        action: core.note
        with: {message: hello}
      - id: ready
        gate: {name: up, endpoint: "${{ target.telemetry.prometheus }}", query: ready_up, comparator: ">=", threshold: 1, interval: 0.2s, consecutive: 3, timeout: 20s}
      - id: go
        approval: {prompt: "carry on?"}
      - id: settle
        wait: 1500ms
      - id: bye
        action: core.note
        with: {message: bye}
"""


async def _awaiting(handle) -> bool:
    return bool((await support.status(handle)).awaiting_approval)


async def _run(env, task_queue, book, inventory, *, approve_after: float | None, abort: bool = False):
    run = plan_run(book, registry=support.registry(), inventory=inventory, initiator="alice", drill=True)
    handle = await start_run(env.client, run, task_queue)
    await support.wait_for(lambda: _awaiting(handle), timeout=30)
    asked = time.monotonic()
    if abort:
        await handle.execute_update("abort", {"actor": "alice", "reason": "drill stopped"})
    else:
        await asyncio.sleep(approve_after or 0)
        await handle.execute_update("approve", {"step": "go", "approver": "bob", "comment": "ok"})
    waited = time.monotonic() - asked
    try:
        await handle.result()
    except Exception:  # noqa: BLE001, S110 - the aborted run fails; its scorecard is what is read
        pass
    return handle, waited


async def test_scorecards_measure_phases_and_draw_the_trend(env, task_queue, tmp_path):
    prom = await support.ScriptedPrometheus().start()
    prom.script("ready_up", 1)
    target = f"score-{task_queue[-8:]}"
    book = support.write_runbook(tmp_path, _BOOK)
    inventory = {"name": target, "drill": True, "telemetry": {"prometheus": prom.url}}
    env_vars = {"TEMPORAL_ADDRESS": env.client.service_client.config.target_host, "COLDSTART_USER": "alice"}
    try:
        async with support.worker(env.client, task_queue):
            _, approval_wait = await _run(env, task_queue, book, inventory, approve_after=2.0)
            told = await acli(env_vars, "scorecard", target, "--json")
            assert told.returncode == 0, told.stderr
            card = json.loads(told.stdout)
            human = await acli(env_vars, "scorecard", target)
            await _run(env, task_queue, book, inventory, approve_after=0.2)
            await _run(env, task_queue, book, inventory, approve_after=None, abort=True)
    finally:
        await prom.stop()

    phases = {p["name"]: p for p in card["phases"]}
    assert list(phases) == ["ready", "decided", "settled", "finished"]
    # Each phase's time is what it waited on plus what its steps worked, and the phases follow each other.
    for phase in phases.values():
        parts = phase["operators_s"] + phase["gates_s"] + phase["bakes_s"] + phase["working_s"]
        assert abs(parts - phase["measured_s"]) < 1e-6, phase
    assert sum(p["measured_s"] for p in phases.values()) <= card["wall_s"] + 1e-6
    # The gate read three passing samples 0.2 s apart: gate time, not operators or bakes.
    assert phases["ready"]["gates_s"] >= 0.3 and phases["ready"]["operators_s"] == 0, phases["ready"]
    # The approval: the time bob took, on operators; over its 1 s objective, so missed.
    decided = phases["decided"]
    assert abs(decided["operators_s"] - approval_wait) < 1.0, (decided, approval_wait)
    assert decided["met"] is False and phases["ready"]["met"] is True
    # The wait step's timer is a bake.
    assert 1.4 <= phases["settled"]["bakes_s"] <= phases["settled"]["measured_s"] < 3.0, phases["settled"]
    assert card["outcome"] == "succeeded" and card["rto_s"] == 60 and card["met"] is False
    assert len(card["runbook_digest"]) >= 12

    assert human.returncode == 0, human.stderr
    assert "MISSED" in human.stdout and "whole run" in human.stdout, human.stdout

    png = tmp_path / "trend.png"
    report = await acli(env_vars, "report", "--target", target, "--png", str(png), "--json")
    assert report.returncode == 0, report.stderr
    cards = json.loads(report.stdout)
    assert len(cards) == 3
    assert [c["outcome"] for c in cards] == ["succeeded", "succeeded", "aborted"]
    # The aborted drill never reached `go`: that phase and every one after it are unreached.
    assert [p["measured_s"] is None for p in cards[2]["phases"]] == [False, True, True, True]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    table = await acli(env_vars, "report", "--target", target)
    assert table.returncode == 0 and "decided" in table.stdout and "!" in table.stdout, table.stdout
    nothing = await acli(env_vars, "report", "--target", target + "-none")
    assert nothing.returncode == 1 and "no finished drills" in nothing.stderr, nothing


def test_objectives_are_checked_where_they_are_written(tmp_path):
    book = support.write_runbook(tmp_path, """
        metadata: {name: badly-scored}
        target: any
        objectives:
          phases:
            late: {until: second, within: 1m}
            early: {until: first, within: 1m}
            nowhere: {until: missing, within: 1m}
            odd: {until: first, within: soon}
        steps:
          - id: first
            action: core.note
            with: {message: one}
          - id: second
            action: core.note
            with: {message: two}
    """)
    errors = _refusal(book)
    assert any(":9:" in line and "'soon' is not a duration" in line for line in errors), errors
    assert len(errors) == 1, errors  # a type error stops the checks that need the model
    book.write_text("".join(line for line in book.read_text().splitlines(keepends=True) if "odd:" not in line))
    errors = _refusal(book)
    assert any(":7:20:" in line and "phase early: until 'first' does not come after late's end" in line
               for line in errors), errors
    assert any(":8:22:" in line and "'missing' is not one of the runbook's top-level steps" in line
               for line in errors), errors


def _refusal(book) -> list[str]:
    with pytest.raises(RunbookInvalid) as refused:
        plan_run(book, registry=support.registry(), inventory={"name": "any"})
    return refused.value.errors

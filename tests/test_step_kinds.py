"""Step kinds have one table (spec.STEP_TYPES); every behaviour that differs by kind covers each of them."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path

import pytest
from rich.console import Console

from activities.catalog import load_registry
from workflows import spec
from workflows.loader import plan_run
from workflows.runbook_workflow import RunbookWorkflow

REPO = Path(__file__).resolve().parents[1]


def test_the_type_checker_s_union_is_the_kind_table():
    assert set(typing.get_args(spec.AnyStep)) == set(spec.STEP_TYPES.values())


def test_the_interpreter_runs_every_kind():
    assert set(RunbookWorkflow.STEP_RUNNERS) == set(spec.STEP_KINDS)
    for kind, name in RunbookWorkflow.STEP_RUNNERS.items():
        assert inspect.iscoroutinefunction(getattr(RunbookWorkflow, name)), (kind, name)


def _every_kind_runbook(tmp_path: Path) -> Path:
    return REPO / "runbooks" / "demo.yaml"  # it exercises every step kind (the first test below checks)


def test_every_kind_plans_and_is_described(tmp_path):
    run = plan_run(_every_kind_runbook(tmp_path), registry=load_registry(), placeholders=True)
    kinds = {step.kind for step in run.runbook.steps} | {
        child.kind for step in run.runbook.steps if isinstance(step, spec.ParallelStep) for child in step.parallel}
    assert kinds == set(spec.STEP_KINDS)
    from cli.render import _describe

    for step in run.runbook.steps:
        assert _describe(step, run), step.kind


def test_a_kind_missing_from_a_ladder_fails_at_run_time_too():
    from cli.render import _describe

    class Unknown:  # what a new kind would look like to a ladder that forgot it
        kind = "new"

    with pytest.raises(AssertionError):
        _describe(Unknown(), None)  # type: ignore[arg-type]


def test_plan_prints_every_kind(tmp_path):
    from cli import render

    console = Console(record=True, width=200)
    render.plan(console, plan_run(_every_kind_runbook(tmp_path), registry=load_registry(), placeholders=True))
    text = console.export_text()
    for step in run_steps(tmp_path):
        assert f" {step.id} " in text, step.id


def run_steps(tmp_path: Path) -> list[spec.AnyStep]:
    steps = plan_run(_every_kind_runbook(tmp_path), registry=load_registry(), placeholders=True).runbook.steps
    return [*steps, *(child for step in steps if isinstance(step, spec.ParallelStep) for child in step.parallel)]

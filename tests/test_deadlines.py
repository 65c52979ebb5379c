"""Deadlines: a step never runs past its deadline, one that cannot fit fails fast, and the runbook's on_miss runs."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.client import WorkflowFailureError

from tests import support
from workflows.loader import RunbookInvalid, plan_run


async def _failure(handle) -> str:
    with pytest.raises(WorkflowFailureError) as caught:
        await handle.result()
    return str(caught.value.cause)


async def test_a_step_is_stopped_at_its_deadline_and_on_miss_runs(env, task_queue, tmp_path):
    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: stopped}}
        target: t
        deadline:
          within: 30s
          on_miss:
            - id: rescue
              action: test.append
              with: {{path: "{out}", label: rescue}}
        steps:
          - id: first
            action: test.append
            with: {{path: "{out}", label: first}}
          - id: slow
            wait: 20s
            deadline: 1.5s
          - id: never
            action: test.append
            with: {{path: "{out}", label: never}}
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        started = time.monotonic()
        message = await _failure(handle)
        took = time.monotonic() - started
        status = await support.status(handle)
    assert took < 10, took
    assert "step slow stopped at its deadline" in message and "on_miss ran: rescue" in message, message
    assert [line.split()[-1] for line in support.lines(out)] == ["first", "rescue"]
    states = {s.id: s.status for s in status.steps}
    assert states == {"first": "succeeded", "slow": "failed", "never": "pending", "rescue": "succeeded"}


async def test_a_step_that_needs_more_than_is_left_fails_fast_without_starting(env, task_queue, tmp_path):
    out = tmp_path / "out.txt"
    deadline = datetime.now(UTC) + timedelta(seconds=20)
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: needs}}
        target: t
        params:
          deadline: {{type: string}}
        deadline:
          at: ${{{{ params.deadline }}}}
          margin: 5s
          on_miss:
            - id: rescue
              action: test.append
              with: {{path: "{out}", label: rescue}}
        steps:
          - id: quick
            action: test.append
            with: {{path: "{out}", label: quick}}
            needs: 1s
          - id: long
            action: test.append
            with: {{path: "{out}", label: long}}
            needs: 60s
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue, params={"deadline": deadline.isoformat()})
        started = time.monotonic()
        message = await _failure(handle)
        took = time.monotonic() - started
    assert took < 5, took
    assert "step long not started" in message and "the step needs 60s" in message, message
    assert [line.split()[-1] for line in support.lines(out)] == ["quick", "rescue"]


async def test_a_deadline_already_past_starts_nothing(env, task_queue, tmp_path):
    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: past}}
        target: t
        params:
          deadline: {{type: string}}
        deadline: {{at: "${{{{ params.deadline }}}}"}}
        steps:
          - id: first
            action: test.append
            with: {{path: "{out}", label: first}}
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue, params={"deadline": str(int(time.time()) - 5)})
        message = await _failure(handle)
    assert "step first not started" in message and "past it" in message, message
    assert support.lines(out) == []


async def test_a_held_step_is_not_held_past_the_deadline(env, task_queue, tmp_path):
    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: held}}
        target: t
        deadline:
          within: 2s
          on_miss:
            - id: rescue
              action: test.append
              with: {{path: "{out}", label: rescue}}
        steps:
          - id: flaky
            action: test.maybe_fail
            with: {{path: "{out}", label: flaky, fail_items: [flaky]}}
            on_failure: hold
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        await support.wait_for(lambda: _held(handle, "flaky"))
        message = await _failure(handle)
        status = await support.status(handle)
    assert "step flaky stopped at its deadline" in message, message
    flaky = next(s for s in status.steps if s.id == "flaky")
    assert flaky.status == "failed" and flaky.awaiting is None
    assert [line.split()[-1] for line in support.lines(out)] == ["rescue"]


async def test_on_miss_waits_for_the_step_that_confirms_it(env, task_queue, tmp_path):
    """A deadline missed before `on_miss_after`'s step succeeded (a host that never confirmed its notice) only
    fails the run: on_miss, which assumes what that step confirms, does not run."""
    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: unconfirmed}}
        target: t
        deadline:
          within: 2s
          on_miss_after: confirm
          on_miss:
            - id: release-anyway
              action: test.append
              with: {{path: "{out}", label: released}}
        steps:
          - id: confirm
            action: test.maybe_fail
            with: {{path: "{out}", label: confirm, fail_items: [confirm]}}
            on_failure: hold
          - id: drain
            action: test.append
            with: {{path: "{out}", label: drained}}
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        message = await _failure(handle)
    assert "on_miss not run: confirm had not confirmed it" in message, message
    assert support.lines(out) == []


async def _held(handle, step: str) -> bool:
    return step in (await support.status(handle)).held


async def test_a_run_well_inside_its_deadline_is_unchanged(env, task_queue, tmp_path):
    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: inside}}
        target: t
        deadline: {{within: 5m, on_miss: [{{id: rescue, action: test.append, with: {{path: "{out}", label: rescue}}}}]}}
        steps:
          - id: a
            action: test.append
            with: {{path: "{out}", label: a}}
            needs: 1s
          - id: b
            parallel:
              - {{id: b1, action: test.append, with: {{path: "{out}", label: b1}}, deadline: 1m}}
              - {{id: b2, wait: 0.1s}}
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        result = await handle.result()
    assert result.state == "succeeded"
    assert [line.split()[-1] for line in support.lines(out)] == ["a", "b1"]


@pytest.mark.parametrize(
    ("snippet", "message"),
    [
        ("steps: [{id: a, wait: 1s, needs: 1s}]", "`needs` without a deadline"),
        ("steps: [{id: a, wait: 1s, needs: 5s, deadline: 2s}]", "needs 5s but its deadline is 2s"),
        ("deadline: {at: '2026-11-24T01:00:00'}\nsteps: [{id: a, wait: 1s}]", "timezone"),
        ("deadline: {margin: 1s}\nsteps: [{id: a, wait: 1s}]", "a deadline needs `at`, `within` or both"),
        ("deadline: {within: 1m, on_miss: [{id: r, wait: 1s, deadline: 1s}]}\nsteps: [{id: a, wait: 1s}]",
         "on_miss steps run after the deadline"),
        ("deadline: {within: 1m, on_miss: [{id: a, wait: 1s}]}\nsteps: [{id: a, wait: 1s}]", "duplicate step id 'a'"),
        (("deadline: {within: 1m, on_miss: [{id: r, action: core.note, with: {message: '${{ steps.a.status }}'}}]}\n"
          "steps: [{id: a, wait: 1s}]"), "reference cycle"),
    ],
)
def test_deadline_mistakes_are_refused_with_their_place(tmp_path, snippet, message):
    book = tmp_path / "book.yaml"
    book.write_text("metadata: {name: bad}\ntarget: t\n" + snippet + "\n")
    with pytest.raises(RunbookInvalid) as caught:
        plan_run(book, registry=support.registry(), inventory={"name": "t"})
    text = str(caught.value)
    assert message in text, text
    assert text.startswith(f"{book}:") and text.split(":")[1].isdigit(), text
    assert not re.search(r"\d:\d\d:\d\d", text.removeprefix(f"{book}:")), text  # durations as a runbook writes them

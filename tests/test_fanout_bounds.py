"""A fan-out of many batches with large per-item outputs keeps every payload small and its undo exact; a huge failure keeps its reason."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from pydantic import BaseModel
from temporalio import activity
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from activities.binding import action
from activities.failure_bounds import MESSAGE_CHARS, bound_failure
from activities.registry import Registry
from activities.retry import Retry
from runtime.payload_sizes import run_payloads
from runtime.worker import build_worker
from tests import support
from workflows.fanout import RESULTS_BUDGET, reads_results

fakes = Registry()
# 1,500 items of 1.5 KB outputs: 2.2 MB of results, nine times the results budget. The undo reads them, so the
# change step's batches shrink to hand them back within it, and the run has many (bench/fanout.py: 10,000 items).
ITEMS = int(os.environ.get("FANOUT_TEST_ITEMS", "1500"))
FAILING = set(range(7, ITEMS, 300))  # 5 items: within the step's 1 %
WARN = 512 * 1024


class ChangeInput(BaseModel):
    path: str
    label: str
    index: int


class Restore(BaseModel):
    path: str
    label: str


class ChangeOutput(BaseModel):
    label: str
    original: str
    restore: Restore


# Two attempts, as a real action has: a loaded dev server can lose an activity task, and the attempt that
# follows is Temporal's answer to that. Each write records its attempt, and an item written twice fails the test
# whichever attempts wrote it: a second write is a second execution of a change, retried or scheduled twice.
_RETRY = Retry(max_attempts=2, initial_interval=timedelta(seconds=1))


def _record(path: str, label: str) -> None:
    with open(path, "a") as handle:
        handle.write(f"{label} {activity.info().attempt}\n")


@action("test.big_change", registry=fakes, mutating=True, retry=_RETRY)
def big_change(inp: ChangeInput) -> ChangeOutput:
    """Change one item and say what it was, at length (1.5 KB an item: 2.2 MB for the step)."""
    if inp.index in FAILING:
        raise ApplicationError(f"injected failure for {inp.label}", non_retryable=True)
    _record(inp.path, inp.label)
    return ChangeOutput(label=inp.label, original="x" * 1500, restore=Restore(path=inp.path + ".undo", label=inp.label))


@action("test.big_undo", registry=fakes, mutating=True, retry=_RETRY)
def big_undo(inp: Restore) -> Restore:
    _record(inp.path, inp.label)
    return inp


def _reached(path) -> list[str]:
    """The labels a fake wrote, each exactly once: a label written twice (at any attempts) is a double execution."""
    attempts: dict[str, list[str]] = defaultdict(list)
    for line in path.read_text().splitlines():
        label, attempt = line.split()
        attempts[label].append(attempt)
    repeats = {label: seen for label, seen in sorted(attempts.items()) if len(seen) > 1}
    assert not repeats, f"written more than once (label: attempts): {repeats}"
    return sorted(attempts)



def test_an_item_written_at_two_attempts_is_a_double_execution(tmp_path):
    writes = tmp_path / "changed.txt"
    writes.write_text("item1 1\nitem2 2\n")  # item2's first attempt never ran: a retry, one write
    assert _reached(writes) == ["item1", "item2"]
    writes.write_text("item1 1\nitem2 1\nitem2 2\n")
    with pytest.raises(AssertionError, match=r"\{'item2': \['1', '2'\]\}"):
        _reached(writes)

class HugeInput(BaseModel):
    label: str


@action("test.huge_failure", registry=fakes, mutating=True, retry=Retry(max_attempts=1))
def huge_failure(inp: HugeInput) -> HugeInput:
    """Fail as a client library might: the whole 5 MB response body in the message, and again in details."""
    body = "<html>" + "y" * (5 * 1024 * 1024) + "</html>"
    raise ApplicationError(f"{inp.label}: vault answered 503: {body}", {"body": body}, non_retryable=True)


@action("test.refused_at_length", registry=fakes, mutating=True,
        retry=Retry(max_attempts=2, initial_interval=timedelta(seconds=2)))
def refused_at_length(inp: HugeInput) -> HugeInput:
    """Fail as requests does when a server is down, under a wrapper that quotes a 1 MB page."""
    try:
        raise ConnectionRefusedError(f"[Errno 111] {inp.label}: connection refused")
    except ConnectionRefusedError as exc:
        raise RuntimeError("vault said: " + "z" * (1024 * 1024)) from exc


def _worker(client, task_queue):
    return build_worker(client, task_queue, registry=support.registry().merged(fakes), executor=ThreadPoolExecutor(50),
                        max_concurrent_activities=50, sandboxed=True, catalog=support.CATALOG, allow_development=True)


async def test_many_batches_of_large_outputs_stay_small_and_the_undo_is_exact(env, task_queue, tmp_path):
    out = tmp_path / "changed.txt"
    labels = [f"item{i:05d}" for i in range(ITEMS)]
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: big-outputs}}
        target: t
        params:
          items: {{type: list}}
        steps:
          - id: change
            for_each:
              items: ${{{{ params.items }}}}
              action: test.big_change
              with: {{path: "{out}", label: "${{{{ item.label }}}}", index: "${{{{ item.index }}}}"}}
              max_concurrency: 50
              error_threshold: "1%"
          - id: undo
            for_each:
              items: ${{{{ steps.change.outputs.results }}}}
              as: changed
              action: test.big_undo
              with: {{path: "${{{{ changed.restore.path }}}}", label: "${{{{ changed.restore.label }}}}"}}
              max_concurrency: 50
              error_threshold: "1%"
    """)
    params = {"items": [{"label": label, "index": i} for i, label in enumerate(labels)]}
    async with _worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue, params=params, reg=fakes)
        await handle.result()
        status = await support.status(handle)
        sizes = await run_payloads(env.client, handle.id)
    change, undo = status.steps[0].outputs, status.steps[1].outputs
    # The message names the failures that were not injected first: pytest shortens a long list in the middle.
    unexpected = [f for f in change["failures"] if "injected failure" not in f]
    assert (change["succeeded"], change["failed"]) == (ITEMS - len(FAILING), len(FAILING)), (unexpected, change["done"])
    assert [r for r in change["done"]] == [[a, b] for a, b in _gaps(ITEMS, FAILING)]
    assert "results" not in change and "not shown" in change["results_kept"]  # 2.2 MB: not in the status
    assert "results" not in undo  # no later step reads them: the batches never handed them back
    # The undo reached exactly the items that changed; the failed ones are its failures (said first, with their
    # reasons: the step tolerates 1 %, so an undo lost on a loaded machine would only show as a gap).
    assert undo["failed"] == len(FAILING), undo["failures"]
    changed, undone = _reached(tmp_path / "changed.txt"), _reached(tmp_path / "changed.txt.undo")
    assert undone == changed == [labels[i] for i in range(ITEMS) if i not in FAILING]
    assert sizes.workflows > ITEMS // 500 and not sizes.over(WARN), sizes.largest
    assert sizes.largest[0] < RESULTS_BUDGET + 64 * 1024, sizes.largest


def _gaps(total: int, holes: set[int]) -> list[tuple[int, int]]:
    ranges, start = [], 0
    for hole in sorted(holes):
        if hole > start:
            ranges.append((start, hole - 1))
        start = hole + 1
    return [*ranges, (start, total - 1)] if start < total else ranges


async def _failed_step(env, task_queue, tmp_path, action: str, label: str, during=None):
    """Run one step of `action` that fails the run; its status, its history and the payloads of both.
    during(handle): awaited before the run's end."""
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: failing}}
        target: t
        steps:
          - id: read-secret
            action: {action}
            with: {{label: {label}}}
            on_failure: abort
    """)
    async with _worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue, reg=fakes)
        if during is not None:
            await during(handle)
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        return await support.status(handle), await handle.fetch_history(), await run_payloads(env.client, handle.id)


async def test_a_five_megabyte_failure_is_recorded_with_its_reason(env, task_queue, tmp_path):
    status, _, sizes = await _failed_step(env, task_queue, tmp_path, "test.huge_failure", "consul-token")
    [message] = sizes.failures
    assert message.startswith("consul-token: vault answered 503: <html>yyy")
    assert f"[{5 * 1024 * 1024 + len('<html></html>') - MESSAGE_CHARS + len('consul-token: vault answered 503: ')} more characters cut]" in message
    assert "exceeds size limit" not in json.dumps(status.model_dump(mode="json"))
    assert "consul-token: vault answered 503" in (status.steps[0].error or "")
    assert not sizes.over(WARN), sizes.largest


def test_results_are_kept_only_when_a_later_step_reads_more_than_the_counts(tmp_path):
    from workflows.spec import ActionStep

    def step(ref: str) -> ActionStep:
        return ActionStep.model_validate({"id": "later", "action": "core.note", "with": {"message": ref}})

    assert reads_results([step("${{ steps.fan.outputs.results }}")], "fan")
    assert reads_results([step("${{ steps.fan.outputs }}")], "fan")
    assert not reads_results([step("${{ steps.fan.outputs.succeeded }} of ${{ steps.fan.outputs.total }}")], "fan")
    assert not reads_results([step("${{ steps.fan-out.outputs.results }}")], "fan")


async def test_a_retried_failure_keeps_its_cause_within_the_servers_4_kb(env, task_queue, tmp_path):
    kept: list[str] = []

    async def between_attempts(handle) -> bool:
        """What the server keeps of the first attempt's failure while the second waits (4 KB at most)."""
        pending = (await handle.describe()).raw_description.pending_activities
        kept[:] = [p.last_failure.message for p in pending if p.HasField("last_failure")]
        return bool(kept)

    status, history, _ = await _failed_step(env, task_queue, tmp_path, "test.refused_at_length", "vault.internal",
                                            during=lambda handle: support.wait_for(lambda: between_attempts(handle)))
    assert kept[0].startswith("vault said: zzz"), kept[0][:100]
    [failed] = [e.activity_task_failed_event_attributes.failure for e in history.events if e.HasField("activity_task_failed_event_attributes")]
    assert failed.message.startswith("vault said: zzz") and "more characters cut" in failed.message
    assert failed.cause.message == "[Errno 111] vault.internal: connection refused"
    assert failed.ByteSize() < 4096, failed.ByteSize()
    # The step's error is the innermost cause, as for any failure.
    assert status.steps[0].error and "vault.internal: connection refused" in status.steps[0].error


def test_a_cut_failure_keeps_what_raise_from_none_hid_hidden():
    try:
        try:
            raise FileNotFoundError("no inventory file")
        except FileNotFoundError:
            raise ValueError("target 'x' is not in the catalog: " + "w" * 5000) from None
    except ValueError as exc:
        short = bound_failure(exc)
    assert short.__cause__ is None and short.type == "ValueError"
    assert short.message.startswith("target 'x' is not in the catalog: www") and "more characters cut" in short.message

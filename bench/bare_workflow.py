"""The baselines for bench/step_overhead.py: the same activities, sequentially, with no interpreter."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows import search


@workflow.defn
class BareActivities:
    @workflow.run
    async def run(self, count: int, visible: bool = False, options: bool = False, memo_bytes: int = 0,
                  memo_keys: int = 0) -> None:
        """With `memo_bytes`, a memo of about that size is set once before the steps, under `memo_keys` keys
        (one a step when not given). With `options`, each activity is scheduled with the interpreter's heartbeat timeout and summary.
        With `visible`, each step also upserts what the interpreter's does for operators: the current step
        search attribute and one memo entry of a step's size, so their server cost is measured apart."""
        if memo_bytes:
            # A memo of the interpreter's size set once: the server keeps it in the run's mutable state and
            # writes it again with every transaction of the run (each activity's start and end, each task).
            keys = memo_keys or count
            entry = max(0, memo_bytes // keys - 30)
            workflow.upsert_memo({f"step.s{i}": {"id": f"s{i}", "pad": "x" * entry} for i in range(keys)})
        for i in range(count):
            if visible:
                workflow.upsert_search_attributes([search.CURRENT_STEP.value_set(f"s{i}")])
                workflow.upsert_memo({f"step.s{i}": {"id": f"s{i}", "kind": "action", "status": "running",
                                                    "attempts": 1, "started_at": workflow.now().isoformat()}})
            # With `options`, what the interpreter asks of the server with each of its activities
            # (workflows/calls.py): the action's heartbeat timeout and a summary for the Web UI's timeline.
            await workflow.execute_activity(
                "core.wait", {"seconds": 0}, activity_id=f"bare-{i}", start_to_close_timeout=timedelta(seconds=30),
                heartbeat_timeout=timedelta(seconds=10) if options else None,
                summary=f"s{i}: core.wait" if options else None,
            )

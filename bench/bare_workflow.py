"""The baselines for bench/step_overhead.py: the same activities, sequentially, with no interpreter."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows import search


@workflow.defn
class BareActivities:
    @workflow.run
    async def run(self, count: int, visible: bool = False) -> None:
        """With `visible`, each step also upserts what the interpreter's does for operators: the current step
        search attribute and one memo entry of a step's size, so their server cost is measured apart."""
        for i in range(count):
            if visible:
                workflow.upsert_search_attributes([search.CURRENT_STEP.value_set(f"s{i}")])
                workflow.upsert_memo({f"step.s{i}": {"id": f"s{i}", "kind": "action", "status": "running",
                                                    "attempts": 1, "started_at": workflow.now().isoformat()}})
            await workflow.execute_activity(
                "core.wait", {"seconds": 0}, activity_id=f"bare-{i}", start_to_close_timeout=timedelta(seconds=30)
            )

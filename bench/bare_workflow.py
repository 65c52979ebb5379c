"""The baseline for bench/step_overhead.py: the same activities, sequentially, with no interpreter."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow


@workflow.defn
class BareActivities:
    @workflow.run
    async def run(self, count: int) -> None:
        for i in range(count):
            await workflow.execute_activity(
                "core.wait", {"seconds": 0}, activity_id=f"bare-{i}", start_to_close_timeout=timedelta(seconds=30)
            )

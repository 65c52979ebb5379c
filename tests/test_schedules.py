"""Scheduled game-day drills: a Temporal Schedule that starts the runbook as a drill, only on drill targets."""

from __future__ import annotations

import pytest

from cli.schedules import DrillTargetRefused, schedule_drill
from tests import support
from workflows.loader import plan_run


async def test_schedule_starts_drill_runs_and_refuses_non_drill_targets(env, task_queue, tmp_path):
    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: gameday}}
        target: t
        steps:
          - id: a
            action: test.append
            with: {{path: "{out}", label: "drill=${{{{ run.drill }}}}"}}
    """)
    production = plan_run(book, registry=support.registry(), inventory={"name": "prod-" + task_queue})
    with pytest.raises(DrillTargetRefused):
        await schedule_drill(env.client, production, task_queue, "0 3 * * 1")

    lab = plan_run(book, registry=support.registry(), inventory={"name": "lab-" + task_queue, "drill": True})
    handle = await schedule_drill(env.client, lab, task_queue, "0 3 * * 1")
    try:
        described = await handle.describe()
        # The server stores the cron as a calendar: Mondays at 03:00.
        calendar = described.schedule.spec.calendars[0]
        assert [r.start for r in calendar.hour] == [3] and [r.start for r in calendar.day_of_week] == [1]
        async with support.worker(env.client, task_queue):
            await handle.trigger()
            await support.wait_for(lambda: _ran(out), timeout=30)
    finally:
        await handle.delete()
    assert support.lines(out)[0].endswith("drill=true")


async def _ran(path):
    return path.exists() and path.read_text().strip() != ""

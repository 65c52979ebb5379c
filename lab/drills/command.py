"""`coldstart drill NAME`: the demo drill or a lab drill, run now on this machine; the exit code says how it went."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.console import Console
from rich.markdown import Markdown

from activities.errors import InvalidInput

__all__ = ["DrillNotFound", "drill_names", "run_drill"]


class DrillNotFound(InvalidInput):
    """No drill by that name; the message lists the ones there are."""


def drill_names() -> list[str]:
    from lab.drills.outage import DRILLS

    return ["demo", *DRILLS]


def run_drill(name: str, state_dir: Path, console: Console, *, interactive: bool = False, keep: bool = False) -> bool:
    """Run the drill and print its report; True if the run succeeded. Raises DrillNotFound, RunbookInvalid."""
    from lab.drills.outage import DRILLS, print_report, run_lab_drill

    if name in DRILLS:
        lab_report = asyncio.run(run_lab_drill(name, state_dir, console, interactive=interactive, keep=keep))
        print_report(console, lab_report)
        return lab_report.outcome == "succeeded"
    if name != "demo":
        raise DrillNotFound(f"no drill named {name!r} (available: {', '.join(drill_names())})")
    from lab.drills.demo import run_demo_drill

    report = asyncio.run(run_demo_drill(state_dir, console, interactive=interactive))
    console.print(Markdown(report.timeline_markdown.split("## Events")[0]))
    if report.scorecard is not None:
        from cli.report import print_scorecard

        print_scorecard(console, report.scorecard)
    console.print(f"drill {report.outcome} in {report.wall_seconds:.1f} s; report written to {report.report_path}"
                  + (f"; scorecard kept in {report.scorecard_path}" if report.scorecard_path else ""), highlight=False)
    return report.outcome == "succeeded"

"""`coldstart test`: a runbook's cases on Temporal's time-skipping test server, one line per case."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from datetime import timedelta
from pathlib import Path

from rich.console import Console

from activities.catalog import load_contracts
from activities.retry import format_duration
from runtime.case_runner import CaseResult, run_cases
from runtime.casebook import cases_file_for, load_cases
from workflows.loader import RunbookInvalid

__all__ = ["test_runbook"]

# What the worker and the SDK log while a case runs (an action's scripted failure, a step that failed) is
# the path under test, said once in the case's line; the warnings of the test server's age too.
_QUIET = ("temporalio", "coldstart")


def test_runbook(runbook: Path, cases: Path | None, *, only: str | None, out: Console) -> bool:
    """Run the cases and print a line per case and a summary with the wall time; True if all passed.
    RunbookInvalid for a runbook that is not there, CasesInvalid (located) for a bad cases file, NoTestServer
    without the test server."""
    if not runbook.is_file():
        raise RunbookInvalid([f"{runbook}:1:1: cannot read: no such file"])
    contracts = load_contracts()
    book = load_cases(cases or cases_file_for(runbook), contracts)
    started = time.monotonic()
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.ERROR)
    results = asyncio.run(run_cases(runbook, book, registry=contracts,
                                    targets_dir=Path(os.environ.get("COLDSTART_TARGETS", "targets")), only=only))
    for result in results:
        out.print(result.line(), markup=False, highlight=False, soft_wrap=True)
    out.print(_summary(results, time.monotonic() - started), markup=False, highlight=False)
    return all(result.passed for result in results)


def _summary(results: list[CaseResult], wall: float) -> str:
    failed = sum(not result.passed for result in results)
    run = sum((result.observed.run_time for result in results), timedelta(0))
    return (f"{len(results) - failed} passed, {failed} failed: {format_duration(round(run.total_seconds()))} "
            f"of run time in {wall:.1f}s wall")

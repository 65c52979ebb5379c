"""Records the histories replayed by tests/test_replay.py: `python -m tests.histories.record [NAME ...]`.

Re-record only on purpose: a replay failure means the workflow code changed in a way that
would break runs already in flight. Name the histories to record (everything, rollback, gates, waited,
resolved, paced, batches), or none for all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from runtime.connection import DATA_CONVERTER
from tests import support
from tests.conftest import SERVER_STARTUP, TEMPORAL_CLI
from workflows import search
from workflows.contract import ApproveRequest, ControlRequest

HERE = Path(__file__).parent

EVERYTHING = """
metadata: {{name: replay-everything}}
target: t
approvers: [bob]
params:
  items: {{type: list, default: [a, b, c, d, e]}}
steps:
  - id: first
    action: test.append
    with: {{path: "{out}", label: first}}
  - id: healthy
    gate: {{endpoint: "{prom}", query: healthy, comparator: ">=", threshold: 1, interval: 0.1s, consecutive: 2, timeout: 10s}}
  - id: ok
    approval: {{prompt: "go after ${{{{ steps.first.outputs.line }}}}?"}}
  - id: both
    parallel:
      - id: left
        action: test.append
        with: {{path: "{out}", label: left}}
      - id: pause
        wait: 0.2s
  - id: each
    for_each:
      items: ${{{{ params.items }}}}
      action: test.maybe_fail
      with: {{path: "{out}", label: "${{{{ item }}}}", fail_items: [c]}}
      max_concurrency: 2
      error_threshold: 1
  - id: ramp
    ramp:
      action: test.append
      with: {{path: "{out}", label: "ramp ${{{{ ramp.percent }}}}"}}
      start: 10
      stop: 40
      step: 10
      gates:
        - {{name: errors, endpoint: "{prom}", query: errors, comparator: "<", threshold: 1, interval: 0.1s, timeout: 0.5s}}
"""

ROLLBACK = """
metadata: {{name: replay-rollback}}
target: t
steps:
  - id: one
    action: test.append
    with: {{path: "{out}", label: one}}
  - id: two
    action: test.maybe_fail
    with: {{path: "{out}", label: two, fail_items: [two]}}
    on_failure: rollback
"""

# A for_each over more items than one run keeps (FANOUT_CHILD_THRESHOLD): sealed batches in child workflows.
BATCHES = """
metadata: {{name: replay-batches}}
target: t
steps:
  - id: each
    for_each:
      items: [i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15, i16, i17, i18, i19, i20, i21, i22, i23, i24, i25, i26, i27, i28, i29, i30, i31, i32, i33, i34, i35, i36, i37, i38, i39, i40, i41, i42, i43, i44, i45, i46, i47, i48, i49, i50, i51, i52, i53, i54, i55, i56, i57, i58, i59, i60, i61, i62, i63, i64, i65, i66, i67, i68, i69, i70, i71, i72, i73, i74, i75, i76, i77, i78, i79, i80, i81, i82, i83, i84, i85, i86, i87, i88, i89, i90, i91, i92, i93, i94, i95, i96, i97, i98, i99, i100, i101, i102, i103, i104, i105, i106, i107, i108, i109, i110, i111, i112, i113, i114, i115, i116, i117, i118, i119]
      action: test.append
      with: {{path: "{out}", label: "${{{{ item }}}}"}}
      max_concurrency: 20
"""

# Parallel gates due together read in one activity and wait on one timer (workflows/readings.py):
# ready passes at its second reading, slow at its third, fast (an interval of its own) at its second.
GATES = """
metadata: {{name: replay-gates}}
target: t
steps:
  - id: all
    parallel:
      - id: ready
        gate: {{endpoint: "{prom}", query: ready, comparator: ">=", threshold: 1, interval: 0.1s, timeout: 10s}}
      - id: slow
        gate: {{endpoint: "{prom}", query: slow, comparator: ">=", threshold: 1, interval: 0.1s, timeout: 10s}}
      - id: fast
        gate: {{endpoint: "{prom}", query: fast, comparator: ">=", threshold: 1, interval: 0.05s, consecutive: 2, timeout: 10s}}
"""

# The same gates since their sub-second waits are waited in the readings (activities/telemetry.py
# WAITED_IN_READING): no timers, each read after the first with its not_before.
WAITED = GATES.replace("replay-gates", "replay-waited")

# Fast steps, then an approval while the live view's window (workflows/visibility.py) is open: paced.json
# was recorded when the view cancelled the window's timer for an ask, so it replays that path.
PACED = """
metadata: {{name: replay-paced}}
target: t
approvers: [bob]
steps:
""" + "".join(f"""  - id: s{i}
    action: test.append
    with: {{{{path: "{{out}}", label: s{i}}}}}
""" for i in range(10)) + """  - id: ok
    approval: {{prompt: "go?"}}
  - id: last
    action: test.append
    with: {{path: "{out}", label: last}}
"""


async def _record(names: set[str]) -> None:
    environment = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_CLI), data_converter=DATA_CONVERTER,
        search_attributes=search.ALL, dev_server_log_level="error", dev_server_startup_timeout=SERVER_STARTUP,
    )
    prom = await support.ScriptedPrometheus().start()
    work = Path(tempfile.mkdtemp())
    try:
        async with support.worker(environment.client, "record"):
            if "gates" in names:
                await _record_gates(environment, prom, work)
            if "waited" in names:
                await _record_gates(environment, prom, work, name="waited", book=WAITED)
            if "everything" in names:
                await _record_everything(environment, prom, work)
            if "rollback" in names:
                await _record_rollback(environment, work)
            if "resolved" in names:
                await _record_rollback(environment, work, name="resolved")
            if "paced" in names:
                await _record_paced(environment, work)
            if "batches" in names:
                await _record_batches(environment, work)
    finally:
        await prom.stop()
        await environment.shutdown()


async def _record_gates(environment, prom, work: Path, name: str = "gates", book: str = GATES) -> None:
    prom.script("ready", 0, 1)
    prom.script("slow", 0, 0, 1)
    prom.script("fast", 1)
    path = support.write_runbook(work, book.format(prom=prom.url), name)
    handle = await support.start(environment.client, path, "record", target={"name": f"replay-{name}"})
    await handle.result()
    (HERE / f"{name}.json").write_text((await handle.fetch_history()).to_json())


async def _record_everything(environment, prom, work: Path) -> None:
    prom.script("healthy", 0, 1, 1)
    prom.script("errors", 0, 0, 5)  # 10 % and 20 % pass, 30 % fails and steps back
    book = support.write_runbook(work, EVERYTHING.format(out=work / "out.txt", prom=prom.url), "everything")
    handle = await support.start(environment.client, book, "record", target={"name": "replay-everything"})
    await support.wait_for(lambda: _awaiting(handle))
    await handle.execute_update("approve", ApproveRequest(step="ok", approver="bob", comment="recorded"))
    await support.wait_for(lambda: _held(handle))
    prom.script("errors", 0)
    await handle.execute_update("retry", ControlRequest(step="ramp", actor="bob", reason="fixed"))
    await handle.result()
    (HERE / "everything.json").write_text((await handle.fetch_history()).to_json())


async def _record_batches(environment, work: Path) -> None:
    book = support.write_runbook(work, BATCHES.format(out=work / "out.txt"), "batches")
    handle = await support.start(environment.client, book, "record", target={"name": "replay-batches"})
    await handle.result()
    (HERE / "batches.json").write_text((await handle.fetch_history()).to_json())


async def _record_rollback(environment, work: Path, name: str = "rollback") -> None:
    """A run that fails and rolls back (resolved.json: the same run under another target)."""
    book = support.write_runbook(work, ROLLBACK.format(out=work / "out.txt"), name)
    handle = await support.start(environment.client, book, "record", target={"name": f"replay-{name}"})
    with contextlib.suppress(Exception):  # this run is meant to fail and roll back
        await handle.result()
    (HERE / f"{name}.json").write_text((await handle.fetch_history()).to_json())


async def _record_paced(environment, work: Path) -> None:
    book = support.write_runbook(work, PACED.format(out=work / "out.txt"), "paced")
    handle = await support.start(environment.client, book, "record", target={"name": "replay-paced"})
    await support.wait_for(lambda: _awaiting(handle))
    await handle.execute_update("approve", ApproveRequest(step="ok", approver="bob", comment="recorded"))
    await handle.result()
    (HERE / "paced.json").write_text((await handle.fetch_history()).to_json())


async def _awaiting(handle):
    return "ok" in (await support.status(handle)).awaiting_approval


async def _held(handle):
    return "ramp" in (await support.status(handle)).held


if __name__ == "__main__":
    asyncio.run(_record(set(sys.argv[1:]) or {"everything", "rollback", "gates", "waited", "resolved", "paced",
                                              "batches"}))

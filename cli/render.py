"""Terminal views with rich: the plan, a run's status, the run list and live follow."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, assert_never

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from activities.policy import OPERATOR_VERBS, TargetPolicy
from activities.retry import format_duration
from workflows.contract import GateReading, RunInput, RunStatus, StepState, workflow_id_for
from workflows.refs import REF, RefError, lookup
from workflows.spec import (
    ActionStep,
    AnyStep,
    ApprovalStep,
    ForEachStep,
    GateSpec,
    GateStep,
    ParallelStep,
    RampStep,
    WaitStep,
)

if TYPE_CHECKING:
    from runtime.polling import Sleep

__all__ = ["decisions", "ending", "follow", "held_reason", "plan", "reading_text", "runs", "status"]

_STYLE = {
    "succeeded": "green",
    "failed": "red",
    "held": "yellow",
    "awaiting_approval": "cyan",
    "running": "bold",
    "skipped": "dim",
    "rolled_back": "magenta",
    "aborted": "red",
}


# A reading that failed its gate, said the way it failed: `cache_hit_ratio=0.62 < 0.9` for a `>=` gate.
_FAILING = {">=": "<", ">": "<=", "<=": ">", "<": ">=", "==": "!=", "!=": "=="}
# The run's own states: what the Web UI's current step reads once a run has ended.
_RUN_STATES = frozenset({"succeeded", "failed", "aborted", "rolled_back"})


def _gate_text(gate: GateSpec) -> str:
    hold = f"{gate.consecutive}x" + (f" over {format_duration(gate.bake)}" if gate.bake else "")
    return (f"{gate.query or gate.endpoint} {gate.comparator} {gate.threshold:g} "
            f"({hold}, every {format_duration(gate.interval)}, timeout {format_duration(gate.timeout)})")


def _run_refs(text: str, run: RunInput) -> str:
    """`${{ run.initiator }}` and `${{ run.target }}` (and the runbook, drill) as the run will have them;
    every other reference stays as written (step outputs, the run id, are known only as the run goes)."""
    known = {"run": {"initiator": run.initiator, "target": run.target_name, "runbook": run.runbook.metadata.name,
                     "drill": run.drill}}

    def substitute(match: Any) -> str:
        if not match.group(1).startswith("run."):
            return match.group(0)
        try:
            return str(lookup(match.group(1), known))
        except RefError:
            return match.group(0)

    return REF.sub(substitute, text)


def _param_text(run: RunInput, name: str, value: Any) -> str:
    declared = run.runbook.params.get(name)
    if declared is not None and declared.type == "duration" and isinstance(value, (int, float)):
        return f"{name}={format_duration(value)}"
    return f"{name}={value!r}"


def _describe(step: AnyStep, run: RunInput) -> str:
    if isinstance(step, ActionStep):
        text = f"{step.action} {step.with_}"
        if step.undo:
            text += f"; undo {step.undo.action}"
        return text
    if isinstance(step, GateStep):
        return "gate " + _gate_text(step.gate)
    if isinstance(step, ApprovalStep):
        who = step.approval.approvers if step.approval.approvers is not None else run.runbook.approvers
        return f"approval by {', '.join(who) or 'anyone'}: {step.approval.prompt}"
    if isinstance(step, WaitStep):
        return f"wait {format_duration(step.wait)}"
    if isinstance(step, RampStep):
        ramp = step.ramp
        parts = [f"ramp {ramp.schedule()} via {ramp.action}, bake {format_duration(ramp.bake)}"]
        parts += ["gate " + _gate_text(g) for g in ramp.gates]
        if ramp.approval:
            parts.append("approval at each step")
        return "; ".join(parts)
    if isinstance(step, ForEachStep):
        each = step.for_each
        items = each.items if isinstance(each.items, str) else f"{len(each.items)} items"
        return f"{each.action} for each of {items} (concurrency {each.max_concurrency}, tolerate {each.error_threshold})"
    if isinstance(step, ParallelStep):
        return "in parallel: " + ", ".join(s.id for s in step.parallel)
    assert_never(step)


def _access(run: RunInput) -> str:
    """Who may decide what in this run: the target's policy narrowed by the runbook, as the run enforces it
    (workflows/controls.py)."""
    from workflows.identity import effective_identity

    book, policy = run.runbook, TargetPolicy.of(run.target)
    approvers = policy.run_approvers(book.approvers)
    operators = policy.run_operators(book.operators, book.approvers)
    skip = ", ".join(approvers) if approvers else "nobody (no approvers)"
    parts = [f"approve and skip: {skip}" + (" (four eyes)" if book.four_eyes or policy.four_eyes else ""),
             "retry/pause/resume/abort: " + (", ".join(operators) if operators
                                             else "nobody (no operators or approvers named)")]
    identity = effective_identity(book.identity, policy.identity)
    if identity:
        # The target's verified identity covers every control that steers the run, listed or not.
        controls = list(identity.controls)
        if policy.identity is not None:
            controls += [verb for verb in OPERATOR_VERBS if verb not in controls]
        parts.append(f"verified identity for {', '.join(controls)} (Vault {identity.vault})")
    return "access: " + "; ".join(parts)


def plan(console: Console, run: RunInput) -> None:
    book = run.runbook
    console.print(f"[bold]{book.metadata.name}[/] on target [bold]{run.target_name}[/] (initiator {run.initiator})")
    if run.params:
        console.print("params: " + ", ".join(_param_text(run, k, v) for k, v in run.params.items()), highlight=False)
    console.print(_access(run), highlight=False)
    table = Table("#", "step", "kind", "what it will do", "on failure", show_lines=False)

    def add(steps: list[Any], prefix: str) -> None:
        for i, step in enumerate(steps, 1):
            table.add_row(f"{prefix}{i}", step.id, step.kind, Text(_run_refs(_describe(step, run), run)),
                          step.on_failure.value)
            if isinstance(step, ParallelStep):
                add(step.parallel, f"{prefix}{i}.")

    add(book.steps, "")
    console.print(table)
    console.print("nothing was executed (dry run)", style="dim")


def reading_text(reading: GateReading) -> str:
    """A gate reading against its threshold: `cache_hit_ratio=0.62 < 0.9`, `up=1 >= 1`, or, with no value,
    `prometheus-up=none (http://127.0.0.1:9 unreachable: ClientConnectorError)`."""
    text = f"{reading.gate}={'none' if reading.value is None else f'{reading.value:g}'}"
    if reading.error:
        text += f" ({reading.error})"
    elif reading.value is not None and reading.comparator and reading.threshold is not None:
        comparator = reading.comparator if reading.passed else _FAILING.get(reading.comparator, "vs")
        text += f" {comparator} {reading.threshold:g}"
    return text + (f" at {reading.percent}%" if reading.percent is not None else "")


def held_reason(step: StepState) -> str:
    """Why a step holds: its gate's last reading when that one failed, else the step's error."""
    last = step.readings[-1] if step.readings else None
    if last is not None and not last.passed:
        return reading_text(last)
    return step.error or "it failed"


def _gate_left(step: StepState, now: datetime) -> timedelta | None:
    """How long the step's gate has left before it gives up, while it reads; None otherwise."""
    if step.status != "running" or step.gate_gives_up_at is None:
        return None
    return max(step.gate_gives_up_at - now, timedelta(0))


def _left_text(left: timedelta, *, coarse: bool = False) -> str:
    """`gives up in 42s`; coarse (a log line, not a live view): to the 10 s under two minutes, the minute above."""
    seconds = max(0, int(-(-left.total_seconds() // 1)))
    if coarse and seconds >= 120:
        seconds = round(seconds / 60) * 60
    elif coarse and seconds >= 10:
        seconds = round(seconds / 10) * 10
    return f"gives up in {format_duration(seconds)}" if seconds else "gives up now"


def _ref(current: RunStatus) -> str:
    """How a command names the run: its target, or its workflow id when that is not the target's (a schedule's)."""
    return current.target if current.workflow_id == workflow_id_for(current.target) else current.workflow_id


def _command(current: RunStatus, verb: str, step: str) -> str:
    """Pasted as it is, it acts as whoever runs it ($COLDSTART_USER or their login; --as names someone else)."""
    verified = " --vault-login" if verb in current.identity_required else ""
    return f"coldstart {verb} {_ref(current)} {step}{verified}"


def decisions(current: RunStatus) -> list[str]:
    """What the run waits on, why, and the exact commands that answer it (who may, where the run says)."""
    steps = {step.id: step for step in current.steps}
    lines: list[str] = []
    # Who may decide goes on a line of its own, so each command stays short enough to copy from 80 columns.
    for name in current.awaiting_approval:
        step = steps.get(name)
        lines.append(f"{name} awaits approval" + (f": {step.awaiting}" if step and step.awaiting else ""))
        if name in current.approvers:
            allowed = current.approvers[name]
            lines.append("  may approve: " + ("anyone named" if allowed is None else ", ".join(allowed) or "nobody"))
        lines.append(f"  approve with: {_command(current, 'approve', name)}")
    for name in current.held:
        step = steps.get(name)
        lines.append(f"{name} is held: {held_reason(step) if step else 'it failed'}")
        if step and step.skip_requested_by:
            lines.append(f"  skip requested by {step.skip_requested_by}: four eyes, a second approver confirms")
        who = []
        if current.operators is not None:
            who.append(f"may retry or abort: {', '.join(current.operators) or 'nobody'}")
        if current.skippers is not None:
            who.append(f"may skip: {', '.join(current.skippers) or 'nobody (no approvers)'}")
        if who:
            lines.append("  " + "; ".join(who))
        lines.append(f"  retry: {_command(current, 'retry', name)}")
        lines.append(f"  skip:  {_command(current, 'skip', name)}")
        lines.append(f"  abort: {_command(current, 'abort', name)}")
    return lines


# What a screen shows of why a run ended: a long error (a traceback's message, a Consul reply) is cut.
_ENDING_WIDTH, _ENDING_STEPS = 400, 5


def _cut(text: str, width: int = _ENDING_WIDTH) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def ending(current: RunStatus) -> list[str]:
    """Why a run that did not succeed ended: its error (a refusal says its remedy) and each failed step's, cut to
    a screen; nothing while it runs or once it succeeded."""
    if not current.over or current.state == "succeeded":
        return []
    lines = [f"{current.state}: {_cut(current.error)}"] if current.error else [f"{current.state}"]
    failed = [s for s in current.steps if s.status == "failed" and s.error and s.error not in (current.error or "")]
    lines += [f"  {s.id}: {_cut(s.error or '')}" for s in failed[:_ENDING_STEPS]]
    if len(failed) > _ENDING_STEPS:
        lines.append(f"  and {len(failed) - _ENDING_STEPS} more failed steps: coldstart status {current.target}")
    return lines


def _detail(step: StepState, now: datetime) -> str:
    if step.status == "held":
        return f"holds: {held_reason(step)}"
    if step.awaiting:
        return f"waiting: {step.awaiting}"
    if step.status == "failed" and step.error:
        return step.error
    parts = []
    if step.percent is not None:
        parts.append(f"at {step.percent}% (last good {step.last_good})")
    if step.readings:
        parts.append(reading_text(step.readings[-1]))
    if (left := _gate_left(step, now)) is not None:
        parts.append(_left_text(left))
    return "; ".join(parts)


def status(console: Console, current: RunStatus, *, web_ui: str | None = None,
           now: datetime | None = None) -> None:
    now = now or datetime.now(UTC)
    console.print(
        f"[bold]{current.runbook}[/] on [bold]{current.target}[/]: {current.state}"
        + (f" at {current.current_step}" if current.current_step else ""),
        highlight=False,
    )
    if current.error:
        console.print(f"error: {current.error}", style="red", highlight=False, markup=False)
    table = Table("step", "kind", "status", "tries", "last reading / detail")
    for step in current.steps:
        table.add_row(step.id, step.kind, Text(step.status, style=_STYLE.get(step.status, "")), str(step.attempts),
                      Text(_detail(step, now)))
    console.print(table)
    for line in decisions(current):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if current.controller_version:
        console.print(f"resolved by coldstart {current.controller_version}, actions {current.contracts_digest or '?'}"
                      + (f", runbook {current.runbook_digest[:19]}" if current.runbook_digest else ""),
                      highlight=False, markup=False, soft_wrap=True, style="dim")
    if web_ui:
        console.print(f"Web UI: {web_ui}", highlight=False, markup=False, soft_wrap=True)


def runs(console: Console, rows: list[dict[str, Any]], *, all_runs: bool = False) -> None:
    if not rows:
        console.print("no runs yet" if all_runs else
                      "no run is running (`coldstart list --all` shows the finished ones too)", highlight=False)
        return
    # The run's name is what every other command takes: never cut, whatever the terminal's width.
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("workflow", no_wrap=True, min_width=max(len(row["workflow_id"]) for row in rows))
    table.add_column("status", overflow="fold")
    table.add_column("runbook", overflow="fold")
    targets = any(row["workflow_id"] != workflow_id_for(str(row["target"])) for row in rows)
    if targets:  # a run whose name is not its target's (a schedule's)
        table.add_column("target", overflow="fold")
    table.add_column("step", overflow="fold")
    table.add_column("started", no_wrap=True)
    for row in rows:
        step, state = str(row["step"] or ""), row["status"]
        if state != "running" and step in _RUN_STATES:
            state, step = step, ""  # an ended run's own outcome (aborted, rolled back), and no step
        elif state == "running" and row["awaiting_approval"]:
            state = "awaits approval"
        cells = [row["workflow_id"], state, str(row["runbook"]) + (" (drill)" if row["drill"] else "")]
        cells += [str(row["target"])] if targets else []
        table.add_row(*cells, step, f"{row['started']:%m-%d %H:%M}")
    console.print(table)


class _LiveView:
    """The follow view, rendered anew at each refresh: a gate's time left counts down between reads."""

    def __init__(self, current: RunStatus) -> None:
        self.current = current

    def __rich__(self) -> Group:
        current, now = self.current, datetime.now(UTC)
        parts: list[Any] = [Text.from_markup(f"[bold]{current.runbook}[/] on {current.target}: {current.state}")]
        for step in current.steps:
            if step.status in ("pending",):
                continue
            line = Text(f"  {step.id:<28} ", style=_STYLE.get(step.status, ""))
            line.append(step.status)
            if step.readings and step.status != "held":
                last = step.readings[-1]
                line.append(f"  {reading_text(last)}" + (" ok" if last.passed else " no"))
            if (left := _gate_left(step, now)) is not None:
                line.append(f"  {_left_text(left)}", style="yellow")
            if step.status == "awaiting_approval":
                line.append("  see below", style="cyan")  # the prompt, who may approve and the command
            elif step.awaiting and step.status != "held":
                line.append(f"  waiting: {step.awaiting}", style="cyan")
            parts.append(line)
            if step.kind == "ramp" and step.percent is not None:
                parts.append(Text(f"    ramp {step.percent}% (last good {step.last_good or 0}%)"))
                parts.append(ProgressBar(total=100, completed=step.percent, width=50))
        parts += [Text(line, style="yellow" if not line.startswith(" ") else "") for line in decisions(current)]
        parts += [Text(line, style="red") for line in ending(current)]
        return Group(*parts)


def _plain_lines(current: RunStatus) -> list[str]:
    """The follow view as log lines (no terminal): the run's state, each gate reading with its time left
    (coarse, so a steady gate adds a line every 10 s at most), what the run waits on and the commands."""
    now = datetime.now(UTC)
    active = [s for s in current.steps if s.status not in ("pending",)]
    lines = [f"{current.state} " + " ".join(f"{s.id}:{s.status}" + (f"@{s.percent}%" if s.percent is not None else "")
                                            for s in active[-3:])]
    for step in active:
        left = _gate_left(step, now)
        if left is not None and step.readings:
            lines.append(f"  {step.id}: {reading_text(step.readings[-1])}; {_left_text(left, coarse=True)}")
    return lines + decisions(current) + ending(current)


async def follow(client: Any, workflow_id: str, console: Console, *, interval: float = 3.0,
                 query_every: float = 2.0, sleep: Sleep = asyncio.sleep, web_ui: str | None = None) -> int:
    """Show the run live until it ends; the exit code is 0 only if it succeeded. Whatever the run waits on
    (an approval, a held step) is said with its reason and the exact commands; `web_ui`: the run's page.

    Polls through RunWatch (runtime/polling.py): the server every `interval`, jittered, the worker's
    status Query (runs older than the status memo only) when the run moved and at most every
    `query_every`, backing off with jitter while Temporal refuses. A recovery's steps take seconds
    to minutes, so a view refreshes every 3 s. What fifty views cost the run they watch, on two cores
    beside the dev server, is the server's CPU per describe (about 1.7 ms, and 3.3 ms on a 90-step run:
    the memo is in every answer): every second 1.12x / 1.32x a step (median / p95); every 2 s,
    ending on the memo's last status, 1.07x / 1.16x on 90-step runs (p95 interval 1.11x to 1.21x, 10
    rounds); every 3 s 1.05x / 1.11x (1.06x to 1.17x). While the run stands still (waiting on
    an approver, held) a view reads it less often, up to every 6 s (RunWatch)."""
    # Temporal's client (through the polling) loads only for a live view, not for `plan`.
    from runtime.polling import RunWatch

    watch = RunWatch(client.get_workflow_handle(workflow_id), interval=interval, query_every=query_every, sleep=sleep)
    if web_ui:
        console.print(f"Web UI: {web_ui}", highlight=False, markup=False, soft_wrap=True)
    shown: list[str] = []
    live = Live(console=console, refresh_per_second=4, transient=False) if console.is_terminal else None
    if live:
        live.start()
    try:
        while True:
            current = await watch.next()
            if live:
                live.update(_LiveView(current))
            else:
                # Each line once while it holds: what changed since the last read is printed, nothing else.
                lines = _plain_lines(current)
                for line in lines:
                    if line not in shown:
                        console.print(line, highlight=False, markup=False, soft_wrap=True)
                shown = lines
            if current.over:
                return 0 if current.state == "succeeded" else 1
    finally:
        if live:
            live.stop()
        sys.stdout.flush()

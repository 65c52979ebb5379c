"""Scorecards across runs: each phase's time per drill, as a table and a trend plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.table import Column, Table

from activities.errors import InvalidInput
from cli.scorecard import Scorecard, said_duration, score, scorecard_rows
from cli.timeline import build_timeline

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = ["PlotUnavailable", "collect", "keep", "kept", "plot_trend", "print_scorecard", "print_trend"]


class PlotUnavailable(InvalidInput):
    """The trend PNG needs matplotlib (the `report` extra)."""


async def collect(client: Client, target: str, *, runbook: str | None = None, drills_only: bool = True,
                  limit: int = 50) -> list[Scorecard]:
    """The scorecards of the newest `limit` finished runs on `target` whose runbook states objectives, oldest first."""
    from workflows import search

    query = (f"WorkflowType = 'RunbookWorkflow' AND ExecutionStatus != 'Running' "
             f"AND {search.TARGET.name} = {json.dumps(target)}")
    if runbook is not None:
        query += f" AND {search.RUNBOOK.name} = {json.dumps(runbook)}"
    if drills_only:
        query += f" AND {search.DRILL.name} = true"
    cards = []
    async for execution in client.list_workflows(query, limit=limit):
        card = score(await build_timeline(client, execution.id, execution.run_id))
        if card is not None:
            cards.append(card)
    return sorted(cards, key=lambda c: (c.started is None, c.started))


def _short_digest(card: Scorecard) -> str:
    return card.runbook_digest.removeprefix("sha256:")[:12]


def keep(card: Scorecard, path: Path) -> Path:
    """Append the scorecard to a JSON-lines file: drills on a throwaway Temporal keep their scorecards there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as file:
        file.write(json.dumps(card.to_json(), sort_keys=True) + "\n")
    return path


def kept(path: Path, target: str, *, runbook: str | None = None, limit: int = 50) -> list[Scorecard]:
    """The newest `limit` scorecards kept in `path` for `target` (and `runbook`), oldest first."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InvalidInput(f"{path}: {exc.strerror or exc}") from None
    cards = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            card = Scorecard.from_json(json.loads(line))
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidInput(f"{path}:{number}: not a kept scorecard ({exc})") from None
        if card.target == target and runbook in (None, card.runbook):
            cards.append(card)
    return sorted(cards, key=lambda c: (c.started is None, c.started))[-limit:]


def print_scorecard(console: Console, card: Scorecard) -> None:
    """One run's scorecard: each phase's objective, time measured, and what the time went to."""
    # Borderless, so the eight columns fit a terminal of 80; phase names whole (the other columns give way).
    rows = scorecard_rows(card)
    longest = max((len(row[0]) for row in rows), default=5)
    table = Table(Column("phase", no_wrap=True, min_width=longest), "objective", "took", "", "operators", "gates",
                  "bakes", "working", box=box.SIMPLE, pad_edge=False, title_justify="left",
                  title=f"scorecard: {card.runbook} on {card.target} ({card.outcome}, runbook {_short_digest(card)})")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def print_trend(console: Console, cards: list[Scorecard]) -> None:
    """One row per run (started, UTC), one column per phase: the time it took (`!` where it missed its objective)."""
    phases = list(dict.fromkeys(p.name for card in cards for p in card.phases))
    table = Table(Column("started", no_wrap=True), "runbook", Column("outcome", no_wrap=True), *phases, "total",
                  box=box.SIMPLE, pad_edge=False)
    for card in cards:
        by_name = {p.name: p for p in card.phases}
        cells = []
        for name in phases:
            phase = by_name.get(name)
            if phase is None or phase.measured_s is None:
                cells.append("-")
            else:
                cells.append(said_duration(phase.measured_s) + ("!" if phase.met is False else ""))
        started = card.started.strftime("%m-%d %H:%M") if card.started else "?"
        table.add_row(started, _short_digest(card)[:8], card.outcome, *cells, said_duration(card.wall_s))
    console.print(table)


def plot_trend(cards: list[Scorecard], path: Path) -> Path:
    """Each phase's time per run, in order, on a log scale (a drill's seconds and an outage's hours on one plot),
    with each phase's objective dashed in the same colour."""
    try:
        import matplotlib as mpl

        mpl.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable("the trend PNG needs matplotlib: pip install 'coldstart[report]'") from exc
    phases = list(dict.fromkeys(p.name for card in cards for p in card.phases))
    figure, axis = plt.subplots(figsize=(10, 4.8))
    runs = list(range(1, len(cards) + 1))
    for index, name in enumerate(phases):
        colour = f"C{index % 10}"
        measured = [next((p.measured_s for p in card.phases if p.name == name), None) for card in cards]
        axis.plot(runs, [m if m is not None else float("nan") for m in measured], marker="o", color=colour, label=name)
        objective = next((p.objective_s for card in cards for p in card.phases if p.name == name and p.objective_s), None)
        if objective:
            axis.axhline(objective, color=colour, linestyle="--", linewidth=0.8)
    walls = [c.wall_s if c.wall_s is not None else float("nan") for c in cards]
    axis.plot(runs, walls, marker="s", color="black", label="whole run")
    rto = next((c.rto_s for c in cards if c.rto_s), None)
    if rto:
        axis.axhline(rto, color="black", linestyle="--", linewidth=0.8)
    axis.set_yscale("log")
    axis.set_xticks(runs, [c.started.strftime("%m-%d %H:%M") if c.started else "?" for c in cards],
                    rotation=30, ha="right", fontsize=8)
    axis.set_xlabel("run (started, UTC)")
    axis.set_ylabel("seconds (log); dashed: objective")
    target = cards[0].target if cards else ""
    axis.set_title(f"Recovery phases per drill on {target}")
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axis.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path

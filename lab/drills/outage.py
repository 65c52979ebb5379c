"""Drills against the lab: bring it up, inject the outage, run the runbook as a drill, report, tear down."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from activities.catalog import load_registry
from cli import render
from cli.identity import DecisionSource, fetch_decision_token, fetch_identity_token, own_vault, start_source
from cli.report import keep as keep_scorecard
from cli.report import print_scorecard
from cli.scorecard import Scorecard, score
from cli.timeline import build_timeline, render_markdown
from lab.drills.demo import DRILL_APPROVER, auto_approve
from lab.hosts.tenancy import record_owner
from runtime.connection import connect
from runtime.processes import free_port, start_process
from runtime.runs import start_run, workflow_id_for
from runtime.server_config import dev_server_argv
from workflows.contract import RunStatus
from workflows.loader import plan_run

__all__ = ["DRILLS", "DrillSpec", "LabDrillReport", "run_lab_drill"]


@dataclass(frozen=True)
class DrillSpec:
    """A drill: the runbook, the outage injected before it, and the parameters that shrink its waits."""

    runbook: Path
    faults: tuple[tuple[str, dict[str, Any]], ...]
    params: dict[str, Any] = field(default_factory=dict)


DRILLS: dict[str, DrillSpec] = {
    "consul-cold-start": DrillSpec(
        runbook=Path("runbooks/consul-cold-start.yaml"),
        # In the outage's order: the bad snapshot restore and the failing node came first; then the
        # contention and the slow leader (a starved real leader loses leadership during a restore).
        faults=(
            ("stale-scheduling-data", {}),
            ("unhealthy-node-eligible", {"target": "cache3"}),
            ("cold-cache", {}),
            ("consul-contention", {}),
            ("slow-leader", {"target": "consul1"}),
        ),
        # The on-call names the slow servers from their metrics; the drill knows which one it slowed.
        params={"slow_servers": ["consul1"]},
    ),
}


@dataclass
class LabDrillReport:
    outcome: str
    wall_seconds: float
    run_seconds: float  # the runbook run alone: start to close, without lab up/down
    configured_wait_seconds: float
    phases: list[tuple[str, float]]
    gates: list[tuple[str, str, int, int, str]]
    ramp: list[tuple[int, float | None]]
    timeline_markdown: str
    report_path: Path
    plot_path: Path | None
    backends: dict[str, str] = field(default_factory=dict)  # system -> "real (path)" or "stand-in"
    scorecard: Scorecard | None = None  # against the runbook's objectives; kept in scorecard_path
    scorecard_path: Path | None = None


async def _abort_when_held(client: Any, workflow_id: str, console: Console, grace_s: float = 5.0) -> None:
    """Unattended, nobody answers a held step: end the drill as failed, naming the step and why."""
    from runtime.polling import read_kept_status
    from workflows.contract import ControlRequest

    handle = client.get_workflow_handle(workflow_id)
    held_since: dict[str, float] = {}
    while True:
        await asyncio.sleep(1.0)
        try:
            current = await read_kept_status(handle, attempts=1)
        except Exception:  # noqa: BLE001, S112 - server busy or restarting; the next poll tries again
            continue
        if current.over:
            return
        held = {s.id: s for s in current.steps if s.status == "held"}
        held_since = {k: v for k, v in held_since.items() if k in held}
        for step_id, step in held.items():
            since = held_since.setdefault(step_id, time.monotonic())
            if time.monotonic() - since >= grace_s:
                reason = f"unattended drill: {step_id} held ({step.error or 'no detail'})"
                console.print(reason, style="red", highlight=False)
                await handle.execute_update("abort", ControlRequest(actor="drill-bot", reason=reason[:500]))
                return


# The lab's drill starter (lab/identity.LAB_APPROVERS has its Vault user): it starts, drill-bot approves.
DRILL_STARTER = "drill-starter"


def _drill_identity(inventory: dict[str, Any], user: str = DRILL_APPROVER
                    ) -> Callable[[DecisionSource | None], str] | None:
    """A drill user's own login to the lab's Vault: a fresh identity token per decision, bound to it when the run
    names its source (the provider and the decision's nonce)."""
    ident = (inventory.get("facts") or {}).get("identity")
    if not ident:
        return None
    password = Path(ident["password_files"][user]).read_text().strip()
    mount = ident.get("userpass_mount", "userpass")

    def fetch(source: DecisionSource | None) -> str:
        if source is None:
            return fetch_identity_token(ident["vault"], ident["role"], username=user, password=password, mount=mount)
        # The drill user's password goes to the lab's own Vault, which the run must name too.
        return fetch_decision_token(own_vault(ident["vault"], source.vault), source.provider, source.audience,
                                    source.nonce, username=user, password=password, mount=mount, ca_cert=source.ca_cert)
    return fetch


def vault_token(inventory: dict[str, Any]) -> str:
    """Log the worker in with the lab's AppRole: the token lives in the worker's environment only."""
    import hvac

    login = inventory["vault"]
    client = hvac.Client(url=login["address"])
    role_id = Path(login["approle_role_id_file"]).read_text().strip()
    secret_id = Path(login["approle_secret_id_file"]).read_text().strip()
    return client.auth.approle.login(role_id=role_id, secret_id=secret_id)["auth"]["client_token"]


async def _admitted_curve(prometheus: str, start: float, end: float) -> list[tuple[float, float, float]]:
    """(time, target %, admitted %) from the players generator, read back from Prometheus."""
    from activities.prometheus import PrometheusError, range_query

    series: dict[str, dict[float, float]] = {}
    for name, query in (("target", "max(coldstart_players_target_percent)"),
                        ("admitted", "max(coldstart_players_admitted_fraction) * 100")):
        try:
            result = (await range_query(prometheus, query, start=start, end=end)).get("result", [])
        except PrometheusError:
            result = []
        series[name] = {float(t): float(v) for t, v in result[0]["values"]} if result else {}
    # A target read as NaN (the generator before its first sweep) is no step of the ramp.
    return [(t, target, series["admitted"].get(t, float("nan")))
            for t, target in sorted(series["target"].items()) if not math.isnan(target)]


def _plot(curve: list[tuple[float, float, float]], path: Path) -> Path | None:
    if not curve:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = curve[0][0]
    figure, axis = plt.subplots(figsize=(8, 4))
    axis.step([t - t0 for t, _, _ in curve], [c[1] for c in curve], where="post", label="target %")
    axis.plot([t - t0 for t, _, _ in curve], [c[2] for c in curve], marker=".", label="admitted %")
    axis.set_xlabel("seconds into the drill")
    axis.set_ylabel("players %")
    axis.set_ylim(0, 105)
    axis.grid(alpha=0.3)
    axis.legend()
    axis.set_title("Player ramp: admitted players against the DNS steering target")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


async def run_lab_drill(name: str, state_dir: Path, console: Console, *, interactive: bool = False,
                        keep: bool = False, params: dict[str, Any] | None = None,
                        lab: dict[str, Any] | None = None,
                        on_lab_up: Callable[[Any], None] | None = None) -> LabDrillReport:
    """`lab` overrides LabConfig fields (prefix, bridge, veth_prefix, subnet) to keep apart from another lab.
    `on_lab_up(cfg)` runs once the lab is up, before the incident (a test seam: the secret scan reads the lab's
    credentials there, since `lab down` removes them)."""
    from lab import faults as lab_faults
    from lab import lifecycle
    from lab.settings import LabConfig
    from runtime.catalog import Catalog
    from runtime.worker import build_worker
    from workflows.loader import read_inventory
    from workflows.yaml_safety import load_file

    spec = DRILLS[name]
    overrides = Path("runbooks/drills") / f"{name}.yaml"
    # The drill's own params, then the drill overrides file, then the caller's.
    params = {**spec.params,
              **((load_file(overrides) or {}).get("params", {}) if overrides.exists() else {}),
              **(params or {})}
    state_dir.mkdir(parents=True, exist_ok=True)
    targets = state_dir / "targets"
    metrics_port = free_port()
    # 200 player requests/s: enough that an admitted cohort warms its share of the cache within a step.
    cfg = LabConfig(state_dir=state_dir / "lab", inventory_path=targets / "lab.yaml", players_rps=200.0, **(lab or {}))
    cfg = cfg.model_copy(update={"worker_metrics": f"{cfg.spec.gateway}:{metrics_port}"})
    started = time.monotonic()
    console.print("lab: bringing up the platform (network namespaces, Consul, Nomad, Vault, PowerDNS, Prometheus, "
                  "Redis, PostgreSQL)")
    info: dict[str, Any] = {}
    try:
        # Inside the try: a lab that fails half way up is still taken down.
        info = await asyncio.to_thread(lifecycle.up, cfg)
        if on_lab_up is not None:
            on_lab_up(cfg)
        console.print(f"lab up in {info['seconds']} s; inventory {info['inventory']}", highlight=False)
        console.print("backends: " + ", ".join(f"{k} {v}" for k, v in info["backends"].items()), highlight=False)
        # The incident starts now: the lab's baseline snapshot was taken before it.
        params.setdefault("incident_start", datetime.now(UTC).isoformat())
        for fault, options in spec.faults:
            await asyncio.to_thread(lab_faults.inject, cfg, fault, **options)
            console.print(f"injected {fault}", highlight=False)
        inventory = read_inventory(info["inventory"]).as_target()
        os.environ["VAULT_TOKEN"] = await asyncio.to_thread(vault_token, inventory)
        temporal_port, ui_port = free_port(), free_port()
        with start_process(
            dev_server_argv(state_dir / "temporal.db", temporal_port, ui_port=ui_port),
            log=state_dir / "temporal.log", port=temporal_port,
        ):
            runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=cfg.worker_metrics)))
            client = await connect(runtime=runtime, target_host=f"127.0.0.1:{temporal_port}", namespace="default",
                                   ready_within=60)
            run = plan_run(spec.runbook, registry=load_registry(), targets_dir=targets, params=params,
                           initiator=DRILL_STARTER, drill=True)
            if not run.target.get("drill"):
                raise RuntimeError(f"target {run.target_name} is not a drill target")
            queue = f"coldstart-drill-{os.getpid()}"
            ramp_started = time.time()
            async with AsyncExitStack() as stack:
                await stack.enter_async_context(build_worker(client, queue, catalog=Catalog(Path("runbooks"), targets)))
                # The drill starts as its own verified user: four eyes compares verified people.
                starter = _drill_identity(inventory, DRILL_STARTER)
                source = start_source(run, workflow_id_for(run.target_name))
                token = await asyncio.to_thread(starter, source) if starter and source else None
                handle = await start_run(client, run, queue, identity_token=token)
                console.print(f"drill run {handle.id}; Web UI http://127.0.0.1:{ui_port}/namespaces/default/workflows/{handle.id}",
                              highlight=False)
                helpers = [] if interactive else [asyncio.create_task(auto_approve(client, handle.id, console,
                                                                                    _drill_identity(inventory))),
                                                  asyncio.create_task(_abort_when_held(client, handle.id, console))]
                code = await render.follow(client, handle.id, console)
                for task in helpers:
                    task.cancel()
                status = await handle.query("status", result_type=RunStatus)
            timeline = await build_timeline(client, handle.id)
        curve = await _admitted_curve(inventory["telemetry"]["prometheus"], ramp_started, time.time())
    finally:
        if keep:
            record_owner(cfg.path(), None)  # left up on purpose: the next `lab up` on its prefix refuses, not sweeps
        else:
            await asyncio.to_thread(lifecycle.down, cfg)
            console.print("lab down")
    wall = time.monotonic() - started
    markdown = render_markdown(timeline)
    report_path = state_dir / "report.md"
    plot_path = _plot(curve, state_dir / "ramp.png")
    phases = [(s.id, ((s.ended_at or s.started_at) - s.started_at).total_seconds()) for s in status.steps if s.started_at]
    gates = []
    for step in status.steps:
        by_gate: dict[str, list[Any]] = {}
        for reading in step.readings:
            by_gate.setdefault(reading.gate, []).append(reading)
        for gate, readings in by_gate.items():
            values = ", ".join("none" if r.value is None else f"{r.value:g}" for r in readings[-6:])
            gates.append((step.id, gate, len(readings), sum(r.passed for r in readings), values))
    ramp = []
    for _t, target, admitted in curve:
        if not ramp or ramp[-1][0] != int(target):
            ramp.append((int(target), admitted))
        else:
            ramp[-1] = (int(target), admitted)
    verified = code == 0 and any(s.kind == "ramp" and s.percent == 100 for s in status.steps)
    backends = info.get("backends", {})
    report_path.write_text("Backends: " + ", ".join(f"{k} {v}" for k, v in backends.items()) + "\n\n" + markdown)
    card = score(timeline)
    # The drill's Temporal goes with it: its scorecard is kept beside the report, for `coldstart report --file`.
    kept_in = keep_scorecard(card, state_dir / "scorecards.jsonl") if card is not None else None
    return LabDrillReport(
        outcome="succeeded" if verified else status.state,
        wall_seconds=wall,
        run_seconds=((status.ended_at or datetime.now(UTC)) - status.started_at).total_seconds(),
        configured_wait_seconds=_configured_waits(run, {s.id: s for s in status.steps}),
        phases=phases,
        gates=gates,
        ramp=ramp,
        timeline_markdown=markdown,
        report_path=report_path,
        plot_path=plot_path,
        backends=backends,
        scorecard=card,
        scorecard_path=kept_in,
    )


def _configured_waits(run: Any, states: dict[str, Any] | None = None) -> float:
    """The sum of the waits the runbook asks for (waits, bakes, ramp bakes), for the overhead ratio. An
    adaptive ramp's steps are known only once it ran: one bake per percentage it set (its first, and one
    per decision), from the run's state."""
    from workflows.spec import ParallelStep, RampStep

    total = 0.0
    for step in run.runbook.steps:
        if isinstance(step, RampStep):
            state = (states or {}).get(step.id)
            steps = len(step.ramp.schedule())
            if step.ramp.adaptive is not None and state is not None and state.ramp_decisions:
                steps = 1 + sum(d.next != d.at for d in state.ramp_decisions)
            total += step.ramp.bake.total_seconds() * steps
        elif isinstance(step, ParallelStep):
            total += max((_own_wait(s) for s in step.parallel), default=0.0)
        else:
            total += _own_wait(step)
    return total


def _own_wait(step: Any) -> float:
    from workflows.spec import WaitStep

    if isinstance(step, WaitStep):
        return step.wait.total_seconds()
    gate = getattr(step, "gate", None)
    return gate.bake.total_seconds() if gate is not None and gate.bake else 0.0


def print_report(console: Console, report: LabDrillReport) -> None:
    phases = Table("phase (step)", "seconds")
    for step, seconds in report.phases:
        phases.add_row(step, f"{seconds:.1f}")
    console.print(phases)
    gates = Table("step", "gate", "readings", "passed", "last values")
    for row in report.gates:
        gates.add_row(row[0], row[1], str(row[2]), str(row[3]), row[4])
    console.print(gates)
    if report.ramp:
        ramp = Table("target %", "admitted %", "")
        for target, admitted in report.ramp:
            bar = "#" * int((0 if math.isnan(admitted) else admitted) / 2)
            ramp.add_row(str(target), "n/a" if math.isnan(admitted) else f"{admitted:.1f}", bar)
        console.print(ramp)
    console.print("backends: " + ", ".join(f"{k} {v}" for k, v in report.backends.items()), highlight=False)
    if report.scorecard is not None:
        print_scorecard(console, report.scorecard)
        console.print(f"scorecard kept in {report.scorecard_path}; the trend across drills: "
                      f"coldstart report --target {report.scorecard.target} --file {report.scorecard_path} --png trend.png",
                      highlight=False)
    console.print(f"drill {report.outcome} in {report.wall_seconds:.1f} s, the run {report.run_seconds:.1f} s "
                  f"(configured waits {report.configured_wait_seconds:.1f} s); "
                  f"timeline {report.report_path}" + (f"; ramp plot {report.plot_path}" if report.plot_path else ""),
                  highlight=False)

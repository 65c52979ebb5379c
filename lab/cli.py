"""`coldstart lab up|down|status|inject|telemetry|load`: the drill lab's typer sub-app (mounted by cli/main.py)."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

if TYPE_CHECKING:
    from lab.settings import LabConfig


__all__ = ["lab_app"]

lab_app = typer.Typer(help="The drill lab: a Roblox-Oct-2021-shaped platform in network namespaces.",
                      no_args_is_help=True)
_out = Console()

STATE = typer.Option(Path(".state/lab"), "--state-dir", help="where the lab keeps state, logs and keys")
SUBNET = typer.Option("10.213.0.0/24", "--subnet", help="private IPv4 range of the lab bridge")
INVENTORY = typer.Option(Path("targets/lab.yaml"), "--inventory", help="target inventory written by up")


def _cfg(state_dir: Path, subnet: str, inventory: Path, **extra) -> LabConfig:
    from lab.settings import LabConfig  # asyncssh and the host specs stay off `coldstart --help`

    try:
        return LabConfig(state_dir=state_dir, subnet=ipaddress.IPv4Network(subnet), inventory_path=inventory, **extra)
    except ValueError as exc:
        _out.print(f"[red]bad lab settings:[/red] {exc}")
        raise typer.Exit(2) from None


def _running(state_dir: Path, subnet: str, inventory: Path) -> LabConfig:
    # Use what `up` saved: ports and paths given to `up` must not be repeated on every command.
    from lab.lifecycle import saved_config

    return saved_config(state_dir) or _cfg(state_dir, subnet, inventory)


def _ports(spec: str | None) -> dict:
    # --ports consul_http=18500,edge_http=18080
    if not spec:
        return {}
    out = {}
    for item in spec.split(","):
        key, _, value = item.partition("=")
        out[key.strip()] = int(value)
    return {"ports": out}


@lab_app.command()
def up(
    state_dir: Path = STATE, subnet: str = SUBNET, inventory: Path = INVENTORY,
    ports: str | None = typer.Option(None, help="override ports, e.g. consul_http=18500,edge_http=18080"),
    worker_metrics: str | None = typer.Option(None, help="host:port of the coldstart worker's metrics"),
) -> None:
    """Build (or complete) the lab and write the inventory; idempotent."""
    from lab.hosts.shell import LabError
    from lab.lifecycle import up as do_up

    cfg = _cfg(state_dir, subnet, inventory, worker_metrics=worker_metrics, **_ports(ports))
    try:
        info = do_up(cfg, owned=False)  # left up on purpose: only `lab down` takes it down
    except LabError as exc:
        _out.print(f"[red]lab up failed:[/red] {exc}\n(run `coldstart lab down` to clean up)")
        raise typer.Exit(1) from None
    _out.print_json(json.dumps(info))
    if fallback := [name for name, how in info["backends"].items() if how == "stand-in"]:
        _out.print(f"lab: {', '.join(fallback)} on the stand-ins (no {', '.join(fallback)} binary on PATH)",
                   highlight=False)


@lab_app.command()
def down(state_dir: Path = STATE, subnet: str = SUBNET, inventory: Path = INVENTORY) -> None:
    """Remove every process, namespace, rule and file the lab made (logs/ stays)."""
    from lab.lifecycle import down as do_down

    for item in do_down(_running(state_dir, subnet, inventory)):
        _out.print(f"removed {item}", highlight=False)


@lab_app.command()
def status(state_dir: Path = STATE, subnet: str = SUBNET, inventory: Path = INVENTORY) -> None:
    """What runs, where, and what is left over."""
    from lab.lifecycle import status as do_status

    _out.print_json(json.dumps(do_status(_running(state_dir, subnet, inventory))))


@lab_app.command()
def inject(
    name: str = typer.Argument(..., help="consul-contention|consul-streaming|slow-leader|stale-scheduling-data|"
                                          "unhealthy-node-eligible|cold-cache|preempted-host|players-dns-lost|"
                                          "service-down|service-up|snapshot-stale|snapshot-corrupt|tsig-wrong|"
                                          "vault-sealed|prometheus-consul-sd|nomad-node-drained|clear"),
    target: str | None = typer.Option(None, help="server/node/host the fault hits (fault-specific default)"),
    notice_s: float | None = typer.Option(None, help="preempted-host: seconds of notice"),
    state_dir: Path = STATE, subnet: str = SUBNET, inventory: Path = INVENTORY,
) -> None:
    """Inject a fault scenario into the running lab."""
    from lab.faults import FAULTS
    from lab.faults import inject as do_inject

    if name not in FAULTS:
        _out.print(f"[red]unknown fault {name!r}[/red]; known: {', '.join(FAULTS)}")
        raise typer.Exit(2)
    result = do_inject(_running(state_dir, subnet, inventory), name, target=target, notice_s=notice_s)
    _out.print_json(json.dumps(result, default=str))


@lab_app.command()
def telemetry(
    pulumi: bool = typer.Option(False, "--pulumi", help="deploy with a real `pulumi up` of infra/ over SSH "
                                "(engine: `pulumi` on PATH, else ../shared/pulumi)"),
    state_dir: Path = STATE, subnet: str = SUBNET, inventory: Path = INVENTORY,
) -> None:
    """Re-deploy the telemetry host's Prometheus config and rules, then reload Prometheus."""
    from lab.hosts.shell import LabError
    from lab.telemetry_stack import deploy_in_place, deploy_with_pulumi, lab_backends

    cfg = _running(state_dir, subnet, inventory)
    try:
        found = lab_backends(cfg)
        info = deploy_with_pulumi(cfg, found) if pulumi else deploy_in_place(cfg, found)
    except LabError as exc:
        _out.print(f"[red]lab telemetry failed:[/red] {exc}")
        raise typer.Exit(1) from None
    _out.print_json(json.dumps(info))


@lab_app.command()
def load(
    players_rps: float = typer.Option(50.0, min=0.1, max=2000), internal_rps: float = typer.Option(20.0, min=0.1, max=2000),
    duration: float = typer.Option(600.0, min=1, max=86400, help="seconds; generators idle afterwards"),
    clients: int = typer.Option(2000, min=1, max=65536, help="distinct player client subnets"),
    state_dir: Path = STATE, subnet: str = SUBNET, inventory: Path = INVENTORY,
) -> None:
    """(Re)start the player and internal-services load with these bounds."""
    from lab.lifecycle import _env
    from lab.services import restart_load

    _env()
    pids = restart_load(_running(state_dir, subnet, inventory), players_rps=players_rps, internal_rps=internal_rps,
                        duration=duration, clients=clients)
    _out.print_json(json.dumps(pids))

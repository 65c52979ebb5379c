"""Entry point: `python -m lab.standins {consul|nomad} ...` runs one stand-in (Vault has none: it is always real)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NamedTuple

import typer

from .consul import run as _run_consul
from .consul_state import STREAMING_KEY
from .listeners import ListenSpec, parse_listen
from .nomad import parse_node
from .nomad import run as _run_nomad

__all__ = ["app", "main"]

_ADDRESS = "[NETNS:]HOST:PORT"

app = typer.Typer(
    help="Run one API-faithful stand-in (Consul or Nomad) for the drill lab until SIGTERM.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    add_completion=False,
)


class _Server(NamedTuple):
    name: str
    listen: ListenSpec


def _parse_server(text: str) -> _Server:
    name, sep, addr = text.partition("=")
    if not sep:
        raise typer.BadParameter(f"--server wants NAME={_ADDRESS}, got {text!r}")
    return _Server(name, parse_listen(addr))


class _Client(NamedTuple):
    name: str
    listen: ListenSpec
    config_dir: Path


def _parse_client(text: str) -> _Client:
    name, sep, rest = text.partition("=")
    config_dir, at, addr = rest.partition("@")
    if not (sep and at and name and config_dir):
        raise typer.BadParameter(f"--client wants NAME=CONFIG_DIR@{_ADDRESS}, got {text!r}")
    return _Client(name, parse_listen(addr), Path(config_dir))


@app.command()
def consul(
    server: Annotated[list[_Server] | None, typer.Option(
        parser=_parse_server, metavar=f"NAME={_ADDRESS}", help="one per server listener (repeat)")] = None,
    listen: Annotated[list[ListenSpec] | None, typer.Option(
        parser=parse_listen, metavar=_ADDRESS, help="extra listener answering as the first server (repeat)")] = None,
    servers: Annotated[int, typer.Option(help="cluster size when fewer --server are given")] = 3,
    datacenter: str = "dc1",
    acl_token: str | None = None,
    acl_token_file: Path | None = None,
    state_dir: Path | None = None,
    streaming_key: str = STREAMING_KEY,
    seed: int = 0,
    client: Annotated[list[_Client] | None, typer.Option(
        parser=_parse_client, metavar=f"NAME=CONFIG_DIR@{_ADDRESS}",
        help="a client agent: its streaming setting from CONFIG_DIR, reloaded on SIGHUP (repeat)")] = None,
) -> None:
    """Consul HTTP API stand-in: a cluster of servers in one process, one listener per server."""
    if not server and not listen:
        raise typer.BadParameter("give at least one --server or --listen")
    token = acl_token_file.read_text().strip() if acl_token_file else acl_token
    _run_consul(list(server or []), list(listen or []), servers=servers, datacenter=datacenter,
                acl_token=token, state_dir=state_dir, streaming_key=streaming_key, seed=seed,
                clients=[(c.name, c.listen, c.config_dir) for c in client or []])


@app.command()
def nomad(
    listen: Annotated[list[ListenSpec], typer.Option(parser=parse_listen, metavar=_ADDRESS, help="(repeat)")],
    node: Annotated[list[dict] | None, typer.Option(
        parser=parse_node, metavar="NAME[:netns=NS,class=C,key=value]",
        help="client node (repeat); default client1..3")] = None,
    datacenter: str = "dc1",
    region: str = "global",
    state_dir: Path | None = None,
) -> None:
    """Nomad HTTP API stand-in: one server and its client nodes; raw_exec tasks are real processes."""
    _run_nomad(listen, list(node or []), datacenter=datacenter, region=region, state_dir=state_dir)


def main(argv: list[str] | None = None) -> None:
    app(args=argv, prog_name="python -m lab.standins")


if __name__ == "__main__":
    main()

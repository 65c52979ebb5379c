"""`coldstart config` and `--config`: the configuration file (runtime/config.py) applied at the root command,
and every setting's effective value with where it comes from."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import typer

from runtime.config import Config, apply, effective, load

__all__ = ["CONFIG_OPTION", "Loaded", "apply_config", "show_config"]

CONFIG_OPTION = typer.Option(None, "--config", metavar="PATH", help="the configuration file (default: "
                             "$COLDSTART_CONFIG, else /etc/coldstart/coldstart.toml if it exists)")


@dataclass(frozen=True)
class Loaded:
    """The file the root command applied and the environment before it was."""

    config: Config
    environ: dict[str, str]
    unresolved: list[str]


def apply_config(ctx: typer.Context, path: Path | None) -> None:
    """Load the configuration file and fill the variables the environment leaves unset (the root command's
    callback; a bad file is a LocatedErrors, exit 2)."""
    before = dict(os.environ)
    config = load(path)
    ctx.obj = Loaded(config, before, apply(config))
    if ctx.invoked_subcommand != "config":  # which lists them itself
        for line in ctx.obj.unresolved:
            typer.echo(f"warning: {line}", err=True)


def show_config(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Every setting's effective value and its source (environment, file, default); a secret shows only its
    reference. A bad configuration file prints each problem as file:line:col: message (exit 2)."""
    loaded = ctx.find_object(Loaded)
    if loaded is None:  # invoked on its own (not under the root command)
        loaded = Loaded(load(), dict(os.environ), [])
    rows = effective(loaded.config, loaded.environ)
    if as_json:
        typer.echo(json.dumps({
            "file": str(loaded.config.path) if loaded.config.path else None,
            "settings": [{"setting": row.setting.name, "env": row.setting.env, "value": row.value,
                          "source": row.source, "where": row.where or None, "secret": row.setting.secret}
                         for row in rows],
            "unresolved": loaded.unresolved,
        }, indent=2))
        return
    typer.echo(f"# file: {loaded.config.path or '(none)'}")
    width = max(len(row.setting.name) for row in rows)
    value_width = min(40, max(len(row.value) for row in rows))
    for row in rows:
        typer.echo(f"{row.setting.name:<{width}}  {row.value:<{value_width}}  {row.source_text}".rstrip())
    for line in loaded.unresolved:
        typer.echo(f"# unresolved: {line}")

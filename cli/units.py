"""`coldstart install-units`: the worker's, the trigger receiver's and the readiness timer's systemd units."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

__all__ = ["install_units_command"]


def install_units_command(
    directory: Path = typer.Option(Path("/etc/systemd/system"), "--dir", help="where the units go"),
    user: str = typer.Option("coldstart", "--user", help="the system user they run as (create it first)"),
    executable: Path | None = typer.Option(None, "--exec", help="the installed coldstart (default: the one beside "
                                                                "this Python, i.e. this install's)"),
    force: bool = typer.Option(False, "--force", help="replace units edited since they were installed"),
) -> None:
    """Write the systemd units; an unchanged unit is left alone, an edited one is refused (before anything is
    written) unless --force: keep local changes in drop-ins (systemctl edit NAME)."""
    from runtime.units import UnitsRefused, install_units

    exe = executable if executable is not None else Path(sys.executable).parent / "coldstart"
    if not os.access(exe, os.X_OK):
        typer.echo(f"error: {exe} is not an executable coldstart (--exec PATH names it)", err=True)
        raise typer.Exit(2)
    try:
        installed = install_units(directory, exe.absolute(), user, force=force)
    except UnitsRefused as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except OSError as exc:
        typer.echo(f"error: cannot write the units in {directory}: {exc.strerror or exc}", err=True)
        raise typer.Exit(1) from None
    for unit in installed:
        typer.echo(f"{unit.outcome:9} {unit.path}")
    if any(unit.outcome != "unchanged" for unit in installed):
        typer.echo("then: systemctl daemon-reload; systemctl enable --now coldstart-worker coldstart-triggers "
                   "coldstart-readiness@RUNBOOK.timer")

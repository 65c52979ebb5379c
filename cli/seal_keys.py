"""`coldstart seal-keys`: the workers' sealing keys (runtime/sealing.py): which file, which key seals, rotation."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["seal_keys_app"]

seal_keys_app = typer.Typer(no_args_is_help=True, add_completion=False)

_FILE = typer.Option(None, "--file", help="the key file (default: $COLDSTART_SEAL_KEYS, else "
                                          "~/.local/state/coldstart/seal-keys)")


def _path(file: Path | None) -> Path:
    # Imported here: the other commands' start-up never loads Temporal's SDK (tests/test_contracts.py).
    from runtime.sealing import default_keys_path

    return file if file is not None else default_keys_path()


@seal_keys_app.command("show")
def show(file: Path | None = _FILE) -> None:
    """The key file, the key that seals and the ones that still verify (ids only, never a secret)."""
    from runtime.sealing import SealKeys, SealKeysInvalid

    path = _path(file)
    try:
        keys = SealKeys.load(path, create=False)
    except SealKeysInvalid as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    others = [key for key in keys.keys if key != keys.current]
    typer.echo(f"{path}: seals with {keys.current}" + (f"; also verifies {', '.join(others)}" if others else ""))


@seal_keys_app.command("rotate")
def rotate(file: Path | None = _FILE) -> None:
    """Add a new key first: workers seal with it from their next start; the old keys still verify what they
    sealed. Restart every worker, and remove an old line once no run it sealed is still going."""
    from runtime.sealing import SealKeys, SealKeysInvalid

    path = _path(file)
    try:
        if path.exists():
            SealKeys.load(path, create=False)  # never rotate a file the workers could not read
        key_id = SealKeys.rotate(path)
    except (SealKeysInvalid, OSError) as exc:
        typer.echo(f"error: {str(exc).splitlines()[0]}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{path}: new sealing key {key_id}; restart the workers to seal with it")

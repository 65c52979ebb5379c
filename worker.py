"""The coldstart worker's entry point: `python worker.py --help` (the same as `coldstart worker`)."""

from __future__ import annotations

import sys

import typer

from activities.errors import LocatedErrors
from runtime.config import apply, load
from runtime.serve import serve

__all__ = ["main"]


def main() -> None:
    # The configuration file ($COLDSTART_CONFIG, else /etc/coldstart/coldstart.toml) fills the variables the
    # environment leaves unset before the options read them, as at `coldstart`'s root command.
    try:
        problems = apply(load())
    except LocatedErrors as exc:
        problems = exc.errors
    if problems:
        sys.stderr.write("".join(f"{line}\n" for line in problems))
        raise SystemExit(2)
    typer.run(serve)


if __name__ == "__main__":
    main()

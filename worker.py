"""The coldstart worker's entry point: `python worker.py --help` (the same as `coldstart worker`)."""

from __future__ import annotations

import typer

from runtime.serve import serve

__all__ = ["main"]


def main() -> None:
    typer.run(serve)


if __name__ == "__main__":
    main()

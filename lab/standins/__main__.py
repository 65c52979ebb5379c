"""Entry point: `python -m lab.standins {consul|nomad} ...` runs one stand-in (Vault has none: it is always real)."""

from __future__ import annotations

import sys

__all__ = ["main"]

USAGE = "usage: python -m lab.standins {consul|nomad} [options]  (--help per stand-in)"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        raise SystemExit(0 if argv else 2)
    kind, rest = argv[0], argv[1:]
    if kind == "consul":
        from .consul import main as run
    elif kind == "nomad":
        from .nomad import main as run
    else:
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    run(rest)


if __name__ == "__main__":
    main()

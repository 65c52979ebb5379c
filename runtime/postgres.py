"""Debian's PostgreSQL on this machine: where its binaries are, and running them as the postgres user."""

from __future__ import annotations

from pathlib import Path

__all__ = ["PG_BIN", "PG_USER", "as_postgres"]

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_USER = "postgres"


def as_postgres(argv: list[str]) -> list[str]:
    """Run argv as the postgres user (postgres refuses root).

    CAP_DAC_READ_SEARCH is kept as an ambient capability so the server can traverse a
    root-only state dir (0700, it holds keys) down to its own data dir without opening it up.
    """
    return ["setpriv", f"--reuid={PG_USER}", f"--regid={PG_USER}", "--clear-groups",
            "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", *argv]

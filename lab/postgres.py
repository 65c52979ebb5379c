"""The lab's PostgreSQL: initdb into the state dir, run it as the postgres user in the db host, seed players/items."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
from pathlib import Path

from lab.hosts.shell import LabError, sh
from runtime.postgres import PG_BIN, PG_USER, as_postgres

__all__ = ["PG_BIN", "as_postgres", "initdb", "postgres_argv", "seed"]


def initdb(data_dir: Path, subnet: str) -> bool:
    """Create the cluster once; returns False when it already exists (idempotent up)."""
    if (data_dir / "PG_VERSION").exists():
        return False
    if shutil.which(str(PG_BIN / "initdb")) is None:
        raise LabError(f"{PG_BIN}/initdb not found: install postgresql-15")
    pw = pwd.getpwnam(PG_USER)
    shutil.rmtree(data_dir, ignore_errors=True)  # a half-made dir from a crashed up
    data_dir.mkdir(parents=True)
    os.chown(data_dir, pw.pw_uid, pw.pw_gid)
    os.chmod(data_dir, 0o700)
    sh(as_postgres([str(PG_BIN / "initdb"), "-D", str(data_dir), "-U", PG_USER, "-A", "trust",
                    "--no-sync", "-E", "UTF8", "--no-instructions"]), timeout=120)
    # Trust only the lab's own range: the lab subnet is private and reachable only from its hosts.
    (data_dir / "pg_hba.conf").write_text(
        f"local all all trust\nhost all all 127.0.0.0/8 trust\nhost all all {subnet} trust\n"
    )
    return True


def postgres_argv(data_dir: Path, address: str, port: int) -> list[str]:
    return as_postgres([
        str(PG_BIN / "postgres"), "-D", str(data_dir),
        "-c", f"listen_addresses={address}", "-c", f"port={port}",
        "-c", "unix_socket_directories=",  # TCP only: no socket files outside the state dir
        "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
        "-c", "max_connections=100", "-c", "shared_buffers=64MB",
    ])


async def _seed(dsn: str, players: int) -> int:
    import asyncpg

    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS players (id integer PRIMARY KEY, name text NOT NULL, level integer NOT NULL);"
            "CREATE TABLE IF NOT EXISTS items (id serial PRIMARY KEY,"
            " player_id integer NOT NULL REFERENCES players(id), name text NOT NULL, qty integer NOT NULL);"
            "CREATE INDEX IF NOT EXISTS items_player ON items(player_id);"
        )
        have = await conn.fetchval("SELECT count(*) FROM players")
        if have >= players:
            return 0
        rows = [(i, f"player{i}", 1 + i % 60) for i in range(have + 1, players + 1)]
        await conn.copy_records_to_table("players", records=rows, columns=["id", "name", "level"])
        items = [(pid, f"item{k}", 1 + (pid * k) % 9) for pid, _, _ in rows for k in range(3)]
        await conn.copy_records_to_table("items", records=items, columns=["player_id", "name", "qty"])
        await conn.execute("ANALYZE")
        return len(rows)
    finally:
        await conn.close()


def seed(dsn: str, players: int) -> int:
    """Create the tables and players 1..N with three items each; returns how many were added."""
    return asyncio.run(_seed(dsn, players))

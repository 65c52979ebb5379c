"""cache.warm on a real PostgreSQL and real Redis nodes: placement, SET NX, the rate bound, idempotence, bad input."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from temporalio.exceptions import ApplicationError

from activities.cache import warm
from activities.contracts.cache import WarmInput
from runtime.postgres import PG_BIN, PG_USER, as_postgres
from runtime.processes import free_port, start_process
from tests.real import unavailable

PLAYERS = 300
HOT = ("SELECT 'player:' || p.id AS key, p.id::text AS shard, json_build_object('id', p.id, 'name', p.name)::text AS value"
       " FROM players p ORDER BY p.id")


def _missing() -> str | None:
    if shutil.which("redis-server") is None:
        return "redis-server not installed"
    if not (PG_BIN / "initdb").exists():
        return "postgresql-15 not installed"
    if os.geteuid() != 0:
        return "PostgreSQL runs as the postgres user: the test needs root"
    return None


@pytest.fixture(scope="module")
def dsn(tmp_path_factory) -> Iterator[str]:
    if reason := _missing():
        unavailable(reason)
    root = tmp_path_factory.mktemp("pg")
    data = root / "data"
    data.mkdir()
    shutil.chown(root, PG_USER, PG_USER)
    shutil.chown(data, PG_USER, PG_USER)
    subprocess.run(as_postgres([str(PG_BIN / "initdb"), "-D", str(data), "-U", PG_USER, "-A", "trust"]),
                   check=True, capture_output=True)
    port = free_port()
    argv = as_postgres([str(PG_BIN / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(port),
                        "-k", str(root), "-c", "fsync=off"])
    with start_process(argv, log=root / "pg.log", port=port):
        # This server has no TLS: the DSN says so, as an inventory would for such a database.
        url = f"postgresql://{PG_USER}@127.0.0.1:{port}/postgres?sslmode=disable"
        asyncio.run(_seed(url))
        yield url


async def _seed(url: str) -> None:
    import asyncpg

    for _ in range(100):  # the port answers before the server takes connections
        try:
            conn = await asyncpg.connect(url)
            break
        except asyncpg.CannotConnectNowError:
            await asyncio.sleep(0.1)
    else:
        raise RuntimeError("PostgreSQL never took connections")
    try:
        await conn.execute("CREATE TABLE players (id int PRIMARY KEY, name text NOT NULL)")
        await conn.executemany("INSERT INTO players VALUES ($1, $2)", [(i, f"p{i}") for i in range(1, PLAYERS + 1)])
    finally:
        await conn.close()


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[str]]:
    """Two real Redis nodes on loopback, empty."""
    if reason := _missing():
        unavailable(reason)
    ports = [free_port(), free_port()]
    with (start_process(["redis-server", "--port", str(ports[0]), "--bind", "127.0.0.1", "--save", "", "--dir",
                         str(tmp_path)], log=tmp_path / "r0.log", port=ports[0]),
          start_process(["redis-server", "--port", str(ports[1]), "--bind", "127.0.0.1", "--save", "", "--dir",
                         str(tmp_path)], log=tmp_path / "r1.log", port=ports[1])):
        yield [f"127.0.0.1:{p}" for p in ports]


def _client(node: str) -> redis.Redis:
    host, _, port = node.rpartition(":")
    return redis.Redis(host, int(port))


def test_warm_places_keys_as_clients_do_and_leaves_present_ones(dsn: str, nodes: list[str]) -> None:
    # A value the application already wrote is fresher than the database's: it is kept.
    _client(nodes[zlib.crc32(b"7") % 2]).set("player:7", "fresh")
    out = asyncio.run(warm(WarmInput(dsn=dsn, query=HOT, nodes=nodes, rate=100_000, max_keys=200, ttl_seconds=300)))
    assert (out.keys_read, out.written, out.already_present) == (200, 199, 1)
    assert sum(out.per_node.values()) == 199
    for player in range(1, PLAYERS + 1):
        home, other = nodes[zlib.crc32(str(player).encode()) % 2], nodes[1 - zlib.crc32(str(player).encode()) % 2]
        assert _client(other).get(f"player:{player}") is None
        value = _client(home).get(f"player:{player}")
        if player == 7:
            assert value == b"fresh"
        elif player <= 200:
            assert json.loads(value or b"null") == {"id": player, "name": f"p{player}"}
            assert 0 < _client(home).ttl(f"player:{player}") <= 300
        else:
            assert value is None  # past max_keys
    again = asyncio.run(warm(WarmInput(dsn=dsn, query=HOT, nodes=nodes, rate=100_000, max_keys=200)))
    assert (again.written, again.already_present) == (0, 200)


def test_warm_is_bounded_in_rate_and_can_copy_to_every_node(dsn: str, nodes: list[str]) -> None:
    started = time.monotonic()
    out = asyncio.run(warm(WarmInput(dsn=dsn, query=HOT, nodes=nodes, placement="all", rate=200, max_keys=100,
                                     batch=20)))
    took = time.monotonic() - started
    assert out.per_node == {nodes[0]: 100, nodes[1]: 100}
    # 100 rows at 200 keys/s: five batches of 20, each at least 0.1 s.
    assert took >= 0.45
    assert all(_client(n).dbsize() == 100 for n in nodes)


def test_bad_input_is_one_clear_error_and_writes_nothing(dsn: str, nodes: list[str]) -> None:
    with pytest.raises(ValueError, match="SELECT"):
        WarmInput(dsn=dsn, query="DELETE FROM players", nodes=nodes)
    with pytest.raises(ApplicationError, match="`key` and `value`"):
        asyncio.run(warm(WarmInput(dsn=dsn, query="SELECT id FROM players", nodes=nodes)))
    with pytest.raises(ApplicationError, match="hot-key query"):
        asyncio.run(warm(WarmInput(dsn=dsn, query="SELECT key, value FROM nowhere", nodes=nodes)))
    assert all(_client(n).dbsize() == 0 for n in nodes)
    with pytest.raises(ApplicationError, match="read-only"):
        # A query that writes is refused by the read-only transaction, whatever it looks like.
        asyncio.run(warm(WarmInput(dsn=dsn, nodes=nodes, query=(
            "WITH gone AS (DELETE FROM players WHERE id = 1 RETURNING id) SELECT id::text AS key, '' AS value FROM gone"))))


def test_the_tls_mode_is_the_dsn_s_and_verify_full_unless_it_says_otherwise() -> None:
    def mode(dsn: str) -> str:
        return WarmInput(dsn=dsn, query=HOT, nodes=["127.0.0.1:6379"]).sslmode

    assert mode("postgresql://game@10.0.0.9:5432/game") == "verify-full"
    assert mode("postgresql://game@10.0.0.9:5432/game?sslrootcert=/etc/ca.pem") == "verify-full"
    for said in ("verify-full", "verify-ca", "require", "disable"):
        assert mode(f"postgresql://game@db:5432/game?sslmode={said}") == said
    # prefer and allow take plaintext when the server offers no TLS, and check no certificate when it does.
    for said in ("prefer", "allow", "", "verify-full&sslmode=disable"):
        with pytest.raises(ValueError, match="prefer and allow fall back to plaintext"):
            mode(f"postgresql://game@db:5432/game?sslmode={said}")
    with pytest.raises(ValueError, match="postgresql:// URL"):
        mode("host=db sslmode=disable")


def test_a_server_without_tls_is_refused_unless_the_dsn_says_disable(
        dsn: str, nodes: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = dsn.removesuffix("?sslmode=disable")
    # No CA anywhere the worker looks: verify-full cannot check the server, so nothing is attempted.
    monkeypatch.delenv("PGSSLROOTCERT", raising=False)
    monkeypatch.delenv("PGSSLMODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ApplicationError, match=r"sslmode verify-full.*root certificate") as caught:
        asyncio.run(warm(WarmInput(dsn=plain, query=HOT, nodes=nodes)))
    assert caught.value.non_retryable
    # require: TLS or nothing, never the plaintext asyncpg's default (prefer) falls back to; $PGSSLMODE
    # cannot weaken what the DSN says.
    monkeypatch.setenv("PGSSLMODE", "disable")
    with pytest.raises(ApplicationError, match="sslmode require"):
        asyncio.run(warm(WarmInput(dsn=f"{plain}?sslmode=require", query=HOT, nodes=nodes)))
    assert all(_client(n).dbsize() == 0 for n in nodes)

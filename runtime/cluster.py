"""The production topology on one machine: Temporal's real server (four services) on a private PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import yaml
from google.protobuf.duration_pb2 import Duration
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode, TLSConfig
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_fixed

from activities.errors import ColdstartError
from activities.inventory import Inventory
from runtime.cluster_db import ClusterDatabase
from runtime.connection import connect
from runtime.independence import violations
from runtime.processes import kill_pid, pid_alive, process_starttime
from runtime.server_config import dynamic_config_file
from workflows import search

__all__ = ["Cluster", "ClusterError", "FrontendTLS", "NoToolchain", "install", "serve"]

REPO = Path(__file__).resolve().parent.parent
INSTALLER = REPO / "scripts" / "temporal-cluster-install.sh"
SERVICES = ("frontend", "history", "matching", "worker")
PASSWORD_ENV = "COLDSTART_TEMPORAL_DB_PASSWORD"
DB_USER = "temporal"
# Temporal database -> its schema dir under schema/postgresql/v12 (copied into the install cache).
DATABASES = {"temporal": "temporal", "temporal_visibility": "visibility"}
RETENTION = Duration(seconds=7 * 24 * 3600)


class ClusterError(ColdstartError, RuntimeError):
    pass


class NoToolchain(ClusterError):
    """No Go to build the server with (and no build cached)."""


def install() -> Path:
    """The dir holding temporal-server and temporal-sql-tool: built once per machine by the installer."""
    proc = subprocess.run([str(INSTALLER)], stdout=subprocess.PIPE, text=True, check=False)  # progress on our stderr
    if proc.returncode == 3:
        raise NoToolchain("no Go toolchain to build the Temporal server with (go on PATH or /usr/local/go)")
    if proc.returncode != 0 or not proc.stdout.strip():
        raise ClusterError(f"{INSTALLER.name} failed with rc={proc.returncode}")
    return Path(proc.stdout.split()[-1])


@dataclass(frozen=True)
class FrontendTLS:
    """Mutual TLS on the frontend, one CA for both sides. The server's own calls to its frontend (its
    system worker) and this module's (namespace registration) present client_cert."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    server_name: str

    def client(self) -> TLSConfig:
        return TLSConfig(server_root_ca_cert=self.ca.read_bytes(), client_cert=self.client_cert.read_bytes(),
                         client_private_key=self.client_key.read_bytes(), domain=self.server_name)

    def server_config(self) -> dict[str, Any]:
        return {
            "frontend": {"server": {"certFile": str(self.server_cert), "keyFile": str(self.server_key),
                                    "clientCaFiles": [str(self.ca)], "requireClientAuth": True}},
            # With systemWorker set, every in-server client of the frontend uses this cert.
            "systemWorker": {"certFile": str(self.client_cert), "keyFile": str(self.client_key),
                             "client": {"serverName": self.server_name, "rootCaFiles": [str(self.ca)]}},
        }


def _free_ports(count: int) -> list[int]:
    """Distinct free loopback ports below the kernel's ephemeral range: Temporal's PostgreSQL schema
    keeps membership ports in a SMALLINT column, so a port above 32767 fails the server's start."""
    held: list[socket.socket] = []
    try:
        while len(held) < count:
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", random.randrange(20000, 32000)))
            except OSError:  # taken (or already held by us): draw again
                sock.close()
                continue
            held.append(sock)
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class Cluster:
    """`async with Cluster(state_dir) as cluster:` installs the server once per machine, creates or
    reuses the database in state_dir, starts the server, registers the namespace and coldstart's
    search attributes, and stops everything on exit. stop() then start() keeps the database;
    stop_server()/start_server() restart the server alone. start() after a crash cleans up first.

    inventory: the platform the runbooks restore; the server's config is checked against it
    (runtime/independence.py) before the server starts, and a violation refuses to start.
    """

    def __init__(self, state_dir: Path, *, bin_dir: Path | None = None, frontend_port: int | None = None,
                 tls: FrontendTLS | None = None, inventory: Inventory | None = None, namespace: str = "default",
                 log_level: str = "warn"):
        self.state_dir = Path(state_dir).resolve()
        self.tls, self.inventory, self.namespace, self.log_level = tls, inventory, namespace, log_level
        self.db = ClusterDatabase(self.state_dir / "postgres")
        self.config_path = self.state_dir / "temporal-server.yaml"
        self.dynamic_config_path = self.state_dir / "dynamic-config.yaml"
        self.log = self.state_dir / "temporal-server.log"
        self._state_file = self.state_dir / "cluster.json"
        self._frontend_port = frontend_port
        self.bin_dir = bin_dir  # None: install() finds or builds it
        self.ports: dict[str, int] = {}
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.ports['frontend']}"

    @property
    def metrics(self) -> str:
        return f"http://127.0.0.1:{self.ports['metrics']}/metrics"

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        await asyncio.to_thread(self._prepare)
        await self.start_server()

    async def stop(self) -> None:
        """The server (SIGTERM, then SIGKILL after 30 s), then PostgreSQL (fast shutdown)."""
        await asyncio.to_thread(self._down)

    async def start_server(self) -> None:
        await asyncio.to_thread(self._spawn_server)
        await self._register()

    async def stop_server(self, *, crash: bool = False) -> None:
        """SIGTERM (graceful), or with crash=True SIGKILL: nothing flushed, only what PostgreSQL holds."""
        if crash and self._process is not None:
            self._process.kill()
        await asyncio.to_thread(self._stop_server)

    async def client(self, **overrides: Any) -> Client:
        """A client of this cluster's namespace (with the cluster's client cert under TLS)."""
        tls: Any = self.tls.client() if self.tls else False
        return await connect(target_host=self.address, namespace=self.namespace, tls=tls, **overrides)

    # ---- bringing it up ----------------------------------------------------------------------
    def _prepare(self) -> None:
        self.bin_dir = self.bin_dir or install()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o700)  # it holds the DB password
        state = self._load_state()
        self._stop_server(state)  # one left behind by a crashed run
        self.ports = self._choose_ports(state.get("ports") or {})
        text = ("# Written by coldstart (runtime/cluster.py); enable-template: the DB password comes from the"
                f" environment ({PASSWORD_ENV}).\n" + yaml.safe_dump(self._server_config(), sort_keys=False))
        # Checked before anything is created: a refused config leaves no database behind.
        if problems := violations(self.address, text, self.inventory):
            raise ClusterError("the controller would depend on what it restores:\n  " + "\n  ".join(problems))
        self._save_state(ports=self.ports, server=None)
        self.db.create()
        self.db.start(self.ports["postgres"])
        self.db.ensure_role(DB_USER, self._password())
        self._load_schemas()
        self.config_path.write_text(text)
        os.chmod(self.config_path, 0o600)
        self.dynamic_config_path.write_text(yaml.safe_dump(dynamic_config_file()))

    def _choose_ports(self, saved: dict[str, int]) -> dict[str, int]:
        """The saved ports while free (PostgreSQL's also while it runs), so the frontend address stays."""
        names = ["postgres", "metrics", *SERVICES, *(f"{s}_membership" for s in SERVICES)]
        ports = {name: port for name, port in saved.items() if name in names}
        if self._frontend_port:
            ports["frontend"] = self._frontend_port
        keep = {name for name, port in ports.items()
                if _port_free(port) or (name == "postgres" and self.db.running())}
        if self._frontend_port and "frontend" not in keep:
            raise ClusterError(f"port {self._frontend_port} (the frontend's) is in use")
        fresh = iter(_free_ports(len(names)))
        return {name: ports[name] if name in keep else next(p for p in fresh if p not in ports.values())
                for name in names}

    def _password(self) -> str:
        """Generated once, kept in a 0600 file in the state dir: local, never in Vault."""
        path = self.state_dir / "db-password"
        if not path.exists():
            path.touch(mode=0o600)
            path.write_text(secrets.token_hex(24))
        return path.read_text().strip()

    def _load_schemas(self) -> None:
        assert self.bin_dir is not None
        schema_root = self.bin_dir.parent / "schema" / "postgresql" / "v12"
        env = {**os.environ, "SQL_PASSWORD": self._password()}  # not in argv, where ps would show it
        for database, schema in DATABASES.items():
            tool = [str(self.bin_dir / "temporal-sql-tool"), "--plugin", "postgres12", "--ep", "127.0.0.1",
                    "-p", str(self.ports["postgres"]), "-u", DB_USER, "--db", database]
            fresh = not self.db.has_database(database)
            steps = [["create-database"]] if fresh else []
            if fresh or self.db.sql("SELECT to_regclass('schema_version') IS NOT NULL", database) != "t":
                steps.append(["setup-schema", "-v", "0.0"])
            # Idempotent: applies only the versions the database lacks (also after a server upgrade).
            steps.append(["update-schema", "-d", str(schema_root / schema / "versioned")])
            for step in steps:
                proc = subprocess.run([*tool, *step], env=env, capture_output=True, text=True, timeout=120, check=False)
                if proc.returncode != 0:
                    raise ClusterError(f"temporal-sql-tool {step[0]} on {database}: {proc.stderr.strip()[-2000:]}")

    def _server_config(self) -> dict[str, Any]:
        p = self.ports
        # A Go template rendered by the server at load time: the password never lands in this file.
        password = '{{ env "' + PASSWORD_ENV + '" }}'

        def store(database: str, conns: int) -> dict[str, Any]:
            return {"sql": {"pluginName": "postgres12", "databaseName": database,
                            "connectAddr": f"127.0.0.1:{p['postgres']}", "connectProtocol": "tcp",
                            "user": DB_USER, "password": password,
                            "maxConns": conns, "maxIdleConns": conns, "maxConnLifetime": "1h"}}

        config: dict[str, Any] = {
            "log": {"stdout": True, "level": self.log_level},
            "persistence": {
                "defaultStore": "default", "visibilityStore": "visibility",
                # Fixed for the life of the database; 4 suits one machine.
                "numHistoryShards": 4,
                "datastores": {"default": store("temporal", 20), "visibility": store("temporal_visibility", 10)},
            },
            "global": {
                "membership": {"maxJoinDuration": "30s", "broadcastAddress": "127.0.0.1"},
                "metrics": {"prometheus": {"framework": "tally", "timerType": "histogram",
                                           "listenAddress": f"127.0.0.1:{p['metrics']}"}},
            },
            "services": {name: {"rpc": {"grpcPort": p[name], "membershipPort": p[f"{name}_membership"],
                                        "bindOnLocalHost": True}} for name in SERVICES},
            "clusterMetadata": {
                "enableGlobalNamespace": False, "failoverVersionIncrement": 10,
                "masterClusterName": "active", "currentClusterName": "active",
                "clusterInformation": {"active": {"enabled": True, "initialFailoverVersion": 1,
                                                  "rpcName": "frontend", "rpcAddress": self.address}},
            },
            "dcRedirectionPolicy": {"policy": "noop"},
            "dynamicConfigClient": {"filepath": str(self.dynamic_config_path), "pollInterval": "60s"},
        }
        if self.tls:
            config["global"]["tls"] = self.tls.server_config()
        return config

    def _spawn_server(self) -> None:
        assert self.bin_dir is not None
        if self._process is not None and self._process.poll() is None:
            return
        argv = [str(self.bin_dir / "temporal-server"), "--config-file", str(self.config_path),
                # Authentication is mTLS when configured; coldstart's approvals are checked in the workflow.
                "--allow-no-auth", "start"]
        with self.log.open("ab") as out:
            self._process = subprocess.Popen(argv, cwd=self.state_dir, env={**os.environ, PASSWORD_ENV: self._password()},
                                             stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True)
        self._save_state(server={"pid": self._process.pid, "starttime": process_starttime(self._process.pid)})

    async def _register(self) -> None:
        """Wait for the frontend, then register the namespace and the search attributes (idempotent)."""
        deadline = time.monotonic() + 90
        client: Client | None = None
        while client is None:
            if self._process is not None and self._process.poll() is not None:
                raise ClusterError(f"temporal-server exited with {self._process.returncode}; see {self.log}")
            try:
                client = await self.client()
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"the frontend at {self.address} not healthy within 90 s; see {self.log}") from None
                await asyncio.sleep(0.3)
        # The frontend learns a new namespace and attributes from caches refreshed every few seconds, and
        # answers before its database pool has reconnected after a PostgreSQL restart ("no usable database
        # connection found"): retry until a visibility query on our attributes is accepted, as a run's
        # start will need.
        retrying = AsyncRetrying(retry=retry_if_exception_type(RPCError), stop=stop_after_delay(60),
                                 wait=wait_fixed(0.5), reraise=True)
        await retrying(self._register_namespace, client)
        await retrying(self._add_search_attributes, client)
        await retrying(client.count_workflows, f"{search.TARGET.name} = 'probe'")

    async def _register_namespace(self, client: Client) -> None:
        try:
            await client.workflow_service.register_namespace(RegisterNamespaceRequest(
                namespace=self.namespace, workflow_execution_retention_period=RETENTION))
        except RPCError as exc:
            if exc.status != RPCStatusCode.ALREADY_EXISTS:
                raise

    async def _add_search_attributes(self, client: Client) -> None:
        have = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=self.namespace))
        missing = {key.name: IndexedValueType.ValueType(key.indexed_value_type) for key in search.ALL
                   if key.name not in have.custom_attributes}
        if missing:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=self.namespace, search_attributes=missing))

    # ---- taking it down ----------------------------------------------------------------------
    def _stop_server(self, state: dict[str, Any] | None = None) -> None:
        server = (state if state is not None else self._load_state()).get("server")
        if server and pid_alive(server["pid"], server.get("starttime")):
            kill_pid(server["pid"], server.get("starttime"), grace=30)
        if self._process is not None:
            self._process.wait()
            self._process = None
        if self._state_file.exists():
            self._save_state(server=None)

    def _down(self) -> None:
        self._stop_server()
        self.db.stop()

    def _load_state(self) -> dict[str, Any]:
        try:
            return json.loads(self._state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _save_state(self, **changes: Any) -> None:
        state = {**self._load_state(), **changes}
        self._state_file.write_text(json.dumps(state, indent=2) + "\n")


def serve(state_dir: Path, *, frontend_port: int, inventory: Inventory | None, say: Callable[[str], None]) -> None:
    """`coldstart server --postgres`: bring the cluster up, run until SIGINT or SIGTERM, take it down."""

    async def run() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        async with Cluster(state_dir, frontend_port=frontend_port, inventory=inventory) as cluster:
            say(f"Temporal on PostgreSQL at {cluster.address} (namespace {cluster.namespace}); Ctrl-C stops it\n"
                f"  metrics {cluster.metrics}\n  state   {cluster.state_dir}\n  log     {cluster.log}")
            await stop.wait()
            say("stopping the server, then PostgreSQL")

    asyncio.run(run())

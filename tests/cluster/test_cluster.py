"""The real server on PostgreSQL: two workers with one killed, a crashed server, and nothing it restores in its way."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest
import yaml
from temporalio.api.enums.v1 import EventType

from activities.inventory import Endpoints, Host, Inventory, Telemetry
from lab.hashistack.binaries import Backends
from lab.inventory import write_inventory
from lab.lifecycle import build_inventory
from lab.services import Secrets
from lab.settings import LabConfig
from runtime.cluster import Cluster, ClusterError
from runtime.independence import violations
from runtime.processes import pid_alive
from runtime.server_config import DYNAMIC_CONFIG, dynamic_config_file, dynamic_config_flags
from tests import support
from workflows.loader import read_inventory


@pytest.fixture(scope="module")
async def cluster(tmp_path_factory, cluster_bin):
    async with Cluster(tmp_path_factory.mktemp("cluster"), bin_dir=cluster_bin) as running:
        yield running


def _runbook(tmp_path: Path, out: Path, wait: str) -> Path:
    """a, b, a durable timer, c, d: each action appends a line per execution."""
    steps = [f"""
          - id: {label}
            action: test.append
            with: {{path: "{out}", label: {label}}}""" for label in "abcd"]
    steps.insert(2, f"""
          - id: settle
            wait: {wait}""")
    return support.write_runbook(tmp_path, "\n        metadata: {name: on-cluster}\n        target: t\n"
                                           "        steps:" + "".join(steps) + "\n")


def _labels(out: Path) -> list[str]:
    return [line.split()[-1] for line in support.lines(out)]


async def _running(handle, step: str) -> bool:
    status = await support.status(handle)
    return any(s.id == step and s.status == "running" for s in status.steps)  # none before resolution


async def _workflow_task_workers(handle) -> list[int]:
    """The PIDs of the workers that ran the run's workflow tasks, in order (identity is pid@host)."""
    history = await handle.fetch_history()
    return [int(e.workflow_task_started_event_attributes.identity.split("@")[0]) for e in history.events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED]


def _kill(process) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


async def test_two_workers_one_killed_mid_run_the_other_finishes_no_step_twice(cluster, task_queue, tmp_path):
    out = tmp_path / "executions.txt"
    book = _runbook(tmp_path, out, "3s")
    client = await cluster.client()
    workers = {}
    try:
        for _ in range(2):
            process = support.spawn_worker(cluster.address, task_queue)
            workers[process.pid] = process
        handle = await support.start(client, book, task_queue)
        await support.wait_for(lambda: _running(handle, "settle"))
        # The worker holding the run (its workflow cached there) dies with the timer pending.
        holder = (await _workflow_task_workers(handle))[-1]
        _kill(workers[holder])
        assert _labels(out) == ["a", "b"]
        await asyncio.wait_for(handle.result(), timeout=90)
        after = await _workflow_task_workers(handle)
    finally:
        for process in workers.values():
            _kill(process)
    assert _labels(out) == ["a", "b", "c", "d"]
    survivor = next(pid for pid in workers if pid != holder)
    assert after[-1] == survivor, "the surviving worker should have finished the run"


async def test_server_crashed_mid_run_the_run_continues_from_postgres(cluster, task_queue, tmp_path):
    out = tmp_path / "executions.txt"
    book = _runbook(tmp_path, out, "2s")
    client = await cluster.client()
    worker = support.spawn_worker(cluster.address, task_queue)
    try:
        handle = await support.start(client, book, task_queue)
        await support.wait_for(lambda: _running(handle, "settle"))
        old_pid = cluster._process.pid
        await cluster.stop_server(crash=True)  # SIGKILL: the server keeps nothing but what PostgreSQL has
        assert _labels(out) == ["a", "b"]
        await asyncio.sleep(2)  # the timer comes due while no server runs
        await cluster.start_server()
        assert cluster._process.pid != old_pid
        await asyncio.wait_for(handle.result(), timeout=90)
        status = await support.status(handle)  # a query: answered by the worker, from the replayed history
    finally:
        _kill(worker)
    assert _labels(out) == ["a", "b", "c", "d"]
    assert [s.status for s in status.steps] == ["succeeded"] * 5


def _platform(**changes) -> Inventory:
    """A platform like the lab's: Consul servers, Nomad and Vault on their hosts, Prometheus apart."""
    fields = {
        "name": "prod", "telemetry": Telemetry(prometheus="http://10.0.9.10:9090"),
        "endpoints": Endpoints(consul=["http://10.0.1.11:8500", "http://10.0.1.12:8500", "http://10.0.1.13:8500"],
                            nomad=["http://10.0.2.10:4646"], vault=["https://vault.internal:8200"]),
        "hosts": {f"consul{i}": Host(address=f"10.0.1.1{i}", roles=["consul-server"]) for i in (1, 2, 3)},
    }
    return Inventory(**{**fields, **changes})


def _lab_inventory(tmp_path: Path) -> Inventory:
    """targets/lab.yaml as `coldstart lab up` writes it (generated here without a lab), read back as a run would."""
    cfg = LabConfig(state_dir=str(tmp_path / "lab"))
    written = write_inventory(build_inventory(cfg, Secrets(cfg), Backends(None, None, None)), tmp_path / "lab.yaml")
    return read_inventory(written)


async def test_the_cluster_does_not_depend_on_what_it_restores(cluster, tmp_path):
    config = cluster.config_path.read_text()
    lab = _lab_inventory(tmp_path)
    assert lab.consul and lab.vault, "the check needs the inventory's Consul and Vault to compare with"
    assert violations(cluster.address, config, lab) == []
    assert violations(cluster.address, config, _platform()) == []
    # The password is rendered from the environment by the server; the file holds no secret.
    password = (cluster.state_dir / "db-password").read_text().strip()
    assert password not in config
    assert '{{ env "COLDSTART_TEMPORAL_DB_PASSWORD" }}' in config


async def test_the_cluster_runs_the_same_dynamic_config_as_the_dev_server(cluster):
    # Fairness for the gate readings, and history's task loading at 200 a second, not 20 (runtime/server_config.py).
    assert yaml.safe_load(cluster.dynamic_config_path.read_text()) == dynamic_config_file()
    assert str(cluster.dynamic_config_path) in cluster.config_path.read_text()
    flags = dict(pair.split("=", 1) for pair in dynamic_config_flags()[1::2])
    assert {key: json.loads(value) for key, value in flags.items()} == DYNAMIC_CONFIG
    assert DYNAMIC_CONFIG["history.transferProcessorMaxPollRPS"] > 20


def test_consul_names_vault_and_restored_hosts_are_refused():
    good = yaml.safe_dump({
        "persistence": {"datastores": {"default": {"sql": {"connectAddr": "db1.internal:5432", "password": "x"}}}},
        "clusterMetadata": {"clusterInformation": {"active": {"rpcAddress": "10.0.5.5:7233"}}},
    })
    assert violations("10.0.5.5:7233", good, _platform()) == []

    on_consul_dns = good.replace("db1.internal", "postgres.service.dc1.consul")
    assert [p for p in violations("10.0.5.5:7233", on_consul_dns) if "Consul DNS name" in p
            and "persistence.datastores.default.sql.connectAddr" in p]
    assert [p for p in violations("temporal.service.consul:7233", good) if p.startswith("Temporal frontend")]
    assert [p for p in violations("10.0.1.12:7233", good, _platform()) if "on consul" in p]
    from_vault = good.replace("password: x", 'password: \'{{ env "VAULT_TOKEN" }}\'')
    assert [p for p in violations("10.0.5.5:7233", from_vault) if "refers to Vault" in p]
    telemetry_on_consul = _platform(telemetry=Telemetry(prometheus="http://prometheus.service.consul:9090"))
    assert [p for p in violations("10.0.5.5:7233", good, telemetry_on_consul) if "telemetry.prometheus" in p]


async def test_a_cluster_whose_config_depends_on_consul_refuses_to_start(tmp_path, cluster_bin):
    # The inventory says the frontend's own address is a Consul server: start() stops before the server runs.
    restored_here = _platform(hosts={"consul1": Host(address="127.0.0.1", roles=["consul-server"])})
    refused = Cluster(tmp_path / "refused", bin_dir=cluster_bin, inventory=restored_here)
    with pytest.raises(ClusterError, match="depend on what it restores"):
        async with refused:
            pass
    assert not refused.db.root.exists() and not refused.log.exists()


async def test_after_a_crashed_controller_down_and_up_again_keep_the_database(tmp_path_factory, cluster_bin, task_queue):
    # A short directory: PostgreSQL's socket path must fit in 107 bytes, test worker directories included.
    tmp_path = tmp_path_factory.mktemp("crash")
    crashed = Cluster(tmp_path / "state", bin_dir=cluster_bin)
    await crashed.start()
    client = await crashed.client()
    book = support.write_runbook(tmp_path, "metadata: {name: kept}\ntarget: t\nsteps:\n  - id: w\n    wait: 1h\n")
    handle = await support.start(client, book, task_queue)
    server_pid, address = crashed._process.pid, crashed.address
    # The controller dies without stopping anything; a new one on the same state dir takes it all down.
    await Cluster(tmp_path / "state", bin_dir=cluster_bin).stop()
    assert not pid_alive(server_pid)
    assert not crashed.db.running()
    again = Cluster(tmp_path / "state", bin_dir=cluster_bin)
    async with again:
        assert again.address == address
        description = await (await again.client()).get_workflow_handle(handle.id).describe()
        assert description.run_id == handle.result_run_id

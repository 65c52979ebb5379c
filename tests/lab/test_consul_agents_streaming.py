"""consul.agents.streaming on the lab's real Consul agents: off through each agent's own config, read back, undone."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from temporalio.exceptions import ApplicationError

from activities.consul.agent_hosts import ConsulAgentHost
from activities.consul.agents import agents_streaming, agents_streaming_restore, agents_streaming_status
from activities.contracts.consul_agents import (
    AgentsStreamingInput,
    AgentsStreamingRestoreInput,
    AgentsStreamingStatusInput,
)
from activities.executors import executor_for
from lab.services import Secrets
from workflows.loader import read_inventory

pytestmark = pytest.mark.timeout(600)  # the first test also brings the lab up


@pytest.fixture(scope="module")
def setup(lab, tmp_path_factory):
    cfg, _ = lab
    inv = read_inventory(cfg.inventory_path)
    # The worker logs in with AppRole; the test reads the same secret with a token file.
    token_file = tmp_path_factory.mktemp("vault") / "token"
    token_file.write_text(Secrets(cfg).read("vault-root-token"))
    assert inv.consul is not None and inv.consul.token is not None
    target = inv.consul.model_copy(update={"token": inv.consul.token.model_copy(update={"token_file": str(token_file)})})
    return cfg, inv, target


def reported(cfg, agent: ConsulAgentHost) -> dict[str, Any]:
    """The agent's effective setting as its own API reports it (read here, not by the action)."""
    r = httpx.get(f"{agent.http}/v1/agent/self", headers={"X-Consul-Token": Secrets(cfg).read("consul-token")},
                  timeout=5)
    debug = r.raise_for_status().json()["DebugConfig"]
    return {"use_streaming_backend": debug["UseStreamingBackend"],
            "enable_streaming": debug["RPCConfig"]["EnableStreaming"]}


def drop_in(agent: ConsulAgentHost, name: str = "coldstart-streaming.json") -> str | None:
    async def read() -> str | None:
        async with executor_for(agent) as ex:
            rc, out, _ = await ex.run(["cat", f"{agent.config_dir}/{name}"])
            return out if rc == 0 else None
    return asyncio.run(read())


def change(target, agents, **kw):
    return asyncio.run(agents_streaming(AgentsStreamingInput(consul=target, agents=agents, **kw)))


def undo(inp: AgentsStreamingRestoreInput):
    return asyncio.run(agents_streaming_restore(inp))


def status(target, agents, **kw):
    return asyncio.run(agents_streaming_status(AgentsStreamingStatusInput(consul=target, agents=agents, **kw)))


def test_streaming_off_on_every_client_agent_then_undo(setup):
    cfg, inv, target = setup
    agents = inv.consul_agents
    clients = [a for a in agents if a.role == "client"]
    servers = [a for a in agents if a.role == "server"]
    assert len(clients) >= 2 and len(servers) == 3
    assert all(reported(cfg, a)["use_streaming_backend"] for a in agents)  # the lab runs with streaming on

    out = change(target, agents, enabled=False, wave_size=1)
    assert out.changed_agents == [a.name for a in clients]
    assert out.skipped_agents == [a.name for a in servers]
    assert all(c.file_written and c.restarted and not c.after.use_streaming_backend for c in out.agents)
    for a in clients:
        assert reported(cfg, a)["use_streaming_backend"] is False, a.name
        assert drop_in(a) is not None and '"use_streaming_backend": false' in (drop_in(a) or "")
    for a in servers:
        assert reported(cfg, a) == {"use_streaming_backend": True, "enable_streaming": True}
        assert drop_in(a) is None

    seen = status(target, agents, expect=False)
    assert seen.streaming_off == [a.name for a in clients] and seen.streaming_on == []
    assert status(target, agents, roles=["server"]).streaming_on == [a.name for a in servers]
    with pytest.raises(ApplicationError) as mismatch:
        status(target, agents, expect=True)
    assert mismatch.value.type == "Mismatch" and all(a.name in str(mismatch.value) for a in clients)

    again = change(target, agents, enabled=False, wave_size=1)
    assert again.changed_agents == [] and not any(c.restarted or c.file_written for c in again.agents)
    assert again.undo.agents == []

    back = undo(out.undo)
    assert sorted(back.changed_agents) == sorted(a.name for a in clients)
    for a in clients:
        assert reported(cfg, a)["use_streaming_backend"] is True, a.name
        assert drop_in(a) is None  # there was no drop-in before
    assert undo(out.undo).changed_agents == []  # the undo, run again, finds nothing to do
    assert status(target, agents, expect=True).streaming_on == [a.name for a in clients]


def test_servers_one_at_a_time_and_back(setup):
    cfg, inv, target = setup
    servers = [a for a in inv.consul_agents if a.role == "server"]
    out = change(target, servers, enabled=False, roles=["server"])
    assert out.changed_agents == [a.name for a in servers]
    for a in servers:
        assert reported(cfg, a) == {"use_streaming_backend": False, "enable_streaming": False}, a.name
    leader = httpx.get(f"{servers[0].http}/v1/status/leader", timeout=5).json()
    assert leader  # the cluster kept (or re-elected) a leader through the restarts
    assert [r.agent.name for r in out.undo.agents] == [a.name for a in reversed(servers)]
    undo(out.undo)
    for a in servers:
        assert reported(cfg, a) == {"use_streaming_backend": True, "enable_streaming": True}, a.name


def test_partial_failure_names_who_changed_and_its_undo_restores_them(setup):
    cfg, inv, target = setup
    clients = [a for a in inv.consul_agents if a.role == "client"]
    first, second = clients[0], clients[1]
    broken = second.model_copy(update={"restart": ["false"]})
    with pytest.raises(ApplicationError) as err:
        change(target, [first, broken], enabled=False, wave_size=1)
    e = err.value
    assert e.type == "PartialFailure" and not e.non_retryable
    assert f"changed: {first.name};" in str(e) and f"failed on {second.name};" in str(e)
    details = e.details[0]
    assert details["changed_agents"] == [first.name] and list(details["failed_agents"]) == [second.name]
    assert reported(cfg, first)["use_streaming_backend"] is False
    assert reported(cfg, second)["use_streaming_backend"] is True  # its restart failed: still on
    # The records of both (the second's drop-in was written before its restart failed) undo exactly.
    restores = details["restores"]
    assert sorted(r["agent"]["name"] for r in restores) == sorted([first.name, second.name])
    undo(AgentsStreamingRestoreInput(consul=target, agents=restores))
    for a in (first, second):
        assert reported(cfg, a)["use_streaming_backend"] is True and drop_in(a) is None


def test_undo_refuses_a_drop_in_rewritten_since_and_changes_nothing(setup):
    cfg, inv, target = setup
    client = next(a for a in inv.consul_agents if a.role == "client")
    out = change(target, [client], enabled=False)

    async def rewrite() -> None:
        async with executor_for(client) as ex:
            await ex.run(["tee", f"{client.config_dir}/coldstart-streaming.json"], input='{"log_level": "INFO"}\n')
    asyncio.run(rewrite())
    with pytest.raises(ApplicationError) as err:
        undo(out.undo)
    assert err.value.type == "Conflict" and err.value.non_retryable and client.name in str(err.value)
    assert reported(cfg, client)["use_streaming_backend"] is False
    assert drop_in(client) == '{"log_level": "INFO"}\n'

    async def remove() -> None:
        async with executor_for(client) as ex:
            await ex.run(["rm", "-f", f"{client.config_dir}/coldstart-streaming.json"])
    asyncio.run(remove())
    on = change(target, [client], enabled=True)
    assert on.changed_agents == [client.name] and reported(cfg, client)["use_streaming_backend"] is True


def served_streams(cfg, servers: list[ConsulAgentHost]) -> int:
    """The streams the servers serve to agents (consul.grpc.server.streams of their internal gRPC server)."""
    headers = {"X-Consul-Token": Secrets(cfg).read("consul-token")}
    total = 0.0
    for a in servers:
        text = httpx.get(f"{a.http}/v1/agent/metrics", params={"format": "prometheus"}, headers=headers, timeout=5).text
        total += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith('consul_grpc_server_streams{server_type="internal"}'))
    return int(total)


def test_streaming_fault_streams_until_the_agents_turn_streaming_off(setup):
    from lab.faults import inject

    cfg, inv, target = setup
    clients = [a for a in inv.consul_agents if a.role == "client"]
    servers = [a for a in inv.consul_agents if a.role == "server"]
    shape = inject(cfg, "consul-streaming")
    try:
        # Every watcher is its own view: one stream each, from each client agent.
        deadline = time.monotonic() + 60
        while (streams := served_streams(cfg, servers)) < shape["watchers"] * len(clients) * 0.9:
            assert time.monotonic() < deadline, f"only {streams} streams"
            time.sleep(1)
        out = change(target, clients, enabled=False)
        assert out.changed_agents == [a.name for a in clients]
        deadline = time.monotonic() + 60  # the servers close the last streams as their watchers time out
        while (streams := served_streams(cfg, servers)) > 0:
            assert time.monotonic() < deadline, f"{streams} streams left with streaming off"
            time.sleep(1)
        undo(out.undo)
        assert status(target, clients, expect=True).streaming_on == [a.name for a in clients]
    finally:
        cleared = inject(cfg, "clear")
    assert cleared["streaming_watchers"] == [a.name for a in clients]

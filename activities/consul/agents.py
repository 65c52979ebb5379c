"""Streaming on or off in the Consul agents' own configuration: a drop-in per agent, restarted in waves, read back."""

from __future__ import annotations

import asyncio
import posixpath
import time
from collections.abc import Awaitable, Callable
from typing import Any

import consul
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities._clients import CLIENT_ERRORS, ConsulTarget, consul_client, consul_get, resume_details, secret_of
from activities.binding import implements
from activities.consul.agent_hosts import ConsulAgentHost, Role, StreamingReport, drop_in, wanted
from activities.contracts.consul_agents import (
    AGENTS_STREAMING,
    AGENTS_STREAMING_RESTORE,
    AGENTS_STREAMING_STATUS,
    AgentChange,
    AgentRestore,
    AgentsStreamingInput,
    AgentsStreamingOutput,
    AgentsStreamingRestoreInput,
    AgentsStreamingRestoreOutput,
    AgentsStreamingStatusInput,
    AgentsStreamingStatusOutput,
    AgentStatus,
)
from activities.errors import Unavailable
from activities.executors import Executor, ExecutorError, executor_for
from activities.retry import format_duration

__all__ = ["agents_streaming", "agents_streaming_restore", "agents_streaming_status"]


class AgentFailure(Unavailable):
    """One agent could not be changed or verified; `retryable` says whether running again could help."""

    def __init__(self, agent: str, message: str, *, retryable: bool = True) -> None:
        super().__init__(f"{agent}: {message}")
        self.agent = agent
        self.retryable = retryable


# --------------------------------------------------------------------------- one agent


class _Agent:
    """One agent reached two ways: its host's shell (files, restart) and its own API (the effective setting)."""

    def __init__(self, spec: ConsulAgentHost, ex: Executor, client: consul.Consul, file: str) -> None:
        self.spec = spec
        self.ex = ex
        self.client = client
        self.path = posixpath.join(spec.config_dir, file)

    @property
    def name(self) -> str:
        return self.spec.name

    async def _run(self, argv: list[str], what: str, *, input: str | None = None, timeout: float = 30.0) -> str:
        rc, out, err = await self.ex.run(argv, input=input, timeout=timeout)
        if rc != 0:
            raise AgentFailure(self.name, f"{what} failed (rc={rc}): {(err or out).strip()[:300]}")
        return out

    async def read_file(self) -> str | None:
        rc, _, _ = await self.ex.run(["test", "-d", self.spec.config_dir])
        if rc != 0:
            raise AgentFailure(self.name, f"config directory {self.spec.config_dir} does not exist on the host",
                               retryable=False)
        rc, _, _ = await self.ex.run(["test", "-e", self.path])
        if rc != 0:
            return None
        return await self._run(["cat", "--", self.path], f"reading {self.path}")

    async def put_file(self, content: str | None) -> None:
        if content is None:
            await self._run(["rm", "-f", "--", self.path], f"removing {self.path}")
            return
        # Write beside, then rename: a restart never reads half a file. The agent ignores the .tmp name.
        tmp = self.path + ".coldstart.tmp"
        await self._run(["tee", "--", tmp], f"writing {tmp}", input=content)
        await self._run(["mv", "-f", "--", tmp, self.path], f"renaming {tmp}")

    async def report(self) -> StreamingReport:
        return await _report(self.spec, self.client)

    async def restart(self, timeout: float) -> None:
        await self._run(self.spec.restart, "restart", timeout=timeout)

    async def wait_for(self, want: StreamingReport, timeout: float) -> StreamingReport:
        """Until the restarted agent answers with `want` and knows a leader (it rejoined the cluster)."""
        deadline = time.monotonic() + timeout
        last: object = "no answer"
        while time.monotonic() < deadline:
            try:
                got = await self.report()
                leader = await asyncio.to_thread(self.client.status.leader)
                if got == want and leader:
                    return got
                last = f"reports {got.model_dump(exclude_none=True)}, leader {leader or 'none'}"
            except AgentFailure as exc:
                if not exc.retryable:
                    raise
                last = str(exc)
            except CLIENT_ERRORS as exc:
                last = repr(exc)
            _beat(self.name)
            await asyncio.sleep(0.5)
        raise AgentFailure(self.name, f"not back with {want.model_dump(exclude_none=True)} after "
                                      f"{format_duration(timeout)} ({last})")


async def _report(spec: ConsulAgentHost, client: consul.Consul) -> StreamingReport:
    """The agent's effective setting from its own /v1/agent/self (DebugConfig), never from a file."""
    try:
        self_info = await asyncio.to_thread(consul_get, client, "/v1/agent/self")
    except CLIENT_ERRORS as exc:
        raise AgentFailure(spec.name, f"{spec.http}/v1/agent/self: {exc}") from None
    debug = self_info.get("DebugConfig") or {}
    if "UseStreamingBackend" not in debug:
        raise AgentFailure(spec.name, "its /v1/agent/self reports no UseStreamingBackend (Consul before 1.10?)",
                           retryable=False)
    rpc = debug.get("RPCConfig") or {}
    server = bool((self_info.get("Config") or {}).get("Server"))
    if server != (spec.role == "server"):
        raise AgentFailure(spec.name, f"the inventory says {spec.role} but the agent says "
                                      f"{'server' if server else 'client'}", retryable=False)
    return StreamingReport(use_streaming_backend=bool(debug["UseStreamingBackend"]),
                           enable_streaming=bool(rpc.get("EnableStreaming")) if server else None)


def _beat(*details: Any) -> None:
    if activity.in_activity():
        activity.heartbeat(*details)


# --------------------------------------------------------------------------- waves


def _waves(items: list[Any], role_of: Callable[[Any], Role], size: int) -> list[list[Any]]:
    """Servers one per wave (a quorum survives), clients `size` at a time, in the given order."""
    waves: list[list[Any]] = []
    clients: list[Any] = []
    for item in items:
        if role_of(item) == "server":
            if clients:
                waves.append(clients)
                clients = []
            waves.append([item])
            continue
        clients.append(item)
        if len(clients) == size:
            waves.append(clients)
            clients = []
    if clients:
        waves.append(clients)
    return waves


async def _in_waves(name: str, consul_target: ConsulTarget, waves: list[list[Any]],
                    spec_of: Callable[[Any], ConsulAgentHost], file_of: Callable[[Any], str],
                    per_agent: Callable[[_Agent, Any], Awaitable[AgentChange]],
                    partial: Callable[[], dict[str, Any]]) -> list[AgentChange]:
    """Run per_agent wave by wave; a failed wave stops the rest, and the error says exactly who changed."""
    token = await asyncio.to_thread(secret_of, consul_target.token)
    results: dict[str, AgentChange] = {}
    failures: dict[str, AgentFailure | ExecutorError] = {}

    async def one(item: Any) -> None:
        spec = spec_of(item)
        try:
            client = consul_client(consul_target, address=spec.http, token=token)
            async with executor_for(spec) as ex:
                results[spec.name] = await per_agent(_Agent(spec, ex, client, file_of(item)), item)
        except (AgentFailure, ExecutorError) as exc:
            failures[spec.name] = exc
        except Exception as exc:  # noqa: BLE001 - one agent's surprise must not hide what the others did
            failures[spec.name] = AgentFailure(spec.name, f"unexpected error: {exc!r}")
        _beat(partial())

    done_waves = 0
    for wave in waves:
        await asyncio.gather(*(one(item) for item in wave))
        done_waves += 1
        if failures:
            break
    if not failures:
        return [results[spec_of(i).name] for w in waves for i in w]
    changed = [r.agent for r in results.values() if r.changed]
    unchanged = [r.agent for r in results.values() if not r.changed]
    untouched = [spec_of(i).name for w in waves[done_waves:] for i in w]
    failed = {agent: str(exc) for agent, exc in failures.items()}
    raise ApplicationError(
        f"{name}: failed on {', '.join(sorted(failed))}; changed: {', '.join(changed) or 'none'}; "
        f"unchanged: {', '.join(unchanged) or 'none'}; not attempted: {', '.join(untouched) or 'none'}; errors: "
        + "; ".join(f"{e}" for _, e in sorted(failed.items())),
        {"changed_agents": changed, "unchanged_agents": unchanged, "not_attempted": untouched,
         "failed_agents": failed, "results": [r.model_dump() for r in results.values()], **partial()},
        type="PartialFailure",
        # Safe to run again as a whole: every agent is check-then-act.
        non_retryable=not all(getattr(exc, "retryable", True) for exc in failures.values()),
    )


# --------------------------------------------------------------------------- actions


@implements(AGENTS_STREAMING)
async def agents_streaming(inp: AgentsStreamingInput) -> AgentsStreamingOutput:
    selected = [a for a in inp.agents if a.role in inp.roles]
    skipped = [a.name for a in inp.agents if a.role not in inp.roles]
    first: Role = "client" if not inp.enabled else "server"
    ordered = sorted(selected, key=lambda a: a.role != first)
    # What earlier attempts of this activity changed: a retry finds those agents done, and must still undo them.
    details = resume_details()
    restores: dict[str, AgentRestore] = {}
    if isinstance(details, dict) and details.get("enabled") == inp.enabled:
        restores = {r["agent"]["name"]: AgentRestore.model_validate(r) for r in details.get("restores", [])}

    def progress() -> dict[str, Any]:
        return {"enabled": inp.enabled, "restores": [r.model_dump(mode="json") for r in restores.values()]}

    async def change(agent: _Agent, spec: ConsulAgentHost) -> AgentChange:
        want = wanted(spec.role, inp.enabled)
        content = drop_in(spec.role, inp.enabled)
        before = await agent.report()
        current = await agent.read_file()
        # Already in effect with no drop-in saying otherwise: nothing to do (the main config may say so).
        write = current != content and not (current is None and before == want)
        if write:
            if spec.name not in restores:
                restores[spec.name] = AgentRestore(agent=spec, file=inp.file, previous=current, written=content,
                                                   report=before)
            _beat(progress())  # recorded before the change, so a crash after it still leaves an undo
            await agent.put_file(content)
        restart = before != want
        after = before
        if restart:
            await agent.restart(inp.ready_timeout_seconds)
            after = await agent.wait_for(want, inp.ready_timeout_seconds)
        return AgentChange(agent=spec.name, role=spec.role, changed=write or restart, file_written=write,
                           restarted=restart, before=before, after=after)

    results = await _in_waves("consul.agents.streaming", inp.consul, _waves(ordered, lambda a: a.role, inp.wave_size),
                              lambda a: a, lambda _: inp.file, change, progress)
    # The undo runs the agents in the opposite order (turning back on: servers before their clients).
    undo_agents = [restores[a.name] for a in reversed(ordered) if a.name in restores]
    return AgentsStreamingOutput(
        enabled=inp.enabled, agents=results, changed_agents=[r.agent for r in results if r.changed],
        skipped_agents=skipped,
        undo=AgentsStreamingRestoreInput(consul=inp.consul, agents=undo_agents, wave_size=inp.wave_size,
                                         ready_timeout_seconds=inp.ready_timeout_seconds))


@implements(AGENTS_STREAMING_RESTORE)
async def agents_streaming_restore(inp: AgentsStreamingRestoreInput) -> AgentsStreamingRestoreOutput:
    if not inp.agents:
        return AgentsStreamingRestoreOutput(agents=[], changed_agents=[])
    token = await asyncio.to_thread(secret_of, inp.consul.token)
    conflicts = []
    for r in inp.agents:
        async with executor_for(r.agent) as ex:
            agent = _Agent(r.agent, ex, consul_client(inp.consul, address=r.agent.http, token=token), r.file)
            current = await agent.read_file()
        if current not in (r.written, r.previous):
            conflicts.append(f"{r.agent.name}: {agent.path} changed since")
    if conflicts:
        raise ApplicationError(f"consul.agents.streaming_restore: nothing changed, drop-ins rewritten by someone "
                               f"else: {'; '.join(conflicts[:20])}", type="Conflict", non_retryable=True)

    async def restore(agent: _Agent, r: AgentRestore) -> AgentChange:
        before = await agent.report()
        current = await agent.read_file()
        write = current != r.previous
        if write:
            await agent.put_file(r.previous)
        restart = before != r.report
        after = before
        if restart:
            await agent.restart(inp.ready_timeout_seconds)
            after = await agent.wait_for(r.report, inp.ready_timeout_seconds)
        return AgentChange(agent=r.agent.name, role=r.agent.role, changed=write or restart, file_written=write,
                           restarted=restart, before=before, after=after)

    results = await _in_waves("consul.agents.streaming_restore", inp.consul,
                              _waves(inp.agents, lambda r: r.agent.role, inp.wave_size), lambda r: r.agent,
                              lambda r: r.file, restore, dict)
    return AgentsStreamingRestoreOutput(agents=results, changed_agents=[r.agent for r in results if r.changed])


@implements(AGENTS_STREAMING_STATUS)
async def agents_streaming_status(inp: AgentsStreamingStatusInput) -> AgentsStreamingStatusOutput:
    token = await asyncio.to_thread(secret_of, inp.consul.token)
    gate = asyncio.Semaphore(inp.max_parallel)

    async def one(spec: ConsulAgentHost) -> AgentStatus:
        async with gate:
            client = consul_client(inp.consul, address=spec.http, token=token)
            try:
                return AgentStatus(agent=spec.name, role=spec.role, report=await _report(spec, client))
            except AgentFailure as exc:
                return AgentStatus(agent=spec.name, role=spec.role, error=str(exc))

    statuses = list(await asyncio.gather(*(one(a) for a in inp.agents if a.role in inp.roles)))
    on = [s.agent for s in statuses if s.report is not None and _streaming(s.report)]
    off = [s.agent for s in statuses if s.report is not None and not _streaming(s.report)]
    if inp.expect is not None:
        wrong = [s for s in statuses if s.report is None or _streaming(s.report) != inp.expect]
        if wrong:
            raise ApplicationError(
                f"{len(wrong)} of {len(statuses)} agent(s) do not report streaming "
                f"{'on' if inp.expect else 'off'}: " + "; ".join(
                    f"{s.agent}: {s.error or s.report}" for s in wrong[:20]),
                {"streaming_on": on, "streaming_off": off, "errors": {s.agent: s.error for s in statuses if s.error}},
                type="Mismatch")
    return AgentsStreamingStatusOutput(agents=statuses, streaming_on=on, streaming_off=off)


def _streaming(report: StreamingReport) -> bool:
    """On if the agent reads through the streaming backend or (a server) serves it."""
    return report.use_streaming_backend or bool(report.enable_streaming)

"""Nomad can place the job the runbook redeploys from scratch: eligible nodes' free resources against its asks."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Any

import nomad.api.exceptions
import requests

from activities._clients import nomad_client
from activities.contracts.targets import NomadTarget
from activities.secrets import read_kv_secret
from runtime.readiness.model import Verdict, not_ready, ready

__all__ = ["GroupAsk", "NodeRoom", "capacity_verdict", "placements"]

# Allocations that hold resources on a node.
_HOLDING = {"pending", "running"}


@dataclass(frozen=True)
class GroupAsk:
    name: str
    count: int
    cpu: int
    memory_mb: int
    # A static port: one allocation of the group per node at most.
    static_port: bool


@dataclass(frozen=True)
class NodeRoom:
    name: str
    cpu: int
    memory_mb: int


def _asks(job: dict[str, Any]) -> list[GroupAsk]:
    asks = []
    for group in job.get("TaskGroups") or []:
        tasks = group.get("Tasks") or []
        static = any(net.get("ReservedPorts") for net in group.get("Networks") or []) or any(
            net.get("ReservedPorts") for task in tasks for net in (task.get("Resources") or {}).get("Networks") or [])
        asks.append(GroupAsk(
            str(group.get("Name")), int(group.get("Count") or 1),
            sum(int((t.get("Resources") or {}).get("CPU") or 0) for t in tasks),
            sum(int((t.get("Resources") or {}).get("MemoryMB") or 0) for t in tasks), bool(static)))
    return asks


def placements(asks: list[GroupAsk], rooms: list[NodeRoom], *, system: bool,
               runs_on: dict[str, str] | None = None) -> list[str]:
    """What cannot be placed, one line per group; empty when everything fits. A system job needs each group back
    on every node it runs on now (`runs_on`: node name -> why it has no room, "" when it is in `rooms`), or on
    at least one node when it runs nowhere; other jobs fill nodes first-fit, group by group."""
    problems = []
    free = {room.name: [room.cpu, room.memory_mb] for room in rooms}
    if system and runs_on:
        return _system_placements(asks, free, runs_on)
    for ask in asks:
        placed = 0
        want = 1 if system else ask.count
        for name, (cpu, memory) in free.items():
            fits = min(cpu // ask.cpu if ask.cpu else want, memory // ask.memory_mb if ask.memory_mb else want)
            take = min(fits, want - placed, 1 if ask.static_port or system else fits)
            if take > 0:
                free[name] = [cpu - take * ask.cpu, memory - take * ask.memory_mb]
                placed += take
            if placed >= want:
                break
        if placed < want:
            problems.append(f"group {ask.name} ({ask.cpu} MHz, {ask.memory_mb} MB each) places {placed} of {want}")
    return problems


def _system_placements(asks: list[GroupAsk], free: dict[str, list[int]], runs_on: dict[str, str]) -> list[str]:
    problems = []
    for ask in asks:
        for name, why in sorted(runs_on.items()):
            cpu, memory = free.get(name, [0, 0])
            if name not in free:
                problems.append(f"group {ask.name} cannot go back on {name}: {why or 'not ready'}")
            elif cpu < ask.cpu or memory < ask.memory_mb:
                problems.append(f"group {ask.name} ({ask.cpu} MHz, {ask.memory_mb} MB) does not fit on {name} "
                                f"({cpu} MHz, {memory} MB free)")
            else:
                free[name] = [cpu - ask.cpu, memory - ask.memory_mb]
    return problems


def _why_no_room(node: dict[str, Any]) -> str:
    if node.get("Status") != "ready":
        return f"node {node.get('Status')}"
    if node.get("Drain"):
        return "draining"
    if node.get("SchedulingEligibility") != "eligible":
        return "ineligible"
    return ""


def _rooms(client: Any, job: dict[str, Any]) -> tuple[list[NodeRoom], int, dict[str, str]]:
    """Free resources on each ready, eligible, undrained node in the job's datacenters, the job's own
    allocations left out (a redeploy from scratch purges them first); how many nodes there are; and why each
    node has no room (node name -> reason, "" for a node with room)."""
    datacenters = job.get("Datacenters") or ["*"]
    nodes = client.nodes.get_nodes(resources=True)
    rooms = []
    why: dict[str, str] = {}
    for node in nodes:
        name = node.get("Name") or node["ID"]
        why[name] = _why_no_room(node)
        if why[name]:
            continue
        if not any(fnmatch(node.get("Datacenter", ""), dc) for dc in datacenters):
            continue
        total = node.get("NodeResources") or {}
        reserved = node.get("ReservedResources") or {}
        cpu = int((total.get("Cpu") or {}).get("CpuShares") or 0) - int((reserved.get("Cpu") or {}).get("CpuShares") or 0)
        memory = int((total.get("Memory") or {}).get("MemoryMB") or 0) - int((reserved.get("Memory") or {}).get("MemoryMB") or 0)
        for alloc in client.node.get_allocations(node["ID"]):
            if alloc.get("ClientStatus") not in _HOLDING or alloc.get("JobID") == job.get("ID"):
                continue
            for task in ((alloc.get("AllocatedResources") or {}).get("Tasks") or {}).values():
                cpu -= int((task.get("Cpu") or {}).get("CpuShares") or 0)
                memory -= int((task.get("Memory") or {}).get("MemoryMB") or 0)
        rooms.append(NodeRoom(name, cpu, memory))
    return rooms, len(nodes), why


def _running_on(client: Any, job_id: str, namespace: str) -> set[str]:
    """The nodes a job's allocations run on now (none when it is not registered)."""
    try:
        allocations = client.job.get_allocations(job_id, namespace=namespace)
    except nomad.api.exceptions.URLNotFoundNomadException:
        return set()
    return {str(a.get("NodeName") or a.get("NodeID")) for a in allocations or [] if a.get("ClientStatus") == "running"}


def _check(target: NomadTarget, job_id: str, namespace: str, spec: dict[str, Any] | None,
           vault_token: str | None) -> Verdict:
    # Nomad's own token, read from Vault with the login given (the worker's AppRole), else as its reference says.
    nomad_token = read_kv_secret(target.token, token=vault_token) if target.token is not None else None
    client = nomad_client(target, token=nomad_token)
    if spec is None:
        try:
            spec = client.job.get_job(job_id, namespace=namespace)
        except nomad.api.exceptions.URLNotFoundNomadException:
            return not_ready(f"Nomad at {target.address} has no job {job_id} to redeploy from its spec")
    job: dict[str, Any] = (spec or {}).get("Job", spec) or {}
    asks = _asks(job)
    rooms, total, why = _rooms(client, job)
    system = job.get("Type") == "system"
    runs_on = {name: why.get(name, "not a Nomad node any more") for name in _running_on(client, job_id, namespace)
               } if system else {}
    problems = placements(asks, rooms, system=system, runs_on=runs_on)
    summary = (f"{len(rooms)} of {total} nodes ready and eligible in {', '.join(job.get('Datacenters') or ['*'])}")
    if problems:
        return not_ready(f"job {job_id} cannot be placed from scratch: {'; '.join(problems)} ({summary})")
    asked = ", ".join(f"{a.name} {a.count}x {a.cpu} MHz/{a.memory_mb} MB" for a in asks)
    back_on = f" (back on each of {', '.join(sorted(runs_on))}, where it runs now)" if runs_on else ""
    return ready(f"job {job_id} ({asked}) fits from scratch on {summary}{back_on}")


def _checked(target: NomadTarget, job_id: str, namespace: str, spec: dict[str, Any] | None,
             vault_token: str | None) -> Verdict:
    try:
        return _check(target, job_id, namespace, spec, vault_token)
    except (nomad.api.exceptions.BaseNomadException, requests.RequestException) as exc:
        return not_ready(f"Nomad at {target.address} does not answer: {type(exc).__name__}")


async def capacity_verdict(target: NomadTarget, job: str, *, namespace: str = "default",
                           spec: dict[str, Any] | None = None, vault_token: str | None = None) -> Verdict:
    """`vault_token`: the Vault login Nomad's token is read with (the worker's AppRole); None: its reference's own."""
    return await asyncio.to_thread(_checked, target, job, namespace, spec, vault_token)

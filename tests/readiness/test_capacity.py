"""Nomad's capacity for a job redeployed from scratch, on a real Nomad server and client (lab/hashistack/local.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from activities.contracts.targets import NomadTarget
from lab.hashistack.local import LocalStack, missing_binaries
from runtime.readiness.capacity import GroupAsk, NodeRoom, capacity_verdict, placements
from tests.real import unavailable


def test_placements_fill_nodes_and_keep_a_static_port_to_one_per_node() -> None:
    rooms = [NodeRoom("a", 1000, 1024), NodeRoom("b", 500, 512)]
    assert placements([GroupAsk("web", 3, 300, 256, static_port=False)], rooms, system=False) == []
    assert placements([GroupAsk("web", 5, 300, 256, static_port=False)], rooms, system=False) == [
        "group web (300 MHz, 256 MB each) places 4 of 5"]
    assert placements([GroupAsk("redis", 3, 100, 64, static_port=True)], rooms, system=False) == [
        "group redis (100 MHz, 64 MB each) places 2 of 3"]
    assert placements([GroupAsk("redis", 1, 2000, 64, static_port=True)], rooms, system=True) == [
        "group redis (2000 MHz, 64 MB each) places 0 of 1"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    if missing := missing_binaries():
        unavailable(f"no {', '.join(missing)} binary (export PATH=.cache/hashistack:$PATH)")
    with LocalStack(tmp_path_factory.mktemp("hashistack")) as local:
        yield local


def _register(stack: LocalStack, job: str, memory_mb: int) -> None:
    spec = {"Job": {"ID": job, "Name": job, "Type": "service", "Datacenters": ["dc1"], "TaskGroups": [{
        "Name": "redis", "Count": 1,
        "Tasks": [{"Name": "redis", "Driver": "raw_exec", "Config": {"command": "/bin/sleep", "args": ["600"]},
                   "Resources": {"CPU": 100, "MemoryMB": memory_mb}}]}]}}
    httpx.post(f"{stack.nomad_url}/v1/jobs", json=spec, timeout=10).raise_for_status()


def _eligibility(stack: LocalStack, value: str) -> None:
    for node in httpx.get(f"{stack.nomad_url}/v1/nodes", timeout=10).json():
        httpx.post(f"{stack.nomad_url}/v1/node/{node['ID']}/eligibility", json={"Eligibility": value},
                   timeout=10).raise_for_status()


async def test_a_job_that_fits_is_ready_and_one_that_cannot_place_is_not(stack: LocalStack, tmp_path: Path) -> None:
    target = NomadTarget(address=stack.nomad_url)
    _register(stack, "cache", 64)
    fits = await capacity_verdict(target, "cache")
    assert fits.state == "ready", fits.evidence
    assert "1 of 1 nodes ready and eligible in dc1" in fits.evidence
    _register(stack, "huge", 64 * 1024 * 1024)
    huge = await capacity_verdict(target, "huge")
    assert huge.state == "not_ready" and "group redis (100 MHz, 67108864 MB each) places 0 of 1" in huge.evidence
    missing = await capacity_verdict(target, "nothing")
    assert missing.state == "not_ready" and "has no job nothing" in missing.evidence


async def test_a_node_marked_ineligible_leaves_no_room_until_it_is_eligible_again(stack: LocalStack) -> None:
    target = NomadTarget(address=stack.nomad_url)
    _register(stack, "cache", 64)
    _eligibility(stack, "ineligible")
    try:
        drained = await capacity_verdict(target, "cache")
    finally:
        _eligibility(stack, "eligible")
    assert drained.state == "not_ready" and "0 of 1 nodes ready and eligible" in drained.evidence
    assert (await capacity_verdict(target, "cache")).state == "ready"

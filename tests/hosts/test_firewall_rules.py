"""firewall.* without a lab: argument checking, rule rendering and parsing (no root needed)."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError

from activities.contracts.firewall import AllowInput, BlockInput
from activities.executors import HostTarget
from activities.firewall.actions import allow, block
from activities.firewall.rules import AllowTier, HostFirewall, _desired_chain, render_block
from activities.registry import default_registry

SSH = {"name": "consul1", "address": "10.213.0.11", "key_path": "/k", "known_hosts": "/kh"}


def _bad(**fields: object) -> BlockInput:
    # model_construct skips validation, as a caller that bypassed the model would.
    base = {"hosts": [HostTarget(**SSH)], "ports": [8500], "allow": [AllowTier(name="c", cidrs=["10.213.0.1/32"])],
            "chain": "COLDSTART-BLOCK", "max_parallel": 8}
    return BlockInput.model_construct(**{**base, **fields})


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"ports": []}, "ports"),
        ({"ports": [70000]}, "out of range"),
        ({"ports": list(range(1, 17))}, "ports"),
        ({"ports": [22]}, "ssh port"),
        ({"allow": [{"name": "c", "cidrs": ["10.213.0.1/24"]}]}, "host bits"),
        ({"allow": [{"name": "c", "cidrs": ["fd00::1/128"]}]}, "IPv6"),
        ({"allow": [{"name": "bad name", "cidrs": ["10.0.0.1/32"]}]}, "name"),
        ({"allow": []}, "allow"),
        ({"chain": "INPUT"}, "built in"),
        ({"hosts": [HostTarget(**SSH), HostTarget(**SSH)]}, "duplicate"),
    ],
)
async def test_bad_arguments_are_non_retryable(fields: dict[str, object], needle: str) -> None:
    with pytest.raises(ApplicationError) as info:
        await block(_bad(**fields))
    assert info.value.non_retryable and info.value.type == "InvalidArgument"
    assert needle in info.value.message


async def test_allow_needs_a_tier_with_sources() -> None:
    bad = AllowInput.model_construct(hosts=[HostTarget(**SSH)], tier={"name": "t", "cidrs": []},
                                     chain="COLDSTART-BLOCK", max_parallel=8)
    with pytest.raises(ApplicationError) as info:
        await allow(bad)
    assert info.value.non_retryable


def test_ssh_target_needs_key_and_address() -> None:
    with pytest.raises(ValueError, match="key_path"):
        HostTarget(name="x", address="10.0.0.1")


def test_bare_cidrs_become_one_tier() -> None:
    inp = BlockInput(hosts=[HostTarget(**SSH)], ports=[8500, 8300, 8500], allow=["10.213.0.1"])
    assert inp.ports == [8300, 8500]
    assert inp.allow == [AllowTier(name="allow", cidrs=["10.213.0.1/32"])]


def test_rendered_block_parses_back_to_the_same_rules() -> None:
    tiers = [AllowTier(name="controller", cidrs=["10.213.0.1/32"]),
             AllowTier(name="servers", cidrs=["10.213.0.11/32", "10.213.0.1/32"])]
    lines = render_block("COLDSTART-BLOCK", [8300, 8500], tiers)
    save = "\n".join(["*filter", ":INPUT ACCEPT [0:0]", ":COLDSTART-BLOCK - [0:0]", *lines, "COMMIT"])
    fw = HostFirewall.parse(save, "COLDSTART-BLOCK")
    assert fw.chain_exists and fw.rules == _desired_chain(tiers)
    assert [j.ports for j in fw.jumps] == [(8300, 8500)] and fw.jump_index == [0]
    # A source named by two tiers is allowed once, by the first.
    assert fw.allowed() == {"10.213.0.1/32": "controller", "10.213.0.11/32": "servers"}
    assert lines[-1].endswith("-j REJECT --reject-with tcp-reset")
    assert not any("ESTABLISHED" in line for line in lines)


def test_actions_are_registered_with_undo() -> None:
    spec = default_registry.get("firewall.block")
    assert spec and spec.mutating and spec.undo == "firewall.unblock" and spec.undo_from_output == "undo"
    assert default_registry.get("firewall.allow").undo == "firewall.revoke"
    assert not default_registry.get("firewall.status").mutating

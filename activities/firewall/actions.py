"""Firewall actions: block service ports with iptables, then let clients back in tier by tier."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.binding import implements
from activities.contracts.firewall import (
    ALLOW,
    BLOCK,
    REVOKE,
    STATUS,
    UNBLOCK,
    AllowInput,
    AllowOutput,
    BlockInput,
    BlockOutput,
    HostChange,
    HostStatus,
    RevokeInput,
    RevokeOutput,
    StatusInput,
    StatusOutput,
    Targeted,
    UnblockInput,
    UnblockOutput,
)
from activities.errors import ColdstartError
from activities.executors import Executor, ExecutorError, HostTarget, executor_for
from activities.firewall.rules import (
    HostFirewall,
    Rule,
    _allow_rule,
    _desired_chain,
    _jump_spec,
    _loopback_rule,
    _reject_rule,
)

__all__ = ["allow", "block", "revoke", "status", "unblock"]

IPTABLES_SAVE = ["iptables-save", "-t", "filter"]
IPTABLES_RESTORE = ["iptables-restore", "--wait=5", "--noflush"]


# --------------------------------------------------------------------------- host plumbing


class HostFailure(ColdstartError):
    """A host-level failure; `retryable` says whether running the activity again could help."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


async def _read(ex: Executor, chain: str) -> HostFirewall:
    rc, out, err = await ex.run(IPTABLES_SAVE)
    if rc != 0:
        raise HostFailure(f"iptables-save failed (rc={rc}): {err.strip()}")
    return HostFirewall.parse(out, chain)


async def _apply(ex: Executor, lines: list[str]) -> None:
    # One iptables-restore transaction per host: it all lands or none of it does.
    payload = "\n".join(["*filter", *lines, "COMMIT", ""])
    rc, _, err = await ex.run(IPTABLES_RESTORE, input=payload)
    if rc != 0:
        raise HostFailure(f"iptables-restore failed (rc={rc}): {err.strip()}")


def _chain_section(chain: str, rules: list[Rule]) -> list[str]:
    # With --noflush, declaring the chain creates it or flushes it; -F makes that explicit.
    return [f":{chain} - [0:0]", f"-F {chain}", *(r.render(chain) for r in rules)]


def _delete(line: str) -> str:
    return "-D" + line[2:]  # "-A INPUT ..." -> "-D INPUT ..."


def _describe_chain_change(old: HostFirewall, new: list[Rule], chain: str) -> list[str]:
    if not old.chain_exists:
        allowed = [f"{r.source} ({r.tier})" for r in new if r.source]
        return [f"created chain {chain}", f"allowed {', '.join(allowed)}", "reject other tcp with tcp-reset"]
    before, after = old.allowed(), {r.source: r.tier for r in new if r.source}
    actions = [f"allowed {c} ({t})" for c, t in after.items() if c not in before]
    actions += [f"removed allow {c} ({t})" for c, t in before.items() if c not in after]
    if not actions:
        actions = [f"rewrote chain {chain} (rules had drifted)"]
    return actions


async def _converge_chain(ex: Executor, inp: Targeted, want: Callable[[HostFirewall], list[Rule]],
                          ports: list[int] | None) -> HostChange:
    """Read, compare, apply the difference in one transaction, read back and verify."""
    chain = inp.chain
    fw = await _read(ex, chain)
    rules = want(fw)
    lines: list[str] = []
    actions: list[str] = []
    if not fw.chain_exists or fw.rules != rules:
        actions += _describe_chain_change(fw, rules, chain)
        lines += _chain_section(chain, rules)
    if ports is not None:
        good = [j for j, pos in zip(fw.jumps, fw.jump_index, strict=True)
                if j.ports == tuple(ports) and not j.extra and pos == 0]
        if not (len(fw.jumps) == 1 and good):
            # Wrong ports, duplicates, or not first in INPUT (an earlier ESTABLISHED accept
            # would let existing clients through): remove them all and insert one at the top.
            lines += [_delete(j.line) for j in fw.jumps]
            lines.append(f"-I INPUT 1 {_jump_spec(chain, ports)}")
            if fw.jumps:
                actions.append(f"replaced INPUT jump(s) with tcp dports {','.join(map(str, ports))} at position 1")
            else:
                actions.append(f"inserted INPUT jump for tcp dports {','.join(map(str, ports))} at position 1")
    if lines:
        await _apply(ex, lines)
        after = await _read(ex, chain)
        if after.rules != rules:
            raise HostFailure(f"applied, but chain {chain} reads back differently: {after.lines}")
    else:
        after = fw
    return HostChange(host=ex.host, changed=bool(lines), actions=actions, rules=after.lines)


# --------------------------------------------------------------------------- fan-out

R = TypeVar("R")


async def _fan_out(name: str, inp: Targeted, per_host: Callable[[Executor], Awaitable[R]]) -> list[R]:
    """Run per_host on every host (bounded concurrency); on any failure say exactly who changed."""
    gate = asyncio.Semaphore(inp.max_parallel)
    results: dict[str, R] = {}
    failures: dict[str, HostFailure | ExecutorError] = {}

    async def one(target: HostTarget) -> None:
        async with gate:
            try:
                async with executor_for(target) as ex:
                    results[target.name] = await per_host(ex)
            except (HostFailure, ExecutorError) as exc:
                failures[target.name] = exc
            except Exception as exc:  # noqa: BLE001 - one host's surprise must not hide the others' results
                failures[target.name] = HostFailure(f"unexpected error: {exc!r}")
            if activity.in_activity():
                activity.heartbeat(target.name)

    await asyncio.gather(*(one(t) for t in inp.hosts))
    ordered = [results[t.name] for t in inp.hosts if t.name in results]
    if failures:
        changed = [r.host for r in ordered if isinstance(r, HostChange) and r.changed]
        unchanged = [r.host for r in ordered if isinstance(r, HostChange) and not r.changed]
        failed = {host: str(exc) for host, exc in failures.items()}
        retryable = all(getattr(exc, "retryable", True) for exc in failures.values())
        raise ApplicationError(
            f"{name}: failed on {', '.join(sorted(failed))}; changed: {', '.join(changed) or 'none'}; "
            f"unchanged: {', '.join(unchanged) or 'none'}; errors: "
            + "; ".join(f"{h}: {e}" for h, e in sorted(failed.items())),
            {
                "changed_hosts": changed,
                "unchanged_hosts": unchanged,
                "failed_hosts": failed,
                "results": [r.model_dump() for r in ordered if isinstance(r, BaseModel)],
            },
            type="PartialFailure",
            # Safe to retry as a whole: every step is check-then-act.
            non_retryable=not retryable,
        )
    return ordered


def _changed(results: list[HostChange]) -> list[str]:
    return [r.host for r in results if r.changed]


# --------------------------------------------------------------------------- actions


@implements(BLOCK)
async def block(inp: BlockInput) -> BlockOutput:
    rules = _desired_chain(inp.allow)
    results = await _fan_out(
        "firewall.block", inp, lambda ex: _converge_chain(ex, inp, lambda fw: rules, inp.ports)
    )
    return BlockOutput(
        hosts=results,
        changed_hosts=_changed(results),
        undo=UnblockInput(hosts=inp.hosts, chain=inp.chain, max_parallel=inp.max_parallel),
    )


@implements(UNBLOCK)
async def unblock(inp: UnblockInput) -> UnblockOutput:

    async def one(ex: Executor) -> HostChange:
        fw = await _read(ex, inp.chain)
        lines = [_delete(j.line) for j in fw.jumps]
        actions = [f"removed INPUT jump ({j.line})" for j in fw.jumps]
        if fw.chain_exists:
            lines += [f"-F {inp.chain}", f"-X {inp.chain}"]
            actions.append(f"deleted chain {inp.chain} ({len(fw.rules)} rules)")
        if lines:
            await _apply(ex, lines)
            after = await _read(ex, inp.chain)
            if after.chain_exists or after.jumps:
                raise HostFailure(f"unblock applied, but {inp.chain} or its jump is still there")
        return HostChange(host=ex.host, changed=bool(lines), actions=actions, rules=[])

    results = await _fan_out("firewall.unblock", inp, one)
    return UnblockOutput(hosts=results, changed_hosts=_changed(results))


def _require_block(fw: HostFirewall, chain: str) -> None:
    if not fw.chain_exists:
        raise HostFailure(f"no block: chain {chain} does not exist (run firewall.block first)", retryable=False)
    if not fw.rules or fw.rules[-1] != _reject_rule():
        raise HostFailure(f"chain {chain} does not end in the block's reject rule; re-run firewall.block",
                          retryable=False)
    if any(r.extra for r in fw.rules):
        # Rewriting the chain would drop the options we do not model; let a human look first.
        raise HostFailure(f"chain {chain} has rules the block did not write: {fw.lines}", retryable=False)


@implements(ALLOW)
async def allow(inp: AllowInput) -> AllowOutput:

    def want(fw: HostFirewall) -> list[Rule]:
        _require_block(fw, inp.chain)
        present = fw.allowed()
        new = [_allow_rule(c, inp.tier.name) for c in inp.tier.cidrs if c not in present]
        return [*fw.rules[:-1], *new, fw.rules[-1]]

    results = await _fan_out("firewall.allow", inp, lambda ex: _converge_chain(ex, inp, want, None))
    # Undo removes this tier's rules only; sources another tier already allowed stay allowed.
    return AllowOutput(
        hosts=results,
        changed_hosts=_changed(results),
        undo=RevokeInput(hosts=inp.hosts, chain=inp.chain, tier=inp.tier, max_parallel=inp.max_parallel),
    )


@implements(REVOKE)
async def revoke(inp: RevokeInput) -> RevokeOutput:
    drop = set(inp.tier.cidrs)

    def want(fw: HostFirewall) -> list[Rule]:
        _require_block(fw, inp.chain)
        return [r for r in fw.rules if not (r.source in drop and r.tier == inp.tier.name)]

    results = await _fan_out("firewall.revoke", inp, lambda ex: _converge_chain(ex, inp, want, None))
    return RevokeOutput(
        hosts=results,
        changed_hosts=_changed(results),
        undo=AllowInput(hosts=inp.hosts, chain=inp.chain, tier=inp.tier, max_parallel=inp.max_parallel),
    )


@implements(STATUS)
async def status(inp: StatusInput) -> StatusOutput:

    async def one(target: HostTarget) -> HostStatus:
        try:
            async with executor_for(target) as ex:
                fw = await _read(ex, inp.chain)
        except (HostFailure, ExecutorError) as exc:
            # Status never raises for one host: an unreachable host is itself the answer.
            return HostStatus(host=target.name, error=str(exc))
        tiers: dict[str, list[str]] = {}
        for cidr, tier in fw.allowed().items():
            tiers.setdefault(tier, []).append(cidr)
        problems = []
        if len(fw.jumps) > 1:
            problems.append(f"{len(fw.jumps)} INPUT jumps to {inp.chain}")
        if fw.jumps and not fw.chain_exists:
            problems.append("INPUT jump without chain")
        if fw.chain_exists and not fw.jumps:
            problems.append("chain exists but nothing jumps to it: nothing is blocked")
        if fw.jumps and fw.jump_index[0] != 0:
            problems.append(f"INPUT jump is rule {fw.jump_index[0] + 1}, not 1: earlier rules may let clients in")
        if any(r.extra for r in fw.rules):
            problems.append("chain has rules the block did not write")
        return HostStatus(
            host=target.name,
            blocked=fw.chain_exists and bool(fw.jumps),
            ports=list(fw.jumps[0].ports) if fw.jumps else [],
            tiers=tiers,
            loopback=_loopback_rule() in fw.rules,
            rejects=bool(fw.rules) and fw.rules[-1] == _reject_rule(),
            jump_first=bool(fw.jump_index) and fw.jump_index[0] == 0,
            problems=problems,
        )

    gate = asyncio.Semaphore(inp.max_parallel)

    async def gated(target: HostTarget) -> HostStatus:
        async with gate:
            return await one(target)

    return StatusOutput(hosts=list(await asyncio.gather(*(gated(t) for t in inp.hosts))))

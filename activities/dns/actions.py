"""DNS steering actions: admit a hashed share of players to the game IP, the rest to the maintenance IP."""

from __future__ import annotations

import asyncio
import math

import dns.asyncquery
import dns.exception
import dns.name
import dns.rcode
import dns.tsig
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.binding import implements
from activities.contracts.dns import (
    STEER_GET,
    STEER_SAMPLE,
    STEER_SET,
    ServerState,
    SteerGetInput,
    SteerGetOutput,
    SteerSampleInput,
    SteerSampleOutput,
    SteerSetInput,
    SteerSetOutput,
    ecs_subnets,
    parse_server,
)
from activities.dns.axfr import read_state
from activities.dns.ecs import query_clients
from activities.dns.steering import steering_update
from activities.heartbeats import heartbeating
from activities.secrets import read_kv_secret

__all__ = ["steer_get", "steer_sample", "steer_set"]


def _fmt(percent: float | None) -> str:
    if percent is None:
        return "absent"
    return f"{percent:g}%"


async def _send_update(inp: SteerSetInput, server: str, key: dns.tsig.Key) -> str | None:
    """Send the UPDATE; return None on NOERROR, else what went wrong (never the secret)."""
    host, port = parse_server(server)
    upd = steering_update(
        inp.zone, inp.fqdn, game_ip=inp.game_ip, maint_ip=inp.maint_ip, percent=inp.percent, ttl=inp.ttl, key=key
    )
    try:
        reply = await dns.asyncquery.tcp(upd, host, port=port, timeout=inp.timeout_s)
    except dns.exception.Timeout:
        raise
    except dns.exception.DNSException as exc:
        # pdns answers a bad signature or an unknown key with an unsigned error, which
        # dnspython rejects ("response requires a TSIG"): a refusal, not a transport problem.
        return f"reply rejected, likely a TSIG key/secret mismatch: {exc}"
    if reply.rcode() != dns.rcode.NOERROR:
        return f"rcode {dns.rcode.to_text(reply.rcode())}"
    return None


def _why(state: ServerState, problems: dict[str, str | None]) -> str:
    if state.server not in problems:
        # It was at target when read, so something else wrote it meanwhile.
        return f"{state.server} changed by someone else during this update: now at {_fmt(state.percent)}"
    problem = problems[state.server] or "NOERROR reply, but not applied: the server's update policy rejected it"
    return f"update refused by {state.server}: record still at {_fmt(state.percent)} ({problem})"


def _undo_input(inp: SteerSetInput, before: list[ServerState]) -> SteerSetInput:
    # Servers may have disagreed; going back to the lowest share never admits anyone who
    # was not admitted somewhere before.
    percents = [s.percent if s.percent is not None else 0.0 for s in before]
    return inp.model_copy(update={"percent": math.floor(min(percents))})


def _at_target(state: ServerState, inp: SteerSetInput) -> bool:
    return (
        state.foreign_code is None
        and state.percent == inp.percent
        and state.game_ip == inp.game_ip
        and state.maint_ip == inp.maint_ip
        and state.ttl == inp.ttl
    )


async def _tsig_key(inp: SteerSetInput) -> dns.tsig.Key:
    # hvac is blocking; keep it off the event loop that other activities share.
    secret = await asyncio.to_thread(read_kv_secret, inp.tsig_secret)
    try:
        return dns.tsig.Key(inp.tsig_key_name, secret, dns.tsig.HMAC_SHA256)
    except ValueError:  # binascii.Error
        raise ApplicationError(
            "the TSIG secret in Vault is not valid base64", type="VaultMissing", non_retryable=True
        ) from None


@implements(STEER_SET)
async def steer_set(inp: SteerSetInput) -> SteerSetOutput:
    log = activity.logger
    before = list(await asyncio.gather(*(read_state(s, inp.zone, inp.fqdn, inp.timeout_s) for s in inp.servers)))
    for state in before:
        if state.foreign_code is not None:
            raise ApplicationError(
                f"{inp.fqdn} on {state.server} is not a steering record ({state.foreign_code});"
                " refusing to overwrite",
                type="NotSteering",
                non_retryable=True,
            )
    pending = [s.server for s in before if not _at_target(s, inp)]
    if not pending:
        log.info("dns.steer.set: %s already at %s%% on all servers", inp.fqdn, inp.percent)
        return SteerSetOutput(
            previous_percent=before[0].percent,
            percent=inp.percent,
            changed=False,
            verified_servers=list(inp.servers),
            updated_servers=[],
            previous=before,
            undo=_undo_input(inp, before),
        )

    # Only now fetch the key: a no-op retry needs neither Vault nor the secret.
    key = await _tsig_key(inp)
    problems: dict[str, str | None] = {}
    for server in pending:
        # One server at a time: if several front one backend, later ones are then already at target.
        try:
            problems[server] = await _send_update(inp, server, key)
        except (OSError, EOFError, dns.exception.Timeout) as exc:
            problems[server] = f"no reply: {type(exc).__name__}"
        log.info("dns.steer.set: UPDATE %s on %s -> %s", inp.fqdn, server, problems[server] or "NOERROR")

    after = list(await asyncio.gather(*(read_state(s, inp.zone, inp.fqdn, inp.timeout_s) for s in inp.servers)))
    failed = [s for s in after if not _at_target(s, inp)]
    if failed:
        unreachable_only = all((problems.get(s.server) or "").startswith("no reply") for s in failed)
        details = "; ".join(_why(s, problems) for s in failed)
        done = [s.server for s in after if _at_target(s, inp)]
        raise ApplicationError(
            f"{inp.fqdn} not at {inp.percent}%: {details}"
            + (f"; at target: {', '.join(done)}" if done else ""),
            type="UpdateNotApplied",
            # A lost reply may be a server restarting: retry. A refusal (key, policy) won't heal.
            non_retryable=not unreachable_only,
        )
    return SteerSetOutput(
        previous_percent=before[0].percent,
        percent=inp.percent,
        changed=True,
        verified_servers=[s.server for s in after],
        updated_servers=pending,
        previous=before,
        undo=_undo_input(inp, before),
    )


@implements(STEER_GET)
@heartbeating
async def steer_get(inp: SteerGetInput) -> SteerGetOutput:
    states = list(await asyncio.gather(*(read_state(s, inp.zone, inp.fqdn, inp.timeout_s) for s in inp.servers)))
    signatures = {(s.present, s.percent, s.game_ip, s.maint_ip, s.ttl, s.foreign_code) for s in states}
    consistent = len(signatures) == 1
    return SteerGetOutput(servers=states, percent=states[0].percent if consistent else None, consistent=consistent)


@implements(STEER_SAMPLE)
async def steer_sample(inp: SteerSampleInput) -> SteerSampleOutput:
    subnets = ecs_subnets(inp.ecs_base, inp.ecs_prefix, inp.clients)
    answers = await query_clients(
        inp.server, inp.name, subnets, concurrency=inp.concurrency, timeout=inp.timeout_s, attempts=inp.attempts
    )
    admitted = sum(1 for a in answers if a == inp.game_ip)
    unanswered = sum(1 for a in answers if a is None)
    return SteerSampleOutput(
        clients=inp.clients,
        admitted=admitted,
        other=inp.clients - admitted - unanswered,
        unanswered=unanswered,
        admitted_fraction=admitted / inp.clients,
    )

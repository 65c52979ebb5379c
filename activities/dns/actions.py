"""DNS steering actions: admit a hashed share of players to the game IP, the rest to the maintenance IP."""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta

import dns.asyncquery
import dns.exception
import dns.name
import dns.rcode
import dns.tsig
from pydantic import BaseModel, Field, field_validator, model_validator
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities._fields import AbsoluteName, IPv4
from activities.dns.axfr import ServerState, read_state
from activities.dns.ecs import ecs_subnets, query_clients
from activities.dns.steering import parse_server, steering_update
from activities.registry import action
from activities.retry import Retry
from activities.secrets import VaultSecretRef, read_kv_secret

__all__ = [
    "SteerGetInput",
    "SteerGetOutput",
    "SteerSampleInput",
    "SteerSampleOutput",
    "SteerSetInput",
    "SteerSetOutput",
    "steer_get",
    "steer_sample",
    "steer_set",
]


class _Target(BaseModel):
    """Zone, steering name and the authoritative servers that serve it."""

    zone: AbsoluteName = Field(description="zone holding the steering record, e.g. play.coldstart.lab.")
    name: str = Field(description="steering name, relative to the zone (play) or absolute")
    servers: list[str] = Field(min_length=1, description="authoritative servers as ip:port; each is verified")
    timeout_s: float = Field(default=3.0, gt=0, le=30, description="per DNS exchange")

    @field_validator("servers")
    @classmethod
    def _servers(cls, v: list[str]) -> list[str]:
        for s in v:
            parse_server(s)
        if len(set(v)) != len(v):
            raise ValueError("servers listed twice")
        return v

    @model_validator(mode="after")
    def _name_in_zone(self) -> _Target:
        try:
            fqdn = self.fqdn
        except dns.exception.DNSException as exc:
            raise ValueError(f"bad DNS name {self.name!r}: {exc}") from None
        if not dns.name.from_text(fqdn).is_subdomain(dns.name.from_text(self.zone)):
            raise ValueError(f"{fqdn} is not in zone {self.zone}")
        return self

    @property
    def fqdn(self) -> str:
        origin = dns.name.from_text(self.zone)
        return dns.name.from_text(self.name, origin=origin).to_text()


class SteerSetInput(_Target):
    """Set the steering record to `percent` on every server and verify it took."""

    game_ip: IPv4 = Field(description="IPv4 answered to admitted clients")
    maint_ip: IPv4 = Field(description="IPv4 answered to everyone else")
    percent: int = Field(ge=0, le=100, description="share of clients admitted to game_ip")
    ttl: int = Field(default=30, ge=1, le=86400, description="TTL of the answers")
    tsig_key_name: AbsoluteName = Field(description="TSIG key name (hmac-sha256)")
    tsig_secret: VaultSecretRef = Field(description="where the TSIG secret lives; read inside the activity")

    @model_validator(mode="after")
    def _distinct(self) -> SteerSetInput:
        if self.game_ip == self.maint_ip:
            raise ValueError("game_ip and maint_ip must differ")
        return self


class SteerSetOutput(BaseModel):
    previous_percent: float | None = Field(description="first server's percent before; None if absent")
    percent: int
    changed: bool
    verified_servers: list[str]
    updated_servers: list[str]
    previous: list[ServerState]
    undo: SteerSetInput = Field(
        description="this input at the lowest previous percent (0 if absent): rolling back admits no one new"
    )


class SteerGetInput(_Target):
    """Read the steering record on every server."""


class SteerGetOutput(BaseModel):
    servers: list[ServerState]
    # The common percent when every server agrees on the whole record, else None.
    percent: float | None
    consistent: bool


class SteerSampleInput(BaseModel):
    """Ask one server as N distinct ECS client subnets and measure the admitted share."""

    server: str
    name: AbsoluteName = Field(description="absolute steering name, e.g. play.play.coldstart.lab.")
    game_ip: IPv4
    clients: int = Field(default=1000, ge=1, le=65536)
    ecs_base: str = Field(default="10.0.0.0/8", description="IPv4 network the client subnets are cut from")
    ecs_prefix: int = Field(default=24, ge=8, le=32, description="source prefix length of each client subnet")
    concurrency: int = Field(default=64, ge=1, le=1024)
    timeout_s: float = Field(default=1.0, gt=0, le=10)
    attempts: int = Field(default=3, ge=1, le=10)

    @field_validator("server")
    @classmethod
    def _server(cls, v: str) -> str:
        parse_server(v)
        return v

    @model_validator(mode="after")
    def _room(self) -> SteerSampleInput:
        ecs_subnets(self.ecs_base, self.ecs_prefix, self.clients)
        return self


class SteerSampleOutput(BaseModel):
    clients: int
    admitted: int
    other: int = Field(description="answered, but not game_ip")
    unanswered: int
    admitted_fraction: float = Field(description="admitted / clients")


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


@action(
    "dns.steer.set",
    timeout=60,
    mutating=True,
    undo="dns.steer.set",
    undo_from_output="undo",
    retry=Retry(
        max_attempts=5, initial_interval=timedelta(seconds=1), max_interval=timedelta(seconds=10)
    ),
)
async def steer_set(inp: SteerSetInput) -> SteerSetOutput:
    """Steer `percent` of players to the game IP on every authoritative server, and verify it took."""
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


@action("dns.steer.get", timeout=30, retry=Retry(max_attempts=5))
async def steer_get(inp: SteerGetInput) -> SteerGetOutput:
    """Read the steering record (percent, IPs, serial) from every authoritative server by AXFR."""
    states = list(await asyncio.gather(*(read_state(s, inp.zone, inp.fqdn, inp.timeout_s) for s in inp.servers)))
    signatures = {(s.present, s.percent, s.game_ip, s.maint_ip, s.ttl, s.foreign_code) for s in states}
    consistent = len(signatures) == 1
    return SteerGetOutput(servers=states, percent=states[0].percent if consistent else None, consistent=consistent)


@action("dns.steer.sample", timeout=120, retry=Retry(max_attempts=3))
async def steer_sample(inp: SteerSampleInput) -> SteerSampleOutput:
    """Measure the admitted share on one server by querying as N distinct ECS client subnets."""
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

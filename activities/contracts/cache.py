"""Contract of the cache warm-up: hot keys read from the database into new cache nodes, at a bounded rate."""

from __future__ import annotations

from typing import Annotated, Literal, cast, get_args
from urllib.parse import parse_qs, urlsplit

from pydantic import Field, field_validator

from activities.contracts.model import ContractModel
from activities.contracts.targets import VaultSecretRef
from activities.registry import declare

__all__ = ["WARM", "SslMode", "WarmInput", "WarmOutput"]

_NODE = r"^[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}$"

# libpq's modes without `allow` and `prefer`: both fall back to plaintext, and neither checks a certificate.
SslMode = Literal["verify-full", "verify-ca", "require", "disable"]


class WarmInput(ContractModel):
    dsn: str = Field(min_length=1, max_length=500, description=(
        "PostgreSQL DSN without a password, e.g. postgresql://game@10.0.0.9:5432/game; its sslmode is "
        "verify-full unless it says verify-ca, require or disable (?sslmode=disable), and sslrootcert names the "
        "CA file (else $PGSSLROOTCERT or ~/.postgresql/root.crt)"))
    password: VaultSecretRef | None = Field(default=None, description="the database password, read inside the activity")
    query: str = Field(min_length=1, max_length=4000, description=(
        "SELECT returning columns `key` and `value` (text), hottest first; an optional `shard` column is what "
        "placement hashes (default: the key)"))
    nodes: Annotated[list[Annotated[str, Field(pattern=_NODE)]], Field(min_length=1, max_length=64)] = Field(
        description="the cache nodes, host:port, in the order clients place keys over them")
    placement: Literal["crc32", "all"] = Field(
        default="crc32", description="crc32: each key on nodes[crc32(shard) % len(nodes)], as the edge places "
                                     "them; all: every key on every node")
    rate: float = Field(default=500, gt=0, le=100_000, description="at most this many keys written a second")
    max_keys: int = Field(default=10_000, ge=1, le=1_000_000, description="at most this many rows read")
    ttl_seconds: int | None = Field(default=None, ge=1, description="expiry of each key written (none: no expiry)")
    batch: int = Field(default=100, ge=1, le=10_000, description="keys per pipelined write")

    @field_validator("dsn")
    @classmethod
    def _dsn(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ValueError("dsn must be a postgresql:// URL")
        modes = parse_qs(parts.query, keep_blank_values=True).get("sslmode", [])
        if len(modes) > 1 or (modes and modes[0] not in get_args(SslMode)):
            raise ValueError(f"dsn's sslmode {'&'.join(modes)!r}: say verify-full (the default), verify-ca, require "
                             "or disable; prefer and allow fall back to plaintext, unchecked")
        return value

    @property
    def sslmode(self) -> SslMode:
        """The DSN's sslmode; a DSN that says none gets verify-full, a certificate checked against the host."""
        return cast("SslMode", parse_qs(urlsplit(self.dsn).query).get("sslmode", ["verify-full"])[0])

    @field_validator("query")
    @classmethod
    def _select(cls, value: str) -> str:
        if not value.lstrip().lower().startswith(("select", "with")):
            raise ValueError("query must be a SELECT (or WITH ... SELECT)")
        return value


class WarmOutput(ContractModel):
    keys_read: int = Field(description="rows the query returned, up to max_keys")
    written: int = Field(description="keys set by this warm-up")
    already_present: int = Field(description="keys a node already held: left as they were")
    per_node: dict[str, int] = Field(description="keys written to each node")
    seconds: float = Field(description="the warm-up's wall time")


WARM = declare(
    "cache.warm", WarmInput, WarmOutput, timeout=600, heartbeat=30, mutating=True,
    doc="""Read the hot keys from the database into the cache nodes before players arrive, at most `rate` keys a second.

    The query runs in a read-only transaction and returns `key` and `value` columns, hottest first; at most
    `max_keys` rows are read. Each key is set only where absent (SET NX), so a warm-up never overwrites a value
    the application wrote meanwhile, and running it again writes nothing new: it is idempotent. The activity
    heartbeats its progress and a retry resumes after the last batch written. A cache that a later step
    flushes is not warmed again: run the action again.

    The connection's TLS is what the DSN's sslmode says, verify-full when it says nothing: a certificate
    checked against the host, never a silent fallback to plaintext (libpq's prefer and allow are refused).""",
)

"""Contracts of the Consul KV actions: set or delete a key, delete a prefix and put it back."""

from __future__ import annotations

import base64
from typing import Literal

from pydantic import Field, field_validator, model_validator

from activities._fields import kv_key
from activities.contracts.model import ContractModel
from activities.contracts.targets import ConsulTarget
from activities.registry import declare

__all__ = [
    "ABSENT",
    "KV_DELETE_PREFIX",
    "KV_RESTORE",
    "KV_SET",
    "Absent",
    "KvDeletePrefixInput",
    "KvDeletePrefixOutput",
    "KvEntry",
    "KvRestoreInput",
    "KvRestoreOutput",
    "KvSetInput",
    "KvSetOutput",
]


class KvEntry(ContractModel):
    """One key exactly as stored: value as base64 (None = empty/null) and flags."""

    key: str
    value_base64: str | None = None
    flags: int = 0

    def raw(self) -> bytes | None:
        return base64.b64decode(self.value_base64) if self.value_base64 is not None else None


class Absent:
    """Desired state: the key does not exist."""


ABSENT = Absent()


class KvSetInput(ContractModel):
    """Set a key (text or base64 bytes) or delete it; expect_index refuses to clobber a newer write."""

    consul: ConsulTarget
    key: str
    value: str | None = None
    value_base64: str | None = None
    delete: bool = Field(default=False, description="make the key absent instead")
    flags: int = Field(default=0, ge=0)
    expect_index: int | None = Field(default=None, ge=0, description="only act if the key's ModifyIndex is this "
                                     "(0 = only if absent)")

    @field_validator("key")
    @classmethod
    def _key(cls, key: str) -> str:
        return kv_key(key)

    @model_validator(mode="after")
    def _one_value(self) -> KvSetInput:
        given = (self.value is not None) + (self.value_base64 is not None)
        if self.delete and given:
            raise ValueError("delete takes no value")
        if not self.delete and given != 1:
            raise ValueError("give exactly one of value or value_base64 (or delete: true)")
        if self.value_base64 is not None:
            try:
                base64.b64decode(self.value_base64, validate=True)
            except ValueError:
                raise ValueError("value_base64 is not valid base64") from None
        return self

    def desired(self) -> bytes | Absent:
        if self.delete:
            return ABSENT
        if self.value_base64 is not None:
            return base64.b64decode(self.value_base64)
        return (self.value or "").encode()


class KvSetOutput(ContractModel):
    key: str
    changed: bool
    previous: KvEntry | None = Field(description="the key before (None = it did not exist)")
    previous_value: str | None = Field(description="previous value as text, for humans")
    modify_index: int
    undo: KvSetInput


class KvRestoreInput(ContractModel):
    consul: ConsulTarget
    entries: list[KvEntry] = Field(max_length=100_000)
    on_conflict: Literal["fail", "skip", "overwrite"] = Field(
        default="fail", description="a key that exists again with another value: fail before writing anything, "
                                    "leave it, or overwrite it")


class KvRestoreOutput(ContractModel):
    restored: list[str]
    unchanged: list[str]
    conflicts: list[str]


class KvDeletePrefixInput(ContractModel):
    consul: ConsulTarget
    prefix: str = Field(description="e.g. cache/scheduling/ (the empty prefix and '/' are refused)")
    max_keys: int = Field(default=10_000, ge=1, le=100_000, description="refuse (change nothing) above this")
    max_bytes: int = Field(default=1_000_000, ge=1, description="refuse above this many value bytes: the "
                           "deleted values travel in the output, and so in workflow history")

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, prefix: str) -> str:
        if prefix.strip("/") == "":
            raise ValueError("refusing to delete the whole KV store; give a real prefix")
        return kv_key(prefix)


class KvDeletePrefixOutput(ContractModel):
    prefix: str
    deleted: list[KvEntry]
    count: int
    undo: KvRestoreInput


KV_SET = declare(
    "consul.kv.set", KvSetInput, KvSetOutput, timeout=60, mutating=True, undo="consul.kv.set", undo_from_output="undo",
    doc="""Set (or delete) one KV key with check-and-set; the output holds the previous value for undo.""",
)


KV_RESTORE = declare(
    "consul.kv.restore", KvRestoreInput, KvRestoreOutput, timeout=1800, heartbeat=60, mutating=True,
    doc="""Put recorded keys back exactly (value and flags); the undo of consul.kv.delete_prefix.""",
)


KV_DELETE_PREFIX = declare(
    "consul.kv.delete_prefix", KvDeletePrefixInput, KvDeletePrefixOutput, timeout=1800, heartbeat=60, mutating=True, undo="consul.kv.restore", undo_from_output="undo",
    doc="""Delete every key under a prefix, recording each (value, flags) so consul.kv.restore can put them back.

    Keys go one by one with check-and-set, so a key rewritten mid-way is re-read and its newest
    value is what gets recorded. A retried attempt resumes from the heartbeat's record of what
    it already deleted.
    """,
)

"""Sealed plans: what a run hands on (its continuation, a fan-out batch) is the controller's own, and checked.

A run's first input is a request the worker resolves against its catalog. Everything a run carries forward
afterwards (the plan and its progress into a continue-as-new, a fan-out batch into a child) is sealed by a
worker: an HMAC, with a key only workers hold (runtime/sealing.py), over the digest of the carried input and
the place it may arrive at (the workflow id and the run that handed it on). The receiving run verifies the
seal before its first command, so a client that starts a workflow with an input of its own making, or replays
a sealed input into another run, executes nothing.

This module holds what both sides share (models, digests, places) and imports no SDK, so the CLI's plans load
it cheaply; the calls a workflow makes are in workflows/sealing.py, the keys in runtime/sealing.py.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, Field

__all__ = [
    "SEAL_ACTIVITY",
    "VERIFY_SEAL_ACTIVITY",
    "Seal",
    "SealRequest",
    "carried_digest",
    "continuation_place",
    "fan_out_place",
    "received_digest",
]

SEAL_ACTIVITY = "coldstart.seal"
VERIFY_SEAL_ACTIVITY = "coldstart.verify_seal"


class Seal(BaseModel):
    """A worker's HMAC over a carried input's digest and its place; `key_id` names the key that made it."""

    key_id: str = Field(max_length=64)
    mac: str = Field(pattern=r"^[0-9a-f]{64}$")


class SealRequest(BaseModel):
    """What a local activity seals or verifies: the digest of the carried input and where it may arrive."""

    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    place: str = Field(max_length=1_000)
    seal: Seal | None = None


def carried_digest(model: BaseModel) -> str:
    """sha256 of the input as the receiving run will see it: its JSON after one round trip through the
    model, which is what Temporal delivers (the receiver digests what it parsed, the sender what it sends)."""
    canonical = type(model).model_validate_json(model.model_dump_json()).model_dump_json()
    return hashlib.sha256(canonical.encode()).hexdigest()


def received_digest(model: BaseModel) -> str:
    """sha256 of an input as it arrived (already parsed from its payload)."""
    return hashlib.sha256(model.model_dump_json().encode()).hexdigest()


def continuation_place(workflow_id: str, handed_on_by: str) -> str:
    """Where a continuation may arrive: the same workflow, continued from the run that sealed it."""
    return f"continue:{workflow_id}:{handed_on_by}"


def fan_out_place(child_id: str, parent_workflow_id: str, parent_run_id: str) -> str:
    """Where a fan-out batch may arrive: that child id, started by that parent run."""
    return f"fan-out:{child_id}:{parent_workflow_id}:{parent_run_id}"



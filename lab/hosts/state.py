"""The lab's state file: what was (about to be) created, so destroy works after a crash."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, Field

__all__ = ["DaemonRecord", "LabState", "forget_state", "load_state", "save_state", "state_path", "updating_state"]

STATE_FILE = "lab.json"


class DaemonRecord(BaseModel):
    """A process started in a host; starttime guards against killing a recycled PID."""

    host: str
    name: str
    pid: int
    starttime: float  # psutil create_time: seconds since the epoch
    argv: list[str]
    log: str


class LabState(BaseModel):
    """Resources are recorded *before* they are created; destroy tolerates missing ones."""

    bridge: str | None = None
    netns: list[str] = Field(default_factory=list)
    veths: list[str] = Field(default_factory=list)
    forward_chain: str | None = None
    daemons: dict[str, DaemonRecord] = Field(default_factory=dict)
    created_privsep_dir: bool = False

    def remember(self, field: str, value: str) -> None:
        items = getattr(self, field)
        if value not in items:
            items.append(value)


def state_path(state_dir: Path) -> Path:
    return Path(state_dir) / STATE_FILE


def load_state(state_dir: Path) -> LabState:
    path = state_path(state_dir)
    if not path.exists():
        return LabState()
    try:
        return LabState.model_validate_json(path.read_text())
    except ValueError:
        # A half-written or foreign file must not stop a cleanup; the prefix sweep still runs.
        return LabState()


def save_state(state_dir: Path, state: LabState) -> None:
    path = state_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # two writers never share a half-written file
    tmp.write_text(json.dumps(state.model_dump(), indent=2))
    os.replace(tmp, path)  # atomic: a crash leaves the old or the new file, never half of one


def _lock_path(state_dir: Path) -> Path:
    return Path(state_dir) / (STATE_FILE + ".lock")


def forget_state(state_dir: Path) -> None:
    """The lab is gone: its state file and the lock beside it."""
    state_path(state_dir).unlink(missing_ok=True)
    _lock_path(state_dir).unlink(missing_ok=True)


@contextmanager
def updating_state(state_dir: Path) -> Iterator[LabState]:
    """Load, let the caller change, save: under a lock, so two restarts at once never lose each other's record."""
    lock = _lock_path(state_dir)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        state = load_state(state_dir)
        yield state
        save_state(state_dir, state)

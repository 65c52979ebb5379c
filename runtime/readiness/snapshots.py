"""The newest Consul snapshot: younger than the target's objective, matching its SHA256SUMS, decoding."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from activities.consul.archive import ArchiveError, read_meta, read_snapshot, taken_at
from activities.retry import format_duration
from runtime.readiness.model import Verdict, not_ready, ready

__all__ = ["newest_snapshot", "snapshot_verdict"]


def newest_snapshot(store: Path, pattern: str) -> tuple[datetime, Path] | None:
    """(when it was taken, path) of the newest readable snapshot in the store."""
    best: tuple[datetime, Path] | None = None
    for path in store.glob(pattern):
        try:
            when = taken_at(read_meta(path))
        except ArchiveError:
            continue  # an unreadable file is no candidate; a readable newest one decides
        if best is None or when > best[0]:
            best = (when, path)
    return best


def _check(store: Path, pattern: str, objective: timedelta | None, now: datetime) -> Verdict:
    if not store.is_dir():
        return not_ready(f"the snapshot store {store} is not a directory")
    newest = newest_snapshot(store, pattern)
    if newest is None:
        return not_ready(f"no readable snapshot in {store} ({pattern})")
    when, path = newest
    age = now - when
    if objective is not None and age > objective:
        return not_ready(f"the newest snapshot {path.name} is {format_duration(age)} old, older than the "
                         f"objective {format_duration(objective)}")
    started = time.monotonic()
    try:
        info = read_snapshot(path)
    except ArchiveError as exc:
        return not_ready(f"the newest snapshot does not verify or decode: {exc}")
    against = f"within the objective {format_duration(objective)}" if objective else "no objective set (facts.rpo)"
    return ready(f"{path.name} is {format_duration(age)} old ({against}); SHA256SUMS verified and {len(info.kv)} "
                 f"keys decoded in {format_duration(time.monotonic() - started)}")


async def snapshot_verdict(store: str, *, pattern: str = "*.snap", objective: timedelta | None = None,
                           now: datetime | None = None) -> Verdict:
    """Streams the archive (large snapshots stay off the heap) on a thread."""
    return await asyncio.to_thread(_check, Path(store), pattern, objective, now or datetime.now(UTC))

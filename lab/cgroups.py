"""CPU cgroups for lab processes: throttling with CFS bandwidth control (cgroup v2 `cpu.max`, or v1 `cpu.cfs_*`),
and a weight (v2 `cpu.weight`, v1 `cpu.shares`)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CpuStat", "cgroup_root", "cpu_stat", "groups", "pids", "release", "throttle", "vacate", "weigh"]

_ROOT = Path("/sys/fs/cgroup")
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,60}$")


@dataclass(frozen=True)
class CpuStat:
    nr_periods: int
    nr_throttled: int
    throttled_seconds: float

    @property
    def throttled_ratio(self) -> float:
        return self.nr_throttled / self.nr_periods if self.nr_periods else 0.0


def _v2() -> bool:
    try:
        return "cpu" in (_ROOT / "cgroup.controllers").read_text().split()
    except OSError:
        return False


def cgroup_root() -> Path:
    """Where CPU cgroups live: the unified hierarchy when it has the cpu controller, else v1's cpu hierarchy."""
    if _v2():
        return _ROOT
    v1 = _ROOT / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists():
        return v1
    raise OSError("no cgroup CPU controller: neither cgroup v2 with cpu nor v1's /sys/fs/cgroup/cpu")


def _group(name: str) -> Path:
    if not _NAME.match(name):
        raise ValueError(f"cgroup name {name!r} must match {_NAME.pattern}")
    return cgroup_root() / name


def _made(name: str) -> Path:
    """Cgroup `name`, created if missing (on v2 with the cpu controller enabled for the root's children)."""
    group = _group(name)
    if _v2():
        subtree = _ROOT / "cgroup.subtree_control"
        if "cpu" not in subtree.read_text().split():
            subtree.write_text("+cpu")
    group.mkdir(exist_ok=True)
    return group


def _place(group: Path, pids: list[int]) -> None:
    for pid in pids:
        (group / "cgroup.procs").write_text(str(pid))


def throttle(name: str, pids: list[int], cpu_fraction: float | None, period_us: int = 100_000) -> Path:
    """Put `pids` (whole processes, every thread) in cgroup `name`, limited to `cpu_fraction` of one
    CPU (None: no limit, so its cpu.stat is there to read before any fault)."""
    if cpu_fraction is not None and not 0.001 <= cpu_fraction <= 64:
        raise ValueError(f"cpu_fraction {cpu_fraction} out of range")
    group = _made(name)
    quota = None if cpu_fraction is None else max(1000, int(period_us * cpu_fraction))
    if _v2():
        (group / "cpu.max").write_text(f"{quota or 'max'} {period_us}")
    else:
        (group / "cpu.cfs_period_us").write_text(str(period_us))
        (group / "cpu.cfs_quota_us").write_text(str(quota or -1))
    _place(group, pids)
    return group


def weigh(name: str, pids: list[int], weight: int, rt_runtime_us: int = 200_000) -> Path:
    """Put `pids` (whole processes, every thread, and the children they start from then on) in cgroup `name`
    with CPU weight `weight` against the default 100 of every other group and session (systemd's CPUWeight:
    v2 `cpu.weight`, v1 `cpu.shares` = weight x 10.24). On v1 with real-time group scheduling the group also
    gets `rt_runtime_us` of each second for real-time tasks (a new group gets none, and a process in it could
    not take a real-time policy)."""
    if not 1 <= weight <= 10_000:
        raise ValueError(f"CPU weight {weight} out of range 1..10000")
    group = _made(name)
    if _v2():
        (group / "cpu.weight").write_text(str(weight))
    else:
        (group / "cpu.shares").write_text(str(max(2, round(weight * 10.24))))
        if (group / "cpu.rt_runtime_us").exists():
            (group / "cpu.rt_runtime_us").write_text(str(rt_runtime_us))
    _place(group, pids)
    return group


def pids(name: str) -> list[int]:
    try:
        return [int(p) for p in (_group(name) / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def vacate(name: str) -> list[int]:
    """Move every process out of cgroup `name` (back to the root), keeping the group; returns the moved PIDs."""
    group = _group(name)
    if not group.exists():
        return []
    moved = [int(p) for p in (group / "cgroup.procs").read_text().split()]
    for pid in moved:
        try:
            (group.parent / "cgroup.procs").write_text(str(pid))
        except ProcessLookupError:  # one that ended meanwhile
            pass
    return moved


def release(name: str) -> list[int]:
    """Move every process out of cgroup `name` (back to the root) and remove it; returns the moved PIDs."""
    moved = vacate(name)
    group = _group(name)
    if group.exists():
        os.rmdir(group)
    return moved


def cpu_stat(name: str) -> CpuStat | None:
    try:
        raw = (_group(name) / "cpu.stat").read_text()
    except OSError:
        return None
    fields = dict(line.split() for line in raw.splitlines() if len(line.split()) == 2)
    # v2 reports throttled_usec, v1 throttled_time in nanoseconds.
    seconds = int(fields.get("throttled_usec", 0)) / 1e6 or int(fields.get("throttled_time", 0)) / 1e9
    return CpuStat(int(fields.get("nr_periods", 0)), int(fields.get("nr_throttled", 0)), seconds)


def groups(prefix: str) -> list[str]:
    """The cgroups whose names start with `prefix` (a lab's, so `down` can remove them after a crash)."""
    try:
        root = cgroup_root()
    except OSError:
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith(prefix))

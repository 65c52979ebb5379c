"""CPU seconds of the bench process and each process it started, by role: where a benchmark's time went."""

from __future__ import annotations

import psutil

__all__ = ["cpu_seconds"]


def cpu_seconds(roles: dict[str, str], me: str, other: str = "other") -> dict[str, float]:
    """Totals so far: this process as `me`, each child as the role whose needle its command line
    contains (`roles`: needle -> role, first match wins), else `other`."""
    def role(proc: psutil.Process) -> str:
        args = " ".join(proc.cmdline())
        return next((name for needle, name in roles.items() if needle in args), other)

    totals: dict[str, float] = {}
    current = psutil.Process()
    for proc in [current, *current.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            name = me if proc.pid == current.pid else role(proc)
        except psutil.Error:
            continue
        totals[name] = totals.get(name, 0.0) + times.user + times.system
    return totals

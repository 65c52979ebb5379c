"""The soak's figures from run histories: step latency percentiles per phase, and how long runs stood still around each fault."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["Fault", "RunTrace", "Stall", "baseline_gap", "fault_schedule", "latencies_between", "percentile",
           "stall_around"]


@dataclass(frozen=True)
class Fault:
    """A fault as it happened, in wall-clock seconds (the clock history events are stamped with): `start` when
    it hit, `end` when it was cleared (equal for an instant fault such as a SIGKILL)."""

    name: str
    start: float
    end: float
    detail: str = ""


@dataclass
class RunTrace:
    """One run's history, reduced: every event's time, and the (scheduled, closed) times of its actions'
    activities and of its gates' reads. `open_until`: a run still open when the history was read stood
    still at least until then."""

    workflow_id: str
    run_id: str
    events: list[float]
    activities: list[tuple[float, float]] = field(default_factory=list)
    open_until: float | None = None
    reads: list[tuple[float, float]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # each event's type (and activity), as events are listed

    def longest_gap(self, start: float, end: float) -> tuple[float, str, float, str] | None:
        """The longest stretch without an event across [start, end]: (time, event) before and after it
        (after it: "still open" for a run that was), for telling what a run waited on."""
        named = sorted(zip(self.events, self.names or [""] * len(self.events), strict=True))
        if self.open_until is not None and (not named or self.open_until > named[-1][0]):
            named.append((self.open_until, "still open"))
        gaps = [(b[0] - a[0], a, b) for a, b in itertools.pairwise(named) if a[0] <= end and b[0] >= start]
        if not gaps:
            return None
        _, before, after = max(gaps)
        return before[0], before[1], after[0], after[1]

    def times(self) -> list[float]:
        """The event times, with the reading's time last for an open run (its last stretch counts too)."""
        times = sorted(self.events)
        if self.open_until is not None and (not times or self.open_until > times[-1]):
            times.append(self.open_until)
        return times


@dataclass(frozen=True)
class Stall:
    """Around one fault: the longest a run went without a history event across the fault's window
    (`still_s`), and the longest a run alive at the fault's end waited for its first event after it
    (`recovery_s`), with the run each figure came from and how many runs were alive."""

    still_s: float
    still_run: str
    recovery_s: float
    recovery_run: str
    runs: int


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (no interpolation: always a latency that happened); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def latencies_between(traces: Iterable[RunTrace], start: float, end: float, *, reads: bool = False) -> list[float]:
    """Latencies (scheduled to closed) of the actions' activities (with reads=True: the gates' reads)
    scheduled in [start, end)."""
    return [closed - scheduled for trace in traces for scheduled, closed in (trace.reads if reads else trace.activities)
            if start <= scheduled < end]


def stall_around(traces: Iterable[RunTrace], fault: Fault) -> Stall:
    """The worst standing still of the runs alive during `fault` (a run with an event at or before its end
    and one at or after its start, or still open then)."""
    still, still_run, recovery, recovery_run, runs = 0.0, "", 0.0, "", 0
    for trace in traces:
        times = trace.times()
        if not times or times[0] > fault.end or times[-1] < fault.start:
            continue
        runs += 1
        for before, after in itertools.pairwise(times):
            if before <= fault.end and after >= fault.start and after - before > still:
                still, still_run = after - before, trace.workflow_id
        following = next((t for t in times if t > fault.end), None)
        if following is not None and times[0] <= fault.end and following - fault.end > recovery:
            recovery, recovery_run = following - fault.end, trace.workflow_id
    return Stall(still, still_run, recovery, recovery_run, runs)


def quiet_instants(began: float, baseline: float, *, warm_up: float = 60.0, look_ahead: float = 30.0,
                   every: float = 10.0) -> list[float]:
    """Instants of the quiet baseline to read the recovery figure at, as if a fault had cleared there: after
    the warm-up (the first runs starting), and far enough before the first fault that the wait after one is
    the baseline's own."""
    instants, at = [], began + warm_up
    while at <= began + baseline - look_ahead:
        instants.append(at)
        at += every
    return instants


def quiet_recoveries(traces: Sequence[RunTrace], instants: Iterable[float]) -> list[Stall]:
    """The control: stall_around at each quiet instant (a fault of no length, nothing failing). A run waits
    this long for its next event with no fault at all (a gate read queued behind other runs' steps, a
    timer), so a fault's recovery figure is read against it."""
    return [stall_around(traces, Fault("none", at, at)) for at in instants]


def baseline_gap(traces: Iterable[RunTrace], start: float, end: float) -> float:
    """The longest gap between two events of one run, both inside [start, end]: how long a run stands
    still with no fault (waits, gate intervals, approvals), to read the stalls against."""
    worst = 0.0
    for trace in traces:
        inside = [t for t in trace.times() if start <= t <= end]
        worst = max([worst, *(b - a for a, b in itertools.pairwise(inside))])
    return worst


def fault_schedule(seconds: float, baseline: float, *, kill_every: float = 60.0,
                   once: Sequence[str] = ("temporal-restart", "postgres-restart", "prometheus-down", "dns-down"),
                   ) -> list[tuple[float, str]]:
    """(offset in seconds, fault) sorted by offset: a worker SIGKILL every `kill_every` after the quiet
    baseline, and each of `once` once, a quarter of the way between two kills (a 30 s outage then clears a
    quarter before the next kill), spread evenly over the faulted phase so no two faults share a window."""
    if baseline >= seconds:
        raise ValueError(f"the baseline ({baseline:g} s) leaves no time for faults in a {seconds:g} s soak")
    schedule: list[tuple[float, str]] = []
    at = baseline
    while at < seconds:
        schedule.append((at, "worker-kill"))
        at += kill_every
    slots = [baseline + kill_every * (i + 0.25) for i in range(int((seconds - baseline) // kill_every))]
    if len(slots) < len(once):
        raise ValueError(f"a {seconds:g} s soak with a {baseline:g} s baseline has room for {len(slots)} of the "
                         f"{len(once)} one-off faults; give it at least "
                         f"{baseline + kill_every * len(once):g} s")
    if once:
        step = len(slots) / len(once)
        schedule += [(slots[int(i * step)], name) for i, name in enumerate(once)]
    return sorted(schedule)

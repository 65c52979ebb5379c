"""The adaptive ramp's next step from the gates' headroom: additive increase while it holds, multiplicative back-off near a threshold."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta

from workflows.contract import GateReading, RampDecision
from workflows.spec import AdaptiveSpec

__all__ = ["RampDecision", "decide", "headroom"]


def _room_and_trend(readings: Sequence[GateReading]) -> tuple[float, float] | None:
    """A gate's room before its threshold (the last value's, as a share of the threshold) and how far its
    readings moved toward it from the first (negative: away). None without a numeric reading."""
    values = [(r.value, r.comparator, r.threshold) for r in readings if r.value is not None and r.error is None
              and r.comparator is not None and r.threshold is not None]
    if not values:
        return None
    last, comparator, threshold = values[-1]
    first = values[0][0]
    scale = abs(threshold) or 1.0
    # Room on the passing side: below a `<` threshold, above a `>` one.
    room = (threshold - last) / scale if comparator in ("<", "<=") else (last - threshold) / scale
    trend = (last - first) / scale if comparator in ("<", "<=") else (first - last) / scale
    return room, trend


def headroom(readings: Sequence[GateReading], lookahead: float = 1.0) -> float | None:
    """A gate's room before its threshold, as a share of the threshold, from its readings at one percentage:
    the last value's, or less if the readings trend toward the threshold (their move projected `lookahead`
    times ahead). None without a numeric reading."""
    return _headroom_of(_room_and_trend(readings), lookahead)


def _headroom_of(measured: tuple[float, float] | None, lookahead: float) -> float | None:
    return None if measured is None else measured[0] - lookahead * max(0.0, measured[1])


def decide(spec: AdaptiveSpec, *, at: int, stop: int, step: int, readings: Mapping[str, Sequence[GateReading]],
           took: timedelta, may_hold: bool = False) -> RampDecision:
    """The next percentage after the gates passed at `at`, having taken `took` since it was set. With `may_hold`,
    a gate near its threshold (headroom under `spec.headroom`) and still moving toward it keeps the ramp at `at`
    (next == at): a cohort just admitted, or a cache just emptied, is still pushing that gate. Each gate's move
    over the readings counts `spec.lookahead` times."""
    measured = {name: _room_and_trend(values) for name, values in readings.items()}
    rooms = {name: _headroom_of(m, spec.lookahead) for name, m in measured.items()}
    known = {name: room for name, room in rooms.items() if room is not None}
    worst = min(known, key=known.__getitem__, default=None)
    least = known[worst] if worst is not None else None
    worsening = worst is not None and (measured[worst] or (0.0, 0.0))[1] > 0
    if least is not None and least < spec.headroom and worsening and may_hold and at < stop:
        size = max(spec.min_step, int(step * spec.backoff))
        return RampDecision(at=at, next=at, step=size, headroom=rooms,
                            reason=f"headroom {least:.2f} under {spec.headroom:g} and {worst} still moving toward "
                                   f"its threshold: hold at {at}%, read again; step {step} -> {size} (x{spec.backoff:g})")
    if least is None:
        size, reason = step, "no gate gave a value to measure headroom by: same step"
    elif least < spec.headroom:
        size = max(spec.min_step, int(step * spec.backoff))
        reason = f"headroom {least:.2f} under {spec.headroom:g}: step {step} -> {size} (x{spec.backoff:g})"
    elif least >= 2 * spec.headroom:
        size = min(spec.max_step, step + spec.increase)
        reason = f"headroom {least:.2f} at least {2 * spec.headroom:g}: step {step} -> {size} (+{spec.increase})"
    else:
        size, reason = step, f"headroom {least:.2f}: same step {step}"
    if spec.max_rate is not None and took.total_seconds() > 0:
        # A boot-rate limit: players admitted no faster than max_rate points a minute, over the last step's time.
        allowed = max(spec.min_step, int(spec.max_rate * took.total_seconds() / 60))
        if size > allowed:
            size, reason = allowed, reason + f"; boot rate {spec.max_rate:g}%/min caps it at {allowed}"
    return RampDecision(at=at, next=min(stop, at + size), step=size, headroom=rooms, reason=reason)

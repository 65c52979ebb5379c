"""The one retry shape: what an action declares and a runbook step overrides (workflows.calls hands it to Temporal)."""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

__all__ = ["Duration", "Retry", "format_duration", "parse_duration"]

_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m(?!s))?\s*(?:(\d+(?:\.\d+)?)s)?\s*(?:(\d+(?:\.\d+)?)ms)?\s*$")


def parse_duration(value: Any) -> Any:
    """Accept 90, "90s", "10m", "1h30m", "250ms"; leave anything else (ISO 8601, timedelta) to pydantic."""
    if isinstance(value, bool):
        # pydantic reports a ValueError as the field's error; a TypeError would escape validation.
        raise ValueError("a duration is a number of seconds or a string such as 30s, 10m, 1h")  # noqa: TRY004
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError("a duration is a finite number of seconds")
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return _timedelta(seconds=value)
    if isinstance(value, str) and not value.startswith(("P", "-P")):
        match = _DURATION.match(value)
        if not match or not any(match.groups()):
            raise ValueError(f"{value!r} is not a duration (use e.g. 30s, 10m, 1h30m, 250ms)")
        hours, minutes, seconds, millis = (float(g) if g else 0.0 for g in match.groups())
        return _timedelta(hours=hours, minutes=minutes, seconds=seconds, milliseconds=millis)
    return value


def _timedelta(**parts: float) -> timedelta:
    try:
        return timedelta(**parts)
    except OverflowError:
        # Past timedelta's 999999999 days: a ValueError, so pydantic reports it at the field.
        raise ValueError("a duration is too long (at most 999999999 days)") from None


def format_duration(value: timedelta | float) -> str:
    """A duration as a runbook writes it, for every human view: 2s, 0.25s and 90s under two minutes (seconds
    alone), 2m30s and 1h30m above (whole seconds); parse_duration reads it back."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    if seconds < 120:
        return f"{sign}{round(seconds, 3):g}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return sign + "".join(f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n)


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0, "description": "seconds"},
                {"type": "string", "pattern": r"^(\d+(\.\d+)?h)?(\d+(\.\d+)?m)?(\d+(\.\d+)?s)?(\d+ms)?$|^P"},
            ]
        }
    ),
]


class Retry(BaseModel):
    """Temporal's retry policy in runbook terms; the defaults are every action's unless it says otherwise.

    A step's `retry:` replaces its action's policy (fields left out take these defaults); a gate,
    approval or other step with `on_failure: retry` is rerun under its own `retry:` or these defaults.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    max_attempts: Annotated[int, Field(ge=1, le=100)] = 5
    # `interval` is what runbooks wrote before the shapes were merged.
    initial_interval: Duration = Field(
        default=timedelta(seconds=1), validation_alias=AliasChoices("initial_interval", "interval")
    )
    backoff: Annotated[float, Field(ge=1.0, le=10.0)] = 2.0
    max_interval: Duration = timedelta(seconds=30)

    def delay(self, attempt: int) -> timedelta:
        """How long to wait before rerunning after `attempt` failed attempts (1-based)."""
        return min(self.initial_interval * (self.backoff ** (attempt - 1)), self.max_interval)

"""Activity failures of bounded size: a huge message or details is cut, with a note of how much, so the history keeps the reason."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

__all__ = ["DETAILS_BYTES", "MESSAGE_CHARS", "FailureBoundsInterceptor", "bound_failure", "bounded"]

# Temporal replaces a failure over 2 MB with "Failure exceeds size limit.": an operator would lose the reason.
MESSAGE_CHARS = 4000
DETAILS_BYTES = 64 * 1024
# Causes kept under the top failure: each carries its own message (and stack trace) into the history.
_CAUSES_KEPT = 3


def bounded(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and how many more were cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters cut]"


def _details_size(details: Any) -> int:
    try:
        return len(json.dumps(details, default=str))
    except (TypeError, ValueError):
        return len(str(details))


def _too_large(exc: BaseException) -> bool:
    current: BaseException | None = exc
    for _ in range(_CAUSES_KEPT + 1):
        if current is None:
            return False
        if len(str(current)) > MESSAGE_CHARS:
            return True
        if isinstance(current, ApplicationError) and _details_size(current.details) > DETAILS_BYTES:
            return True
        current = current.__cause__ or current.__context__
    return False


def bound_failure(exc: BaseException) -> ApplicationError:
    """An ApplicationError saying what `exc` says, within the bounds: its type, retryability and delay kept,
    its message and its causes' messages cut, its details dropped (with a note) when over DETAILS_BYTES."""
    causes: list[str] = []
    current = exc.__cause__ or exc.__context__
    while current is not None and len(causes) < _CAUSES_KEPT:
        causes.append(bounded(f"{type(current).__name__}: {current}", MESSAGE_CHARS // 4))
        current = current.__cause__ or current.__context__
    message = bounded(str(exc), MESSAGE_CHARS) + "".join(f"; caused by {cause}" for cause in causes)
    if isinstance(exc, ApplicationError):
        details: tuple[Any, ...] = tuple(exc.details)
        size = _details_size(details)
        if size > DETAILS_BYTES:
            details = (f"details cut: {size} bytes, over the {DETAILS_BYTES} kept",)
        return ApplicationError(message, *details, type=exc.type, non_retryable=exc.non_retryable,
                                next_retry_delay=exc.next_retry_delay, category=exc.category)
    return ApplicationError(message, type=type(exc).__name__)


class FailureBoundsInterceptor(Interceptor):
    """Worker interceptor: every activity's failure within the bounds above."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _BoundsInbound(next)


class _BoundsInbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except (CancelledError, asyncio.CancelledError):
            raise
        except Exception as exc:
            if not _too_large(exc):
                raise
            raise bound_failure(exc) from None

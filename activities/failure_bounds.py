"""Activity failures of bounded size: a huge message, cause chain or details is cut, with a note of how much, so the history keeps the reason."""

from __future__ import annotations

import asyncio
import json
import traceback
from typing import Any

from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

__all__ = ["DETAILS_BYTES", "FAILURE_BYTES", "MESSAGE_CHARS", "FailureBoundsInterceptor", "bound_failure", "bounded"]

# The server keeps a retried activity's last failure only within 4 KB (limit.mutableStateActivityFailureSize):
# past it the failure reads "Failure exceeds size limit." and the reason is lost. A message, its causes and
# their stack traces over FAILURE_BYTES are rebuilt short.
FAILURE_BYTES = 3000
MESSAGE_CHARS = 1000
_CAUSE_CHARS = 500
_CAUSES_KEPT = 2
# Details are kept whole up to this much when the failure is final (not retried), to 1 KiB when it is retried.
DETAILS_BYTES = 64 * 1024
_RETRIED_DETAILS_BYTES = 1024


def bounded(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and how many more were cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters cut]"


def _json_size(details: Any) -> int:
    try:
        return len(json.dumps(details, default=str))
    except (TypeError, ValueError):
        return len(str(details))


def _chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 20:
        chain.append(current)
        # As Temporal's failure converter: the cause, else the context unless `raise ... from None` hid it.
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return chain


def _encoded_size(exc: BaseException) -> int:
    """About what the failure takes in the history: every message and stack trace of the chain, and the details."""
    size = 0
    for link in _chain(exc):
        size += len(str(link)) + len("".join(traceback.format_tb(link.__traceback__)))
        if isinstance(link, ApplicationError):
            size += _json_size(link.details)
    return size


def _bounded_link(link: BaseException, limit: int) -> ApplicationError:
    message = bounded(str(link), limit)
    if not isinstance(link, ApplicationError):
        return ApplicationError(message, type=type(link).__name__)
    details: tuple[Any, ...] = tuple(link.details)
    size = _json_size(details)
    budget = DETAILS_BYTES if link.non_retryable else _RETRIED_DETAILS_BYTES
    if size > budget:
        details = (f"details cut: {size} bytes, over the {budget} kept",)
    return ApplicationError(message, *details, type=link.type, non_retryable=link.non_retryable,
                            next_retry_delay=link.next_retry_delay, category=link.category)


def bound_failure(exc: BaseException) -> ApplicationError:
    """`exc` and its first causes rebuilt within the bounds: each one's type, retryability and delay kept, its
    message cut, its stack trace dropped, its details dropped (with a note) when over their budget. The chain
    stays a chain, so the workflow still reads the innermost cause's message as the reason."""
    links = _chain(exc)[:1 + _CAUSES_KEPT]
    rebuilt: ApplicationError | None = None
    for link in reversed(links):
        current = _bounded_link(link, MESSAGE_CHARS if link is exc else _CAUSE_CHARS)
        current.__cause__ = rebuilt
        rebuilt = current
    assert rebuilt is not None
    return rebuilt


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
            if _encoded_size(exc) <= FAILURE_BYTES:
                raise
            short = bound_failure(exc)
            raise short from short.__cause__  # the rebuilt chain, not the original one as its context

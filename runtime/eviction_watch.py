"""Notices when the Temporal SDK cannot evict a run from the worker's cache: that run then hangs on this worker."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["CANNOT_EVICT", "EVICTION_LOGGER", "EXIT_STUCK", "EvictionWatch", "watching_evictions"]

EXIT_STUCK = 75  # EX_TEMPFAIL, a worker's exit when a run is stuck in it: started again, it works

# Where temporalio (1.35) says it cannot evict a run. It happens after its deadlock detector interrupts a
# workflow task that ran over 2 s (a CPU-starved worker is enough) in a run with a second task waiting on a
# timer (every RunbookWorkflow: its status view): the eviction leaves tasks it cancelled that never wake, the
# SDK retries it forever, the run's workflow tasks time out on this worker, and the worker cannot shut down.
# Log text is not an API: tests/test_eviction_watch.py reads the installed SDK for it, so an upgrade that rewords
# it fails there by name.
EVICTION_LOGGER = "temporalio.worker._workflow"
CANNOT_EVICT = ("Failed running eviction job", "Timed out running eviction job")


class EvictionWatch(logging.Handler):
    """A log handler that calls `on_stuck(message)` once, the first time the SDK says it cannot evict a run."""

    def __init__(self, on_stuck: Callable[[str], None]) -> None:
        super().__init__(level=logging.ERROR)
        self._on_stuck = on_stuck
        self.stuck: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.stuck is None and message.startswith(CANNOT_EVICT):
            self.stuck = message.split(". ", 1)[0]
            self._on_stuck(self.stuck)


@contextmanager
def watching_evictions(on_stuck: Callable[[str], None]) -> Iterator[EvictionWatch]:
    """An EvictionWatch on the SDK's workflow worker logger while the block runs."""
    logger = logging.getLogger(EVICTION_LOGGER)
    watch = EvictionWatch(on_stuck)
    logger.addHandler(watch)
    try:
        yield watch
    finally:
        logger.removeHandler(watch)

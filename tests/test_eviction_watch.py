"""The eviction watch (runtime/eviction_watch.py): what it reacts to, and that the installed SDK still says it."""

from __future__ import annotations

import importlib
import inspect
import logging

from runtime.eviction_watch import CANNOT_EVICT, EVICTION_LOGGER, watching_evictions


def test_the_installed_sdk_still_logs_what_the_watch_reacts_to_from_the_logger_it_watches():
    """The watch keys on log text, which is not an API: a temporalio upgrade that rewords it fails here, by name,
    rather than as a worker that hangs on a run it cannot evict."""
    module = importlib.import_module(EVICTION_LOGGER)
    source = inspect.getsource(module)
    assert module.logger.name == EVICTION_LOGGER
    for text in CANNOT_EVICT:
        assert f'"{text} for run ID %s' in source, f"temporalio no longer logs {text!r} in {EVICTION_LOGGER}"


def test_the_watch_fires_once_on_the_first_failed_eviction_and_not_on_other_errors():
    seen: list[str] = []
    logger = logging.getLogger(EVICTION_LOGGER)
    with watching_evictions(seen.append) as watch:
        logger.error("Failed activation on workflow %s with ID %s and run ID %s", "W", "w1", "r1")
        assert seen == [] and watch.stuck is None
        logger.error("Failed running eviction job for run ID %s, continually retrying eviction. "
                     "Since eviction could not be processed, this worker may not complete and the slot may "
                     "remain forever used. Cause: %s", "r1", "Eviction processed, but 1 tasks remain")
        logger.error("Timed out running eviction job for run ID %s, continually retrying eviction.", "r2")
    assert seen == ["Failed running eviction job for run ID r1, continually retrying eviction"]
    assert watch.stuck == seen[0]
    logger.error("Failed running eviction job for run ID %s, continually retrying eviction.", "r3")
    assert len(seen) == 1  # the handler is gone after the block

"""structlog set-up: JSON off a TTY, console on one; stdlib and Temporal records share the pipeline, off the hot path, sampled under a flood."""

from __future__ import annotations

import atexit
import copy
import logging
import logging.handlers
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, TextIO

import structlog

from runtime.shedding import LOG_RECORDS_DROPPED, ShedCounter

__all__ = ["LOG_QUEUE_ENV", "LOG_SAMPLE_ENV", "configure_logging", "flush_logging"]

LOG_QUEUE_ENV = "COLDSTART_LOG_QUEUE"  # records held for the writer before new ones are dropped
LOG_SAMPLE_ENV = "COLDSTART_LOG_SAMPLE"  # records of one kind a second kept in full (0: no sampling)
_QUEUE_SIZE = 10_000
# Zap's defaults: the first 100 records of a kind in a second, then every 100th. A loop logging 5,000
# a second took a third of the worker's GIL to time-stamp, copy and render them, and other runs'
# steps waited on it (1.5-2x at p95 in bench/shedding.py), however fast the sink read.
_SAMPLE_FIRST = 100
_SAMPLE_THEREAFTER = 100
_STOP_WAIT = 1.0  # seconds a healthy sink gets to take what is queued at exit; a stuck one is abandoned

_listener: _Listener | None = None


def configure_logging(level: str = "INFO", *, json_output: bool | None = None, stream: TextIO | None = None,
                      queue_size: int | None = None, dropped: ShedCounter = LOG_RECORDS_DROPPED,
                      sample_first: int | None = None, sample_thereafter: int = _SAMPLE_THEREAFTER,
                      clock: Callable[[], float] = time.monotonic) -> None:
    """Route structlog and stdlib logging through one formatter behind a bounded queue.

    Nothing that logs ever waits on the sink: records are handed off in memory and written by a
    background thread. When the queue is full (the sink is slow or has stopped reading: a pipe nobody
    reads, a full disk) new records are dropped and counted in `dropped`
    (coldstart_log_records_dropped_total on the worker's metrics endpoint), as are records the sink
    refuses. A stuck sink never holds up the process's exit either.

    A flood is sampled before it costs anything: of the records with the same logger, level and
    message in one second, the first `sample_first` ($COLDSTART_LOG_SAMPLE, else 100; 0 keeps all)
    are kept, then every `sample_thereafter`-th; the rest are dropped and counted as "sampled".
    """
    global _listener
    out: TextIO = stream or sys.stderr
    if json_output is None:
        json_output = not out.isatty()
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.stdlib.ExtraAdder(),
    ]
    renderer = structlog.processors.JSONRenderer() if json_output else structlog.dev.ConsoleRenderer(colors=False)
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, structlog.processors.format_exc_info, renderer],
    )
    size = queue_size or int(os.environ.get(LOG_QUEUE_ENV) or _QUEUE_SIZE)
    records: queue.Queue = queue.Queue(maxsize=size)
    first = int(os.environ.get(LOG_SAMPLE_ENV) or _SAMPLE_FIRST) if sample_first is None else sample_first
    sampler = _Sampler(first, sample_thereafter, dropped, clock) if first > 0 else None
    if _listener is not None:
        _listener.stop()
    # QueueListener only calls handle() on what it is given: _Sink is no Handler on purpose (see there).
    _listener = _Listener(records, _Sink(out, formatter, dropped))  # pyright: ignore[reportArgumentType]
    _listener.start()
    root = logging.getLogger()
    root.handlers[:] = [_DroppingQueueHandler(records, dropped, sampler)]
    root.setLevel(level)
    # warnings.warn would otherwise write to stderr on the warning thread (the event loop, an activity).
    logging.captureWarnings(True)
    structlog.configure(
        # Tracebacks are rendered here, on the logging thread: the writer thread has no exc_info to read.
        # A record below the level, sampled out or behind a full queue never gets here (_shedding_logger).
        processors=[*shared, structlog.processors.format_exc_info, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=_shedding_logger(records, dropped, sampler),
        cache_logger_on_first_use=True,
    )


class _Sampler:
    """Counts records by kind within the current second (the counts start over each second, so a
    message that varies costs memory for a second at most); says which to keep."""

    def __init__(self, first: int, thereafter: int, dropped: ShedCounter, clock: Callable[[], float]) -> None:
        self._first = first
        self._thereafter = max(1, thereafter)
        self._dropped = dropped
        self._clock = clock
        self._lock = threading.Lock()
        self._second = -1
        self._seen: dict[Hashable, int] = {}

    def keep(self, kind: Hashable) -> bool:
        second = int(self._clock())
        with self._lock:
            if second != self._second:
                self._second, self._seen = second, {}
            seen = self._seen[kind] = self._seen.get(kind, 0) + 1
        if seen <= self._first or (seen - self._first) % self._thereafter == 0:
            return True
        self._dropped.add("sampled")
        return False


def _shedding_logger(records: queue.Queue, dropped: ShedCounter,
                     sampler: _Sampler | None) -> type[structlog.stdlib.BoundLogger]:
    """structlog's stdlib BoundLogger, but a record below the level, beyond the sampler's share or
    logged while the queue is full is dropped (and counted) before anything is built for it: no
    context copy, no processors, no exception.

    Why: under a flood nearly every record is dropped, and a thread logging 5,000 a second held the GIL
    for bursts of milliseconds building records only to drop them, while the event loop waited on it."""
    capacity = records.maxsize

    class SheddingBoundLogger(structlog.stdlib.BoundLogger):
        def _proxy_to_logger(self, method_name: str, event: str | None = None, *event_args: Any, **event_kw: Any) -> Any:
            # structlog.stdlib's own table of level names (public there, though not in its __all__).
            names = structlog.stdlib.NAME_TO_LEVEL  # pyright: ignore[reportPrivateImportUsage]
            level = names.get(method_name, logging.CRITICAL)
            if not self._logger.isEnabledFor(level):
                return None
            # Read without the queue's lock: a record let through by a stale length is still refused by
            # put_nowait (and counted) on the way in.
            if len(records.queue) >= capacity:
                dropped.add("queue_full")
                return None
            if sampler is not None and not sampler.keep((self._logger.name, method_name, str(event))):
                return None
            return super()._proxy_to_logger(method_name, event, *event_args, **event_kw)

    return SheddingBoundLogger


class _DroppingQueueHandler(logging.handlers.QueueHandler):
    def __init__(self, records: queue.Queue, dropped: ShedCounter, sampler: _Sampler | None) -> None:
        super().__init__(records)
        self._records = records
        self._dropped = dropped
        self._sampler = sampler

    def emit(self, record: logging.LogRecord) -> None:
        # stdlib and Temporal records: sampled (structlog's were, in its processors) and shed before the copy.
        if self._sampler and not isinstance(record.msg, dict) and not self._sampler.keep(
                (record.name, record.levelno, str(record.msg))):
            return
        if self._records.full():
            self._dropped.add("queue_full")
            return
        super().emit(record)

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # QueueHandler.prepare would format here and flatten structlog's event dict to a string, which
        # ProcessorFormatter then cannot read: hand the record over as it is, formatting stays on the writer.
        return copy.copy(record)

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self._dropped.add("queue_full")


def flush_logging() -> None:
    """Give the writer what is queued (a second at most, a stuck sink is abandoned) and stop it."""
    global _listener
    if _listener is not None:
        _listener.stop()
        _listener = None


class _Sink:
    """Formats and writes on the writer thread. Deliberately not a logging.Handler: logging.shutdown
    at exit takes every handler's lock to flush it, and would wait forever on a write stuck in a full pipe."""

    def __init__(self, stream: TextIO, formatter: logging.Formatter, dropped: ShedCounter) -> None:
        self._stream = stream
        self._formatter = formatter
        self._dropped = dropped

    def handle(self, record: logging.LogRecord) -> None:
        try:
            self._stream.write(self._formatter.format(record) + "\n")
            self._stream.flush()
        except Exception:  # noqa: BLE001 - a full disk or a closed pipe costs this record, never the writer
            self._dropped.add("write_failed")


class _Listener(logging.handlers.QueueListener):
    """The writer thread (a daemon); stopping it never waits on a stuck sink."""

    def start(self) -> None:
        super().start()
        atexit.register(self.stop)

    def stop(self) -> None:
        thread = self._thread
        if thread is None:
            return
        atexit.unregister(self.stop)
        try:
            self.enqueue_sentinel()
        except queue.Full:
            pass  # the writer is behind or stuck: what it holds is lost, as on a crash
        thread.join(_STOP_WAIT)
        self._thread = None

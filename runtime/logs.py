"""structlog set-up: JSON off a TTY, console on one; stdlib and Temporal records share the pipeline, off the hot path."""

from __future__ import annotations

import atexit
import copy
import logging
import logging.handlers
import os
import queue
import sys
from typing import Any, TextIO

import structlog

from runtime.shedding import LOG_RECORDS_DROPPED, ShedCounter

__all__ = ["LOG_QUEUE_ENV", "configure_logging", "flush_logging"]

LOG_QUEUE_ENV = "COLDSTART_LOG_QUEUE"  # records held for the writer before new ones are dropped
_QUEUE_SIZE = 10_000
_STOP_WAIT = 1.0  # seconds a healthy sink gets to take what is queued at exit; a stuck one is abandoned

_listener: _Listener | None = None


def configure_logging(level: str = "INFO", *, json_output: bool | None = None, stream: TextIO | None = None,
                      queue_size: int | None = None, dropped: ShedCounter = LOG_RECORDS_DROPPED) -> None:
    """Route structlog and stdlib logging through one formatter behind a bounded queue.

    Nothing that logs ever waits on the sink: records are handed off in memory and written by a
    background thread. When the queue is full (the sink is slow or has stopped reading: a pipe nobody
    reads, a full disk) new records are dropped and counted in `dropped`
    (coldstart_log_records_dropped_total on the worker's metrics endpoint), as are records the sink
    refuses. A stuck sink never holds up the process's exit either.
    """
    global _listener
    stream = stream or sys.stderr
    if json_output is None:
        json_output = not stream.isatty()
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
    if _listener is not None:
        _listener.stop()
    _listener = _Listener(records, _Sink(stream, formatter, dropped))
    _listener.start()
    root = logging.getLogger()
    root.handlers[:] = [_DroppingQueueHandler(records, dropped)]
    root.setLevel(level)
    # warnings.warn would otherwise write to stderr on the warning thread (the event loop, an activity).
    logging.captureWarnings(True)
    structlog.configure(
        # Tracebacks are rendered here, on the logging thread: the writer thread has no exc_info to read.
        # A record below the level, or one the full queue would drop, is dropped before any work on it.
        processors=[structlog.stdlib.filter_by_level, _shed_when_full(records, dropped), *shared,
                    structlog.processors.format_exc_info, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def _shed_when_full(records: queue.Queue, dropped: ShedCounter) -> structlog.types.Processor:
    """A structlog processor that drops (and counts) a record while the queue is full, so a stopped
    sink costs the logging thread a check instead of the timestamp, the record and its copy."""
    def shed(logger: Any, method: str, event: structlog.types.EventDict) -> structlog.types.EventDict:
        if records.full():
            dropped.add("queue_full")
            raise structlog.DropEvent
        return event
    return shed


class _DroppingQueueHandler(logging.handlers.QueueHandler):
    def __init__(self, records: queue.Queue, dropped: ShedCounter) -> None:
        super().__init__(records)
        self._dropped = dropped

    def emit(self, record: logging.LogRecord) -> None:
        if self.queue.full():  # stdlib and Temporal records: shed before the copy
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
            self.queue.put_nowait(self._sentinel)
        except queue.Full:
            pass  # the writer is behind or stuck: what it holds is lost, as on a crash
        thread.join(_STOP_WAIT)
        self._thread = None

"""structlog set-up: JSON off a TTY, console on one; stdlib and Temporal records share the pipeline, off the hot path."""

from __future__ import annotations

import copy
import logging
import logging.handlers
import queue
import sys

import structlog

__all__ = ["configure_logging"]

_listener: logging.handlers.QueueListener | None = None


def configure_logging(level: str = "INFO", *, json_output: bool | None = None, stream=None) -> None:
    """Route structlog and stdlib logging through one formatter behind a queue.

    The queue keeps a slow terminal or pipe from ever blocking a recovery step: records are
    handed off in memory and written by a background thread; when the queue is full they are dropped.
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
    output = logging.StreamHandler(stream)
    output.setFormatter(formatter)
    records: queue.Queue = queue.Queue(maxsize=10_000)
    handler = _DroppingQueueHandler(records)
    if _listener is not None:
        _listener.stop()
    _listener = logging.handlers.QueueListener(records, output, respect_handler_level=False)
    _listener.start()
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    structlog.configure(
        # Tracebacks are rendered here, on the logging thread: the writer thread has no exc_info to read.
        processors=[*shared, structlog.processors.format_exc_info, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


class _DroppingQueueHandler(logging.handlers.QueueHandler):
    dropped = 0

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # QueueHandler.prepare would format here and flatten structlog's event dict to a string, which
        # ProcessorFormatter then cannot read: hand the record over as it is, formatting stays on the writer.
        return copy.copy(record)

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            _DroppingQueueHandler.dropped += 1

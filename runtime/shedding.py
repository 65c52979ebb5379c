"""Load shedding in the worker: drop counters for its bounded buffers, exported on its metrics endpoint."""

from __future__ import annotations

import logging
import threading
import time

from temporalio.common import MetricCounter, MetricMeter
from temporalio.runtime import LogForwardingConfig, LoggingConfig, PrometheusConfig, Runtime, TelemetryConfig

__all__ = ["JOURNAL_LINES_DROPPED", "LOG_RECORDS_DROPPED", "READINGS_SLOWED", "ShedCounter", "worker_runtime"]


class ShedCounter:
    """Items a bounded buffer dropped instead of blocking its producer, by reason.

    Counted from any thread from process start; once bound to a Temporal metric meter (the worker's
    Prometheus endpoint) the counts are exported there, earlier ones included, within EXPORT_EVERY
    seconds: a flood drops thousands a second, and a call into Core's meter per drop cost a third of
    what dropping a log record does."""

    def __init__(self, name: str, description: str, *, labels: tuple[str, ...] = ("reason",)) -> None:
        self.name = name
        self.description = description
        self.labels = labels  # a count's key holds one value per label, joined by ":"
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._exported: dict[str, int] = {}
        self._metric: MetricCounter | None = None

    def add(self, reason: str, count: int = 1) -> None:
        with self._lock:
            self._counts[reason] = self._counts.get(reason, 0) + count

    def value(self, reason: str | None = None) -> int:
        with self._lock:
            return self._counts.get(reason, 0) if reason else sum(self._counts.values())

    def bind(self, meter: MetricMeter) -> None:
        with self._lock:
            self._metric = meter.create_counter(self.name, self.description)
            self._exported = {}
        self.export()
        _exporter.watch(self)

    def export(self) -> None:
        """Add what was counted since the last export to the bound metric."""
        with self._lock:
            if self._metric is None:
                return
            for reason, count in self._counts.items():
                if count > self._exported.get(reason, 0):
                    self._metric.add(count - self._exported.get(reason, 0),
                                     dict(zip(self.labels, reason.split(":", len(self.labels) - 1), strict=True)))
                    self._exported[reason] = count


EXPORT_EVERY = 0.5


class _Exporter:
    """One daemon thread exporting every bound counter each EXPORT_EVERY seconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: list[ShedCounter] = []
        self._thread: threading.Thread | None = None

    def watch(self, counter: ShedCounter) -> None:
        with self._lock:
            if counter not in self._counters:
                self._counters.append(counter)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="shed-counters", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(EXPORT_EVERY)
            with self._lock:
                counters = list(self._counters)
            for counter in counters:
                counter.export()


_exporter = _Exporter()


LOG_RECORDS_DROPPED = ShedCounter(
    "coldstart_log_records_dropped_total",
    "log records dropped instead of blocking: reason queue_full (the writer is behind or its sink stopped reading), "
    "write_failed, or sampled (a flood of one kind of record beyond its first 100 a second)",
)


JOURNAL_LINES_DROPPED = ShedCounter(
    "coldstart_journal_lines_dropped_total",
    "action journal lines that could not be written (the action went on): reason write_failed",
)


READINGS_SLOWED = ShedCounter(
    "coldstart_gate_readings_slowed_total",
    "gate readings taken at a part of the worker's pace (a quarter by default) because it was running steps (runtime/step_load.py): "
    "reason steps_running",
)


def worker_runtime(metrics_address: str | None) -> Runtime:
    """The worker's Temporal runtime: Core's own log lines join the bounded log queue (by default Core
    writes them to stderr itself, and a full stderr pipe would block its threads), and the drop
    counters are exported beside the SDK's metrics."""
    runtime = Runtime(telemetry=TelemetryConfig(
        logging=LoggingConfig(filter=LoggingConfig.default.filter,
                              forwarding=LogForwardingConfig(logger=logging.getLogger("temporalio.core"))),
        metrics=PrometheusConfig(bind_address=metrics_address) if metrics_address else None,
    ))
    from runtime.notifications import NOTIFICATIONS_DELIVERED, NOTIFICATIONS_DROPPED

    for counter in (LOG_RECORDS_DROPPED, JOURNAL_LINES_DROPPED, READINGS_SLOWED, NOTIFICATIONS_DELIVERED,
                    NOTIFICATIONS_DROPPED):
        counter.bind(runtime.metric_meter)
    return runtime

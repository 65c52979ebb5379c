"""Exports the CFS throttling of the lab's per-process cgroups under cAdvisor's metric names."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import typer
from prometheus_client import start_http_server
from prometheus_client.core import REGISTRY, CounterMetricFamily
from prometheus_client.registry import Collector

from lab import cgroups

__all__ = ["CgroupCollector", "main"]


class CgroupCollector(Collector):
    """cpu.stat of every cgroup named `<prefix><host>`, as cAdvisor reports containers, so the same
    rules read a production cAdvisor (container_cpu_cfs_throttled_periods_total / _periods_total)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def collect(self) -> Iterator[CounterMetricFamily]:
        labels = ["id", "name"]
        periods = CounterMetricFamily("container_cpu_cfs_periods", "Elapsed CFS enforcement periods", labels=labels)
        throttled = CounterMetricFamily("container_cpu_cfs_throttled_periods", "CFS periods the group was throttled",
                                        labels=labels)
        seconds = CounterMetricFamily("container_cpu_cfs_throttled_seconds", "Time the group was throttled",
                                      labels=labels)
        for group in cgroups.groups(self.prefix):
            stat = cgroups.cpu_stat(group)
            if stat is None:
                continue
            values = [f"/{group}", group[len(self.prefix):]]
            periods.add_metric(values, stat.nr_periods)
            throttled.add_metric(values, stat.nr_throttled)
            seconds.add_metric(values, stat.throttled_seconds)
        yield from (periods, throttled, seconds)


def main(
    listen: str = typer.Option(..., help="HOST:PORT to serve /metrics on"),
    prefix: str = typer.Option(..., help="export the cgroups whose names start with this"),
) -> None:
    host, _, port = listen.rpartition(":")
    REGISTRY.register(CgroupCollector(prefix))
    start_http_server(int(port), addr=host)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"cgroup exporter on {listen} for {prefix}*", flush=True)
    stop.wait()


if __name__ == "__main__":
    typer.run(main)

"""Disable 1,000 (or 10,000) non-essential Consul users with one for_each step: concurrency 50, 1 % injected failures.

Runs the real path: a runbook on the local Temporal dev server, the worker's consul.user.disable
action (py-consul, python-nomad, the Consul token read from Vault with hvac) against the lab's
Consul, Nomad and Vault stand-ins started as processes on loopback. 1 % of the services have no
Nomad job, so their disable fails and the step's "1%" error threshold absorbs them. The items are
the services' names; the step's `with` builds each service. Prints the step's wall time, the
largest payload in the run's and its batches' histories, and every warning the SDK and the worker
logged (Temporal's TMPRL1103 is a payload over 512 KiB). The dev server runs with the production
server's dynamic config (runtime/server_config.dynamic_config_flags, as `coldstart server`). Each round
(--rounds, 3) starts everything afresh. Goal: the median wall time over rounds under 20 s for 1,000; 10,000
within 10x that (200 s); NOT met on any payload warning or any round whose run failed.

    .venv/bin/python bench/fanout.py --count 10000
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import consul
import httpx
import hvac
from temporalio.api.enums.v1 import EventType
from temporalio.runtime import LogForwardingConfig, LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.testing import WorkflowEnvironment

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ is not an installed package
from bench._cpu import cpu_seconds
from bench._targets import development_target
from bench._verdict import Verdict, median, under
from lab.hashistack.local import VaultDev
from runtime.connection import DATA_CONVERTER
from runtime.payload_sizes import run_payloads
from runtime.processes import start_process
from runtime.runs import start_run
from runtime.server_config import dynamic_config_flags
from runtime.worker import build_worker
from workflows import search
from workflows.contract import RunStatus
from workflows.loader import plan_run

TOKEN = "bench-consul-token"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _arrange(consul_url: str, nomad_url: str, count: int, failing: int) -> list[str]:
    host, port = consul_url.removeprefix("http://").split(":")
    admin = consul.Consul(host=host, port=int(port), token=TOKEN)
    services = []
    with httpx.Client(timeout=30) as http:
        for i in range(count):
            name = f"svc{i:05d}"
            admin.kv.put(f"coldstart/usage/{name}", "enabled")
            admin.agent.service.register(name, service_id=name, port=8080)
            check = consul.Check.ttl("60s")
            check["Status"] = "passing"
            admin.agent.check.register(f"{name} ttl", check=check, check_id=f"{name}-ttl", service_id=name)
            broken = i % (count // failing) == 0 if failing else False
            if not broken:
                job = {"Job": {"ID": name, "Name": name, "Type": "service", "Datacenters": ["dc1"],
                               "TaskGroups": [{"Name": "app", "Count": 4,
                                               "Tasks": [{"Name": "app", "Driver": "docker", "Config": {"image": "app"}}]}]}}
                http.post(f"{nomad_url}/v1/jobs", json=job).raise_for_status()
            services.append(name)
    _settle(nomad_url, deadline_s=120 + count // 50)
    return services


def _settle(nomad_url: str, deadline_s: float) -> None:
    """Wait until no deployment is active: a platform's jobs are steady before an outage, not mid-rollout."""
    active = ("initializing", "pending", "running", "blocked", "unblocking")
    end = time.monotonic() + deadline_s
    with httpx.Client(timeout=30) as http:
        while True:
            running = [d for d in http.get(f"{nomad_url}/v1/deployments").json() if d.get("Status") in active]
            if not running:
                return
            if time.monotonic() > end:
                raise SystemExit(f"{len(running)} deployments still active after {deadline_s:.0f} s")
            time.sleep(0.5)


def _cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of this process (the worker) and each process it started, by role."""
    return cpu_seconds({"standins consul": "consul stand-in", "standins nomad": "nomad stand-in",
                        "server -dev": "vault", "start-dev": "temporal dev server"}, me="worker (bench process)")


def _activity_timings(histories) -> tuple[float, float, float]:
    """Median time from scheduled to started, and from started to closed, over the fan-out's activities."""
    from statistics import median

    queued, running = [], []
    for history in histories:
        _one_history(history, queued, running)
    running.sort()
    return median(queued), median(running), running[int(len(running) * 0.9)]


def _one_history(history, queued: list[float], running: list[float]) -> None:
    scheduled, started = {}, {}
    for event in history.events:
        at = event.event_time.ToDatetime()
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[event.event_id] = at
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            sid = event.activity_task_started_event_attributes.scheduled_event_id
            started[sid] = at
            queued.append((at - scheduled[sid]).total_seconds() * 1000)
        elif event.event_type in (EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED):
            attrs = (event.activity_task_completed_event_attributes
                     if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
                     else event.activity_task_failed_event_attributes)
            running.append((at - started[attrs.scheduled_event_id]).total_seconds() * 1000)


class _Warnings(logging.Handler):
    """Every warning logged in this process: the SDK's core (forwarded), the worker's and the workflows'."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def payload(self) -> list[logging.LogRecord]:
        """The payload-size warnings: Temporal's TMPRL1103, or any warning about a size."""
        return [r for r in self.records if "TMPRL1103" in r.getMessage() or "size" in r.getMessage().lower()]

    def report(self) -> str:
        payload = self.payload()
        kinds = collections.Counter(f"{r.name}: {r.getMessage().splitlines()[0].split(' ({')[0][:110]}" for r in self.records
                                    if r not in payload)
        lines = [f"payload-size warnings: {len(payload)}", *(f"  {r.getMessage()[:300]}" for r in payload[:10]),
                 f"other warnings: {len(self.records) - len(payload)}",
                 *(f"  {n} x {kind}" for kind, n in kinds.most_common(8))]
        return "\n".join(lines)


RUNBOOK = """
metadata: {{name: disable-users}}
target: bench
params:
  services: {{type: list}}
steps:
  - id: disable-users
    for_each:
      items: ${{{{ params.services }}}}
      as: service
      action: consul.user.disable
      with:
        consul: {consul}
        nomad: {{address: "{nomad}"}}
        # The TTL check stays: it has no interval to stretch (no check_owner).
        service: {{name: "${{{{ service }}}}", tier: tier2, essential: false,
                  usage_flag_key: "coldstart/usage/${{{{ service }}}}", nomad_job: "${{{{ service }}}}"}}
      max_concurrency: {concurrency}
      error_threshold: "1%"
"""


@dataclass(frozen=True)
class Round:
    """One round: the step's wall time (None when the run failed), its payload warnings, why the run failed."""

    wall: float | None
    payload_warnings: int = 0
    failed: str = ""


def goal_s(count: int) -> float:
    """Under 20 s for 1,000 services; within 10x that for 10,000 (scaled by the count, never under 20 s)."""
    return 20 * max(1, count / 1000)


def fanout_verdict(rounds: list[Round], count: int) -> Verdict:
    """The median wall time over the rounds against goal_s; NOT met on any payload warning or failed run."""
    return Verdict([under(f"median wall time over {len(rounds)} rounds", median([r.wall for r in rounds]),
                          goal_s(count), " s")],
                   {"payload warnings": sum(r.payload_warnings for r in rounds),
                    "runs failed": sum(bool(r.failed) for r in rounds)})


async def main(count: int, concurrency: int, failing: int, rounds: int) -> int:
    results = []
    for round_ in range(1, rounds + 1):
        print(f"round {round_} of {rounds}", flush=True)
        results.append(await _round(count, concurrency, failing))
    walls = ", ".join("failed" if r.wall is None else f"{r.wall:.2f} s" for r in results)
    print(f"wall times: {walls}")
    verdict = fanout_verdict(results, count)
    print(verdict.line(f"goal (< {goal_s(count):.0f} s for {count:,})"))
    return 0 if verdict.met else 1


async def _round(count: int, concurrency: int, failing: int) -> Round:
    work = Path(tempfile.mkdtemp(prefix="fanout-"))
    ports = {n: _port() for n in ("consul1", "consul2", "consul3", "nomad")}
    python = sys.executable
    consul_argv = [python, "-m", "lab.standins", "consul", "--acl-token", TOKEN]
    for name in ("consul1", "consul2", "consul3"):
        consul_argv += ["--server", f"{name}=127.0.0.1:{ports[name]}"]
    with start_process(consul_argv, log=work / "consul.log", port=ports["consul1"]), \
         start_process([python, "-m", "lab.standins", "nomad", "--listen", f"127.0.0.1:{ports['nomad']}",
                        "--node", "node1", "--node", "node2", "--node", "node3"], log=work / "nomad.log", port=ports["nomad"]), \
         VaultDev(work / "vault", "root").start() as vault:  # Vault has no stand-in: the real dev server
        consul_url = f"http://127.0.0.1:{ports['consul1']}"
        nomad_url = f"http://127.0.0.1:{ports['nomad']}"
        vault_url = vault.url
        hvac.Client(url=vault_url, token="root").secrets.kv.v2.create_or_update_secret(path="coldstart/consul", secret={"token": TOKEN})
        (work / "vault-token").write_text("root\n")
        started = time.monotonic()
        services = await asyncio.to_thread(_arrange, consul_url, nomad_url, count, failing)
        print(f"arranged {count} services ({failing} with a missing Nomad job) in {time.monotonic() - started:.1f} s")
        consul_target = json.dumps({
            "address": consul_url,
            "servers": [f"http://127.0.0.1:{ports[n]}" for n in ("consul1", "consul2", "consul3")],
            "token": {"address": vault_url, "path": "coldstart/consul", "field": "token", "token_file": str(work / "vault-token"),
                      "cache_seconds": 30},  # as the lab inventory: one read per worker per 30 s
        })
        book = work / "disable-users.yaml"
        book.write_text(RUNBOOK.format(consul=consul_target, nomad=nomad_url, concurrency=concurrency))
        warnings = _Warnings()
        logging.getLogger().addHandler(warnings)
        # The SDK's core warns of a payload over 512 KiB (TMPRL1103): forwarded to Python logging, so it is counted.
        runtime = Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(
            filter=TelemetryFilter(core_level="WARN", other_level="WARN"),
            forwarding=LogForwardingConfig(logger=logging.getLogger("temporal.core")))))
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=str(Path(sys.prefix) / "bin" / "temporal"), data_converter=DATA_CONVERTER,
            search_attributes=search.ALL, dev_server_log_level="error", runtime=runtime,
            dev_server_extra_args=dynamic_config_flags(),  # what `coldstart server` runs
        )
        try:
            run = plan_run(book, registry=__import__("activities.catalog").catalog.load_registry(),
                           params={"services": services}, inventory=development_target("bench"), initiator="bench")
            async with build_worker(env.client, "fanout", executor=ThreadPoolExecutor(concurrency + 10),
                                    max_concurrent_activities=concurrency + 10, allow_development=True):
                started, cpu_before = time.monotonic(), _cpu_seconds()
                handle = await start_run(env.client, run, "fanout")
                try:
                    await handle.result()
                except Exception as exc:  # noqa: BLE001 - a failed run is counted, and fails the verdict
                    failed = f"{type(exc).__name__}: {exc}"
                else:
                    failed = ""
                wall = time.monotonic() - started
                cpu = {k: v - cpu_before.get(k, 0.0) for k, v in _cpu_seconds().items()}
                if not failed:
                    status = await handle.query("status", result_type=RunStatus)
                    sizes = await run_payloads(env.client, handle.id)
                    batches = [e.start_child_workflow_execution_initiated_event_attributes.workflow_id
                               for e in (await handle.fetch_history()).events
                               if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED]
                    timings = _activity_timings([await env.client.get_workflow_handle(b).fetch_history()
                                                 for b in batches])
        finally:
            await env.shutdown()
            await asyncio.sleep(0.5)  # the core's forwarded logs are buffered a few milliseconds
            logging.getLogger().removeHandler(warnings)
    if failed:
        print(f"the run failed after {wall:.2f} s: {failed[:300]}")
        print(warnings.report())
        return Round(None, len(warnings.payload()), failed)
    outputs = status.steps[0].outputs
    print(f"disable {count} services, concurrency {concurrency}: succeeded {outputs['succeeded']}, "
          f"failed {outputs['failed']} (threshold 1 % = {count // 100})")
    print(f"per item: queued {timings[0]:.0f} ms median, running {timings[1]:.0f} ms median (p90 {timings[2]:.0f} ms)")
    print("CPU seconds during the step (2 cores: at most 2 per wall second): "
          + ", ".join(f"{name} {sec:.1f}" for name, sec in sorted(cpu.items(), key=lambda kv: -kv[1]) if sec >= 0.05))
    print(f"histories: {sizes.workflows} workflows ({len(batches)} batches), {sizes.events} events, "
          f"{sizes.fields} payload fields; largest {sizes.largest[0] / 1024:.1f} KiB ({sizes.largest[1]})")
    print(warnings.report())
    print(f"load average at the end (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"wall time {wall:.2f} s")
    return Round(wall, len(warnings.payload()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", "--services", dest="count", type=int, default=1000, help="services to disable")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each from scratch (the goal is their median)")
    parser.add_argument("--failing", type=int, default=None, help="services without a Nomad job (default 1 %%)")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.count, args.concurrency, args.count // 100 if args.failing is None else args.failing,
                              args.rounds)))


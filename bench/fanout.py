"""Disable 1,000 non-essential Consul users with one for_each step: concurrency 50, 1 % injected failures.

Runs the real path: a runbook on the local Temporal dev server, the worker's consul.user.disable
action (py-consul, python-nomad, the Consul token read from Vault with hvac) against the lab's
Consul, Nomad and Vault stand-ins started as processes on loopback. 1 % of the services name a
Nomad job that does not exist, so their disable fails and the step's "1%" error threshold absorbs
them. Prints the step's wall time. Goal: under 20 s (the postmortem's version took hours).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import consul
import httpx
import hvac
from temporalio.testing import WorkflowEnvironment

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ is not an installed package
from bench._cpu import cpu_seconds
from bench._targets import development_target
from lab.hashistack.local import VaultDev
from runtime.connection import DATA_CONVERTER
from runtime.processes import start_process
from runtime.runs import start_run
from runtime.worker import build_worker
from workflows import search
from workflows.contract import RunStatus
from workflows.loader import plan_run

TOKEN = "bench-consul-token"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _arrange(consul_url: str, nomad_url: str, count: int, failing: int) -> list[dict]:
    host, port = consul_url.removeprefix("http://").split(":")
    admin = consul.Consul(host=host, port=int(port), token=TOKEN)
    services = []
    with httpx.Client(timeout=30) as http:
        for i in range(count):
            name = f"svc{i:04d}"
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
            services.append({"name": name, "tier": "tier2", "essential": False,
                             # The TTL check stays: it has no interval to stretch (no check_owner).
                             "usage_flag_key": f"coldstart/usage/{name}",
                             "nomad_job": name if not broken else f"{name}-missing"})
    _settle(nomad_url, deadline_s=120)
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


def _activity_timings(history) -> tuple[float, float, float]:
    """Median time from scheduled to started, and from started to closed, over the fan-out's activities."""
    from statistics import median

    from temporalio.api.enums.v1 import EventType

    scheduled, started, queued, running = {}, {}, [], []
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
    running.sort()
    return median(queued), median(running), running[int(len(running) * 0.9)]


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
        service: ${{{{ service }}}}
      max_concurrency: {concurrency}
      error_threshold: "1%"
"""


async def main(count: int, concurrency: int, failing: int) -> None:
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
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=str(Path(sys.prefix) / "bin" / "temporal"), data_converter=DATA_CONVERTER,
            search_attributes=search.ALL, dev_server_log_level="error",
        )
        try:
            run = plan_run(book, registry=__import__("activities.catalog").catalog.load_registry(),
                           params={"services": services}, inventory=development_target("bench"), initiator="bench")
            async with build_worker(env.client, "fanout", executor=ThreadPoolExecutor(concurrency + 10),
                                    max_concurrent_activities=concurrency + 10):
                started, cpu_before = time.monotonic(), _cpu_seconds()
                handle = await start_run(env.client, run, "fanout")
                await handle.result()
                wall = time.monotonic() - started
                cpu = {k: v - cpu_before.get(k, 0.0) for k, v in _cpu_seconds().items()}
                status = await handle.query("status", result_type=RunStatus)
                child = env.client.get_workflow_handle(f"{handle.id}/disable-users/1")
                timings = _activity_timings(await child.fetch_history())
        finally:
            await env.shutdown()
    outputs = status.steps[0].outputs
    print(f"disable {count} services, concurrency {concurrency}: succeeded {outputs['succeeded']}, "
          f"failed {outputs['failed']} (threshold 1 % = {count // 100})")
    print(f"per item: queued {timings[0]:.0f} ms median, running {timings[1]:.0f} ms median (p90 {timings[2]:.0f} ms)")
    print("CPU seconds during the step (2 cores: at most 2 per wall second): "
          + ", ".join(f"{name} {sec:.1f}" for name, sec in sorted(cpu.items(), key=lambda kv: -kv[1]) if sec >= 0.05))
    print(f"wall time {wall:.2f} s  goal: < 20 s -> {'met' if wall < 20 else 'NOT met'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--failing", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(main(args.services, args.concurrency, args.failing))


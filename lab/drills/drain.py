"""Preempted-host drill on the lab: a notice fires the alert, the trigger starts the drain runbook, and the drill measures it.

One lab (csp/10.217, scraped every second), one Temporal dev server, the real worker writing the
action journal, and the real `coldstart triggers serve` receiving Debian's Alertmanager. A round:
fresh containers on the container host (one per repl, registered in Consul KV), a preemption
notice through the host's metadata endpoint (`lab inject preempted-host`), then nothing typed:
Prometheus fires HostPreemptionNotice, Alertmanager posts it, the trigger starts
runbooks/preempted-host-drain.yaml, and the round reports the times from the notice to the run's
start, the kill, the release and the drained gates, plus the session router's stuck histogram
before and after. tests/lab/test_drain_drill.py asserts on a small round; bench/drain.py runs 200
containers and compares a graceful stop of each in the same lab.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from activities.journal import JournalCheck, check_journal, read_journal
from lab.drills.harness import LabHarness
from runtime.polling import read_kept_status
from runtime.processes import stop_process, wait_port

__all__ = ["DRAIN_BENCH_LAB", "DRAIN_LAB", "DrainDrill", "DrainReport", "Histogram", "parse_histogram"]

REPO = Path(__file__).resolve().parents[2]
TRIGGERS = REPO / "triggers" / "lab.yaml"
# Apart from tests/lab (cst/10.214), the cold-start drill (csd/10.215) and the fault drills (csf/10.216).
DRAIN_LAB = {"prefix": "csp", "bridge": "cspbr0", "veth_prefix": "cspv", "subnet": "10.217.0.0/24"}
# bench/drain.py's own names: a bench started while `make test` runs must not tear down the suite's drain lab.
DRAIN_BENCH_LAB = {"prefix": "csn", "bridge": "csnbr0", "veth_prefix": "csnv", "subnet": "10.229.0.0/24"}
STUCK = "coldstart_session_stuck_seconds"


@dataclass
class Histogram:
    """A Prometheus histogram read from a /metrics page: cumulative counts per upper bound."""

    buckets: dict[str, float]
    count: float
    sum: float

    def minus(self, earlier: Histogram) -> Histogram:
        return Histogram({le: n - earlier.buckets.get(le, 0) for le, n in self.buckets.items()},
                         self.count - earlier.count, self.sum - earlier.sum)

    def rows(self) -> list[tuple[str, int]]:
        """(bucket, episodes in it) non-cumulative, as an operator reads it."""
        out, below, prev = [], 0.0, "0"
        for le, n in self.buckets.items():
            label = f"> {prev} s" if le == "+Inf" else f"<= {le} s"
            out.append((label, int(n - below)))
            below, prev = n, le
        return out


def parse_histogram(text: str, name: str = STUCK) -> Histogram:
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[str, float] = {}
    count = total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for s in family.samples:
            if s.name.endswith("_bucket"):
                buckets[s.labels["le"]] = s.value
            elif s.name.endswith("_count"):
                count = s.value
            elif s.name.endswith("_sum"):
                total = s.value
    return Histogram(buckets, count, total)


@dataclass
class DrainReport:
    containers: int
    notice_s: float
    state: str = "?"
    error: str | None = None
    notice_to_run_started_s: float | None = None
    # The alert path, from the trigger's log: the rule evaluation that found the alert firing (its startsAt),
    # and the trigger's start of the run.
    notice_to_alert_firing_s: float | None = None
    notice_to_trigger_started_s: float | None = None
    notice_to_killed_s: float | None = None
    notice_to_released_s: float | None = None
    notice_to_drained_s: float | None = None  # the run succeeded: gates passed on fresh samples
    kill_seconds: float | None = None  # the kill step's own figure: first signal to every cgroup empty
    kill_signalled_seconds: float | None = None  # first signal to last: every container dead to user space
    # Each step's start and end, seconds after the notice: where notice-to-drained goes.
    step_times: dict[str, tuple[float, float]] = field(default_factory=dict)
    killed: int = 0
    released: int = 0
    containers_left: int = -1
    entries_left: int = -1
    deadline_missed: bool = False
    histogram_before: Histogram | None = None
    histogram_after: Histogram | None = None
    journal: JournalCheck | None = None
    workflow_id: str = ""
    run_initiator: str = ""
    trigger_answers: list[str] = field(default_factory=list)
    controller_weight: int | None = None  # the controller's CPU weight in this round (None: as every process)

    @property
    def repeats(self) -> list[Any]:
        return self.journal.repeated if self.journal else []


class DrainDrill(LabHarness):
    """`async with DrainDrill(root, containers=8) as drill: report = await drill.round()`."""

    def __init__(self, root: Path, *, containers: int = 8, drain_s: float = 0.5,
                 log: Callable[[str], None] | None = None, names: dict[str, str] | None = None):
        from lab.settings import LabConfig

        root = Path(root)
        # Little player and internal load: this drill is about the container host.
        cfg = LabConfig(state_dir=root / "lab", inventory_path=root / "targets" / "lab.yaml",
                        players_rps=5, internal_rps=2, seed_players=50, scrape_interval="1s", drain_signals_interval="250ms",
                        containers=containers, container_drain_s=drain_s, **(names or DRAIN_LAB))
        super().__init__(root, cfg, f"coldstart-drain-{os.getpid()}", log=log)
        self.trigger: subprocess.Popen | None = None

    async def open(self) -> None:
        await super().open()
        await asyncio.to_thread(self._start_trigger)

    def _start_trigger(self) -> None:
        from lab.services import Secrets

        log = self.root / "trigger.log"
        env = {**os.environ, "TEMPORAL_ADDRESS": self.server.address, "TEMPORAL_NAMESPACE": "default",
               "COLDSTART_TASK_QUEUE": self.queue}
        gateway = str(self.cfg.spec.gateway)
        with log.open("ab") as out:
            self.trigger = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "triggers", "serve", "--config", str(TRIGGERS),
                 "--host", gateway, "--port", str(self.cfg.ports.trigger),
                 "--token-file", str(Secrets(self.cfg).file("trigger-token")), "--targets-dir", str(self.targets)],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        wait_port(self.cfg.ports.trigger, host=gateway, timeout=60, process=self.trigger)

    def controller_pids(self) -> list[int]:
        return [*super().controller_pids(), *([self.trigger.pid] if self.trigger else [])]

    async def close(self) -> None:
        stop_process(self.trigger, grace=5)
        await super().close()

    # ---- the lab -------------------------------------------------------------------------------
    @property
    def agent(self) -> str:
        return f"http://{self.cfg.ip(self.cfg.container_host)}:{self.cfg.ports.node_agent}"

    @property
    def router(self) -> str:
        return f"http://{self.cfg.ip('edge')}:{self.cfg.ports.session_router}"

    async def _post(self, url: str, body: dict[str, Any] | None = None, timeout: float = 120.0) -> Any:
        async with httpx.AsyncClient(timeout=timeout) as http:
            r = await http.post(url, json=body or {})
        if r.is_error:  # the agent's answer says why (a repl held, a host cordoned), the status alone does not
            raise RuntimeError(f"{url} answered {r.status_code}: {r.text[:300]}")
        return r.json()

    async def router_sessions(self) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=5) as http:
            return (await http.get(f"{self.router}/sessions")).json()

    async def histogram(self) -> Histogram:
        async with httpx.AsyncClient(timeout=5) as http:
            return parse_histogram((await http.get(f"{self.router}/metrics")).text)

    async def store_entries(self) -> int:
        """Store entries that point at the container host."""
        import base64
        import json

        from lab.services import Secrets

        prefix = f"{self.cfg.session_store_prefix}repls/"
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.get(f"{self.cfg.consul_url}/v1/kv/{prefix}", params={"recurse": "true"},
                               headers={"X-Consul-Token": Secrets(self.cfg).read("consul-token")})
        if r.status_code == 404:
            return 0
        r.raise_for_status()
        values = [json.loads(base64.b64decode(e["Value"] or b"{}")) for e in r.json()]
        return sum(1 for v in values if v.get("host") == self.cfg.container_host)

    def containers_left(self) -> int:
        from lab.containers import cgroup_root, sessions_cgroup

        base = cgroup_root() / sessions_cgroup(self.cfg.prefix)
        if not base.is_dir():
            return 0
        return sum(1 for g in base.iterdir() if g.is_dir() and (g / "cgroup.procs").read_text().split())

    async def fresh_host(self, count: int) -> None:
        """The host replaced by a fresh VM: no notice, not cordoned, `count` containers serving."""
        async def booted() -> bool:
            async with httpx.AsyncClient(timeout=10) as http:
                return not (await http.get(f"{self.agent}/containers")).json()["booting"]

        await self.wait_for("the host's first containers", booted, timeout=300, every=0.25)
        await self._post(f"{self.agent}/_lab/reset")
        await self._alert_resolved()
        live = {c["repl"] for c in (await self._get_containers()) if c["running"]}
        wanted = [f"r{i:04d}" for i in range(1, count + 1) if f"r{i:04d}" not in live]
        for first in range(0, len(wanted), 200):
            await self._post(f"{self.agent}/containers/start", {"repls": wanted[first:first + 200]}, timeout=300)

        seen: dict[str, Any] = {}

        async def serving() -> bool:
            seen.update(await self.router_sessions())
            return seen["sessions"] >= count and not seen["stuck"]

        try:
            await self.wait_for(f"{count} sessions serving", serving, timeout=60)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; the router last read {seen or 'nothing'}") from None

    async def _alert_resolved(self) -> None:
        """A new notice for the same host pages again only once Alertmanager has seen the last one resolve:
        the same alert firing again inside repeat_interval is not news to it."""
        from lab.alerting import PREEMPTION_ALERT

        url = f"http://{self.cfg.ip('prom')}:{self.cfg.ports.alertmanager}/api/v2/alerts"
        query = {"filter": [f'alertname="{PREEMPTION_ALERT}"', f'host="{self.cfg.container_host}"']}

        async def quiet() -> bool:
            async with httpx.AsyncClient(timeout=5) as http:
                return (await http.get(url, params=query)).json() == []

        if not await quiet():
            await self.wait_for("the last notice's alert to resolve", quiet, timeout=60, every=0.25)
            await asyncio.sleep(2.0)  # its resolution flushed to the notification log (group_interval 1 s)

    async def _get_containers(self) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=10) as http:
            return (await http.get(f"{self.agent}/containers")).json()["containers"]

    async def graceful_stop(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The slow path for comparison: SIGTERM every container, wait, SIGKILL what is left, then
        drop their store entries (what a runtime's stop then the manager's cleanup do)."""
        return await self._post(f"{self.agent}/containers/stop",
                                {"method": "graceful", "timeout_s": timeout_s, "release": True}, timeout=600)

    # ---- a round -------------------------------------------------------------------------------
    async def round(self, *, notice_s: float = 30.0, timeout: float = 90.0) -> DrainReport:
        """Fresh containers, a notice, and the triggered drain run measured from the notice."""
        from runtime.runs import workflow_id_for
        from workflows.contract import RunStatus

        count = self.cfg.containers
        await self.fresh_host(count)
        report = DrainReport(containers=count, notice_s=notice_s)
        report.histogram_before = await self.histogram()
        previous = await self._latest_run_id()
        notice = await self._post(f"{self.agent}/_lab/preempt", {"notice_s": notice_s})
        noticed_at = time.time()
        self._log(f"notice: {self.cfg.container_host} terminated at {notice['deadline']:.3f} "
                  f"({notice_s:g} s), {count} containers")
        handle = self.client.get_workflow_handle(workflow_id_for(self.inventory["name"]))

        async def new_run() -> Any:
            described = await handle.describe()
            return described if described.run_id != previous else None

        described = await self.wait_for("the triggered run", new_run, timeout=timeout, every=0.1)
        report.workflow_id = handle.id
        report.notice_to_run_started_s = round(described.start_time.timestamp() - noticed_at, 3)
        run = self.client.get_workflow_handle(handle.id, run_id=described.run_id)

        async def finished() -> bool:
            # From the server: ten Queries a second would cost the worker whose drain is being timed.
            return (await read_kept_status(run, attempts=1)).over

        await self.wait_for("the drain run to end", finished, timeout=timeout, every=0.1)
        status = await run.query("status", result_type=RunStatus)  # once, with the steps' outputs
        report.state, report.error, report.run_initiator = status.state, status.error, status.initiator
        report.deadline_missed = bool(status.error and "deadline" in status.error)
        steps = {s.id: s for s in status.steps}
        if (kill := steps.get("kill")) and kill.ended_at and kill.status == "succeeded":
            report.notice_to_killed_s = round(kill.ended_at.timestamp() - noticed_at, 3)
            report.kill_seconds = kill.outputs.get("seconds")
            report.kill_signalled_seconds = kill.outputs.get("signalled_seconds")
            report.killed = len(kill.outputs.get("killed", []))
        if (release := steps.get("release")) and release.ended_at and release.status == "succeeded":
            report.notice_to_released_s = round(release.ended_at.timestamp() - noticed_at, 3)
            report.released = len(release.outputs.get("released", []))
        report.step_times = {s.id: (round(s.started_at.timestamp() - noticed_at, 3), round(s.ended_at.timestamp() - noticed_at, 3))
                             for s in status.steps if s.started_at and s.ended_at}
        if status.state == "succeeded" and status.ended_at:
            report.notice_to_drained_s = round(status.ended_at.timestamp() - noticed_at, 3)
        if (started := self._trigger_started_after(noticed_at)) is not None:
            report.notice_to_trigger_started_s = round(started[0] - noticed_at, 3)
            if started[1] is not None:
                report.notice_to_alert_firing_s = round(started[1] - noticed_at, 3)
        # The stuck episodes end in the router once the entries are gone: give it a poll or two.
        await asyncio.sleep(1.0)
        report.histogram_after = await self.histogram()
        report.containers_left = await asyncio.to_thread(self.containers_left)
        report.entries_left = await self.store_entries()
        entries = [e for e in read_journal(self.journal)
                   if e.get("workflow_id") == handle.id and e.get("run_id") == described.run_id]
        report.journal = check_journal(entries)
        self._log(f"run {described.run_id} by {status.initiator}: {status.state} "
                  f"(started {report.notice_to_run_started_s} s, drained {report.notice_to_drained_s} s after the "
                  f"notice); kill {report.kill_seconds} s for {report.killed}")
        return report

    def _trigger_started_after(self, since: float) -> tuple[float, float | None] | None:
        """The trigger's first run started after `since` (unix seconds): when, and its alert's startsAt."""
        from datetime import datetime

        try:
            lines = (self.root / "trigger.log").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            try:
                entry = json.loads(line)
                if entry.get("event") != "trigger_started":
                    continue
                at = datetime.fromisoformat(entry["timestamp"]).timestamp()
                fired = entry.get("starts_at")
                if at >= since:
                    return at, datetime.fromisoformat(fired).timestamp() if fired else None
            except (ValueError, KeyError, TypeError):
                continue
        return None

    async def _latest_run_id(self) -> str | None:
        from runtime.runs import workflow_id_for

        try:
            return (await self.client.get_workflow_handle(workflow_id_for(self.inventory["name"])).describe()).run_id
        except Exception:  # noqa: BLE001 - no run yet on this target
            return None

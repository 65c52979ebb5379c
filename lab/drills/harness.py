"""What the lab drills share: a lab, a Temporal dev server on a persistent database and the real worker, run together."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Self

from runtime.processes import free_port, stop_process, wait_port
from workflows.loader import read_inventory

__all__ = ["LabHarness", "TemporalServer", "WorkerProcess"]

REPO = Path(__file__).resolve().parents[2]


class TemporalServer:
    """`temporal server start-dev` on a persistent SQLite file; stop() and start() keep the database."""

    def __init__(self, db: Path, log: Path):
        self.db, self.log = db, log
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        from runtime.server_config import dev_server_argv

        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                dev_server_argv(self.db, self.port),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        wait_port(self.port, timeout=60, process=self.process)

    def stop(self) -> None:
        stop_process(self.process, grace=15)
        self.process = None


class WorkerProcess:
    """The real worker (`worker.py --journal`) in its own process group, so a drill can SIGKILL it.
    allow_development: started with --allow-development (a test's or bench's own runbooks on development
    targets; the drills run catalogued runbooks)."""

    def __init__(self, address: str, queue: str, journal: Path, log: Path, env: dict[str, str], *,
                 allow_development: bool = False):
        self.address, self.queue, self.journal, self.log, self.env = address, queue, journal, log, env
        self.allow_development = allow_development
        self.process: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, timeout: float = 60.0) -> None:
        env = {**os.environ, **self.env, "TEMPORAL_ADDRESS": self.address, "TEMPORAL_NAMESPACE": "default"}
        self.log.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                # --promote: the drill's server outlives a code change between drills; its worker is the current version.
                [sys.executable, str(REPO / "worker.py"), "--task-queue", self.queue, "--metrics", "", "--promote",
                 "--journal", str(self.journal), *(["--allow-development"] if self.allow_development else [])],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.log.open("rb") as f:
                f.seek(offset)
                if b"worker started" in f.read():
                    return
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited with {self.process.returncode}; see {self.log}")
            time.sleep(0.05)
        raise TimeoutError(f"worker not started within {timeout:.0f} s; see {self.log}")

    def signal(self, sig: int) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, sig)

    def kill(self) -> int:
        """SIGKILL: no graceful shutdown, in-flight activities are simply lost."""
        assert self.process is not None
        pid = self.process.pid
        os.killpg(pid, signal.SIGKILL)
        self.process.wait()
        self.process = None
        return pid

    def stop(self) -> None:
        stop_process(self.process, grace=15)
        self.process = None


class LabHarness:
    """`async with Harness(...) as h:` brings up the lab, the server and a worker (logged in to the lab's
    Vault), and takes them all down again, also when opening fails half-way."""

    def __init__(self, root: Path, cfg: Any, queue: str, *, log: Callable[[str], None] | None = None):
        self.root, self.cfg, self.queue = Path(root), cfg, queue
        self.targets = Path(cfg.inventory_path).parent
        self.journal = self.root / "actions.jsonl"
        self.server = TemporalServer(self.root / "temporal.db", self.root / "temporal.log")
        self.worker: WorkerProcess | None = None
        self.client: Any = None
        self.inventory: dict[str, Any] = {}
        self.lab_info: dict[str, Any] = {}
        self._log = log or (lambda message: None)

    async def __aenter__(self) -> Self:
        try:
            await self.open()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        from lab import lifecycle
        from lab.drills.outage import vault_token
        from runtime.connection import connect

        self.root.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self.lab_info = await asyncio.to_thread(lifecycle.up, self.cfg)
        self._log(f"lab up in {time.monotonic() - t0:.1f} s "
                  f"({', '.join(f'{k} {v}' for k, v in self.lab_info['backends'].items())})")
        self.inventory = read_inventory(self.lab_info["inventory"]).as_target()
        token = await asyncio.to_thread(vault_token, self.inventory)
        await asyncio.to_thread(self.server.start)
        self.client = await connect(target_host=self.server.address, namespace="default", ready_within=60)
        self.worker = WorkerProcess(self.server.address, self.queue, self.journal, self.root / "worker.log",
                                    {"VAULT_TOKEN": token, "COLDSTART_TARGETS": str(self.targets)})
        await asyncio.to_thread(self.worker.start)

    @property
    def controller_cgroup(self) -> str:
        """The CPU cgroup the controller's processes go to (lab down removes it with the lab's others)."""
        return f"coldstart-{self.cfg.prefix}-controller"

    def controller_pids(self) -> list[int]:
        """The controller's processes: the Temporal server and the worker (the host scripts it starts follow it)."""
        return [p for p in (self.server.process.pid if self.server.process else None, self.worker and self.worker.pid)
                if p is not None]

    def weigh_controller(self, weight: int | None) -> list[int]:
        """Give the controller's processes CPU weight `weight` in one cgroup, as a deployment reserves CPU for its
        controller (systemd's CPUWeight; every other group and session has 100), or None: back among every
        other process, at the same weight. Returns the PIDs moved; OSError where there is no CPU controller."""
        from lab import cgroups

        pids = self.controller_pids()
        if weight is not None:
            cgroups.weigh(self.controller_cgroup, pids, weight)
            return pids
        return cgroups.vacate(self.controller_cgroup)

    async def close(self) -> None:
        from lab import lifecycle

        if self.worker is not None:
            await asyncio.to_thread(self.worker.stop)
        await asyncio.to_thread(self.server.stop)
        await asyncio.to_thread(lifecycle.down, self.cfg)

    async def wait_for(self, what: str, check: Callable[[], Awaitable[Any] | Any], timeout: float = 120.0,
                       every: float = 0.05) -> Any:
        """Until check() is truthy (returning it); errors meanwhile (a daemon restarting) are asked again."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                value = check()
                if asyncio.iscoroutine(value):
                    value = await value
                if value:
                    return value
            except Exception as exc:  # noqa: BLE001 - the server restarting, the worker gone: ask again
                last = exc
            await asyncio.sleep(every)
        raise TimeoutError(f"waited {timeout:.0f} s for {what}" + (f" (last error: {last})" if last else ""))

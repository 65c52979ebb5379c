"""raw_exec-like task driver: runs task Config.command/args as real subprocesses, optionally inside a netns."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .listeners import setns

__all__ = ["ProcessDriver", "kill_signal"]


def kill_signal(task: dict[str, Any]) -> int:
    """The task's kill_signal; Nomad sends SIGINT when it names none."""
    name = (task.get("KillSignal") or "SIGINT").upper()
    try:
        return int(signal.Signals[name if name.startswith("SIG") else f"SIG{name}"])
    except KeyError:
        return int(signal.SIGINT)


def _enter_netns(netns: str) -> Callable[[], None]:
    def _pre() -> None:  # runs in the forked child only
        fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        setns(fd)
        os.close(fd)

    return _pre


class ProcessDriver:
    """Starts, watches and kills task processes; reports exits through a callback."""

    def __init__(self, base_dir: Path | None = None) -> None:
        # Without a state dir, task dirs live in a private temp dir removed at shutdown.
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="nomad-standin-"))
        self.procs: dict[str, dict[str, asyncio.subprocess.Process]] = {}
        self._watchers: set[asyncio.Task] = set()

    async def start(
        self,
        alloc_id: str,
        task: dict[str, Any],
        env: dict[str, str],
        netns: str | None,
        on_exit: Callable[[str, str, int], None],
    ) -> None:
        """Launch one task; raises OSError if it cannot be started."""
        config = task.get("Config") or {}
        command = config.get("command")
        args = [str(a) for a in (config.get("args") or [])]
        logs = self.base_dir / alloc_id / "alloc" / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        workdir = self.base_dir / alloc_id / task["Name"]
        workdir.mkdir(parents=True, exist_ok=True)
        # Local files, like the directories above: nothing there is worth a thread. The child keeps its copies.
        with (
            open(logs / f"{task['Name']}.stdout.0", "ab") as out,  # noqa: ASYNC230
            open(logs / f"{task['Name']}.stderr.0", "ab") as err,  # noqa: ASYNC230
        ):
            proc = await asyncio.create_subprocess_exec(
                command,
                *args,
                stdout=out,
                stderr=err,
                stdin=asyncio.subprocess.DEVNULL,
                cwd=workdir,
                env={**os.environ, **env},
                # Own process group so stopping the alloc kills the whole task tree.
                start_new_session=True,
                preexec_fn=_enter_netns(netns) if netns else None,
            )
        proc.kill_signal = kill_signal(task)  # type: ignore[attr-defined]
        self.procs.setdefault(alloc_id, {})[task["Name"]] = proc
        watcher = asyncio.create_task(self._watch(alloc_id, task["Name"], proc, on_exit))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def _watch(self, alloc_id: str, task_name: str, proc, on_exit) -> None:
        code = await proc.wait()
        tasks = self.procs.get(alloc_id, {})
        if tasks.get(task_name) is proc:
            del tasks[task_name]
            if not tasks:
                self.procs.pop(alloc_id, None)
        on_exit(alloc_id, task_name, code)

    def running(self, alloc_id: str) -> bool:
        return bool(self.procs.get(alloc_id))

    async def kill(self, alloc_id: str, timeout: float = 5.0) -> None:
        """Send each task its kill_signal (SIGINT by default), SIGKILL after the kill timeout, as Nomad does."""
        procs = list(self.procs.get(alloc_id, {}).values())
        for proc in procs:
            _signal_group(proc, getattr(proc, "kill_signal", signal.SIGINT))
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                _signal_group(proc, signal.SIGKILL)
                await proc.wait()

    async def kill_all(self) -> None:
        await asyncio.gather(*(self.kill(a, 2.0) for a in list(self.procs)), return_exceptions=True)
        for watcher in list(self._watchers):
            watcher.cancel()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)


def _signal_group(proc, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass

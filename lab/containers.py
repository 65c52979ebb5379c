"""Session containers of a lab host: a PID namespace and a cgroup each, a workload on a unix socket, one store entry per repl."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

__all__ = ["ContainerHost", "Refused", "SessionContainer", "SessionStore", "cgroup_root", "remove_sessions_cgroup",
           "session_answers", "sessions_cgroup"]

# The workload, one process: PID 1 of the namespace joins the container's cgroup first (so `unshare`,
# its parent, stays outside like a runtime's shim and reaps it without holding the cgroup), then answers
# on the container's unix socket; SIGTERM drains for `drain` seconds (still answering), then it exits.
_SERVE = (
    "import os,signal,socket,sys\n"
    "path,name,drain=sys.argv[1],sys.argv[2],float(sys.argv[3])\n"
    "with open(os.environ['CGROUP_PROCS'],'w') as f: f.write('0')\n"
    "signal.signal(signal.SIGALRM,lambda *_: os._exit(0))\n"
    "signal.signal(signal.SIGTERM,lambda *_: signal.getitimer(signal.ITIMER_REAL)[0] or "
    "signal.setitimer(signal.ITIMER_REAL,max(drain,0.001)))\n"
    "try: os.unlink(path)\n"
    "except OSError: pass\n"
    "s=socket.socket(socket.AF_UNIX); s.bind(path); s.listen(64)\n"
    "while True:\n"
    "  c,_=s.accept()\n"
    "  c.sendall(b'ok '+name.encode()+b'\\n'); c.close()\n"
)


def cgroup_root() -> Path:
    """Where per-container cgroups go: the unified hierarchy, else v1's pids hierarchy (what containers.kill_inits reads)."""
    root = Path("/sys/fs/cgroup")
    return root if (root / "cgroup.controllers").exists() else root / "pids"


def sessions_cgroup(prefix: str) -> str:
    """The lab's parent cgroup for session containers (inventory fact sessions.cgroup_parent)."""
    return f"coldstart-{prefix}-sessions"


def _procs(group: Path) -> list[int]:
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _rmdir_when_empty(group: Path, timeout: float = 2.0) -> bool:
    # A cgroup empties a moment after its last process is reaped.
    deadline = time.monotonic() + timeout
    while True:
        try:
            group.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def remove_sessions_cgroup(prefix: str) -> list[str]:
    """Kill whatever is left in the lab's session cgroups and remove them (`lab down`, after a crash too)."""
    base = cgroup_root() / sessions_cgroup(prefix)
    if not base.is_dir():
        return []
    removed = []
    for group in sorted(p for p in base.iterdir() if p.is_dir()):
        for pid in _procs(group):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if _rmdir_when_empty(group, timeout=5.0):
            removed.append(group.name)
    _rmdir_when_empty(base, timeout=1.0)
    return removed


def _value(entry: dict[str, Any]) -> Any:
    """A KV entry's value as JSON; None when it is not JSON."""
    try:
        return json.loads(base64.b64decode(entry["Value"] or b""))
    except ValueError:
        return None


class Refused(Exception):
    """A container the platform must not start (cordoned host, repl held elsewhere)."""


class SessionStore:
    """The global store: Consul KV `<prefix>repls/<repl>` -> the repl's one container, `<prefix>hosts/<host>` -> cordon."""

    def __init__(self, consul_url: str, token: str | None, prefix: str = "sessions/") -> None:
        headers = {"X-Consul-Token": token} if token else {}
        self.prefix = prefix
        self._http = httpx.AsyncClient(base_url=consul_url, headers=headers, timeout=5.0)

    async def close(self) -> None:
        await self._http.aclose()

    async def _get(self, key: str) -> tuple[int, dict[str, Any]] | None:
        r = await self._http.get(f"/v1/kv/{key}")
        if r.status_code == 404:
            return None
        r.raise_for_status()
        entry = r.json()[0]
        return entry["ModifyIndex"], _value(entry) or {}

    async def cordon_reason(self, host: str) -> str | None:
        found = await self._get(f"{self.prefix}hosts/{host}")
        if found and found[1].get("schedulable") is False:
            return str(found[1].get("reason") or "cordoned")
        return None

    async def uncordon(self, host: str) -> None:
        (await self._http.delete(f"/v1/kv/{self.prefix}hosts/{host}")).raise_for_status()

    async def claim(self, repl: str, entry: dict[str, Any]) -> dict[str, Any] | None:
        """Create the repl's entry if it has none (check-and-set 0); else the entry that holds it."""
        r = await self._http.put(f"/v1/kv/{self.prefix}repls/{repl}", params={"cas": 0}, content=json.dumps(entry))
        r.raise_for_status()
        if r.json() is True:
            return None
        found = await self._get(f"{self.prefix}repls/{repl}")
        return found[1] if found else {"repl": repl, "container": "?"}

    async def entries(self) -> list[dict[str, Any]]:
        """Every repl's entry."""
        r = await self._http.get(f"/v1/kv/{self.prefix}repls/", params={"recurse": "true"})
        if r.status_code == 404:
            return []
        r.raise_for_status()
        return [value for entry in r.json() if (value := _value(entry)) is not None]

    async def drop(self, repl: str, container: str) -> bool:
        """Delete the repl's entry only while it still points at `container` (check-and-set on its index)."""
        found = await self._get(f"{self.prefix}repls/{repl}")
        if not found or found[1].get("container") != container:
            return False
        r = await self._http.delete(f"/v1/kv/{self.prefix}repls/{repl}", params={"cas": found[0]})
        r.raise_for_status()
        return r.json() is True


@dataclass
class SessionContainer:
    name: str
    repl: str
    socket: Path
    group: Path
    proc: asyncio.subprocess.Process
    started_at: float = field(default_factory=time.time)

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    @property
    def init_pid(self) -> int | None:
        # unshare --fork: the namespace's PID 1 is unshare's only child.
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None


class ContainerHost:
    """Starts, lists and stops the containers of one host; the store entry is claimed before a container starts."""

    def __init__(self, host: str, prefix: str, state_dir: Path, store: SessionStore | None, drain_s: float = 0.5):
        self.host, self.store, self.drain_s = host, store, drain_s
        self.base = cgroup_root() / sessions_cgroup(prefix)
        self.sockets = Path(state_dir) / "sessions"
        self.containers: dict[str, SessionContainer] = {}
        self._reapers: set[asyncio.Task] = set()

    def live_count(self) -> int:
        """Containers of this host with a process left, read from their cgroups (not from our bookkeeping)."""
        if not self.base.is_dir():
            return 0
        mine = f"{self.host}-"
        return sum(1 for g in self.base.iterdir() if g.is_dir() and g.name.startswith(mine) and _procs(g))

    def describe(self) -> list[dict[str, Any]]:
        return [{"name": c.name, "repl": c.repl, "socket": str(c.socket), "init_pid": c.init_pid, "running": c.running}
                for c in self.containers.values()]

    async def start(self, repl: str) -> SessionContainer:
        name = f"{self.host}-{repl}"
        if (held := self.containers.get(name)) and held.running:
            return held  # idempotent: this repl already runs here
        if self.store is not None:
            if reason := await self.store.cordon_reason(self.host):
                raise Refused(f"{self.host} is cordoned ({reason}): no new container")
            entry = {"repl": repl, "container": name, "host": self.host,
                     "socket": str(self.sockets / f"{repl}.sock"), "started_at": round(time.time(), 3)}
            holder = await self.store.claim(repl, entry)
            if holder is not None:
                raise Refused(f"repl {repl} is held by container {holder.get('container')} on "
                              f"{holder.get('host', '?')}: at most one container per repl")
        try:
            return await self._launch(name, repl)
        except BaseException:
            if self.store is not None:
                await self.store.drop(repl, name)
            raise

    async def _launch(self, name: str, repl: str) -> SessionContainer:
        self.base.mkdir(exist_ok=True)
        self.sockets.mkdir(parents=True, exist_ok=True)
        group = self.base / name
        group.mkdir(exist_ok=True)
        sock = self.sockets / f"{repl}.sock"
        env = {**os.environ, "CGROUP_PROCS": str(group / "cgroup.procs")}
        proc = await asyncio.create_subprocess_exec(
            "unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-I", "-S", "-c", _SERVE, str(sock), name,
            f"{self.drain_s:g}", env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        container = SessionContainer(name=name, repl=repl, socket=sock, group=group, proc=proc)
        self.containers[name] = container
        reaper = asyncio.create_task(self._reap(container))
        self._reapers.add(reaper)
        reaper.add_done_callback(self._reapers.discard)
        return container

    async def _reap(self, container: SessionContainer) -> None:
        await container.proc.wait()
        # Like a runtime after its container ends: its cgroup goes (the store entry is not ours to touch).
        await asyncio.to_thread(_rmdir_when_empty, container.group)

    async def wait_answering(self, containers: list[SessionContainer], timeout: float = 90.0) -> list[str]:
        """Wait until each container's session answers; returns those that never did.

        90 s: 200 containers took 41 s to answer on 2 cores at load average 10 (a test suite beside
        the drain bench), where 20 s failed the drill before it measured anything."""
        deadline = time.monotonic() + timeout
        pending = list(containers)
        while pending and time.monotonic() < deadline:
            pending = [c for c in pending if not await session_answers(c.socket)]
            if pending:
                await asyncio.sleep(0.05)
        return [c.name for c in pending]

    async def stop_all(self, how: str, timeout: float = 10.0, release: bool = False) -> dict[str, Any]:
        """Stop every container: `fast_path`/`forced` SIGKILL each namespace init, `graceful` SIGTERM then
        SIGKILL after `timeout`. With `release`, then drop each stopped container's store entry (CAS)."""
        started = time.monotonic()
        live = [c for c in self.containers.values() if c.running]
        sig = signal.SIGTERM if how == "graceful" else signal.SIGKILL
        for c in live:
            pid = c.init_pid
            if pid:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        results = await asyncio.gather(*(asyncio.wait_for(c.proc.wait(), timeout) for c in live),
                                       return_exceptions=True)
        leftovers = [c for c, res in zip(live, results, strict=True) if isinstance(res, asyncio.TimeoutError)]
        for c in leftovers:  # the polite stop was ignored: finish it the hard way
            if pid := c.init_pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            await c.proc.wait()
        stopped = time.monotonic() - started
        released = 0
        if release and self.store is not None:
            for c in live:
                released += bool(await self.store.drop(c.repl, c.name))
        for c in live:
            self.containers.pop(c.name, None)
        return {"stopped": len(live), "how": how, "seconds": round(stopped, 4), "timed_out": len(leftovers),
                "released": released, "released_after_seconds": round(time.monotonic() - started, 4)}

    async def close(self) -> None:
        await self.stop_all("forced")
        for task in list(self._reapers):
            await task


async def session_answers(sock: Path, timeout: float = 0.5) -> bool:
    """True when the session behind the unix socket answers (a dead container's socket refuses)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(sock)), timeout)
    except (TimeoutError, OSError):
        return False
    try:
        return (await asyncio.wait_for(reader.readline(), timeout)).startswith(b"ok")
    except (TimeoutError, OSError):
        return False
    finally:
        writer.close()

"""Cache-node agent: exports the local Redis's state and runs the node's containers (PID namespaces) and preemption notices."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import RedisError

from lab.serving import serve_app, stop_on_signals

__all__ = ["Container", "NodeAgent", "main"]

# Each container is a little process tree: an init (sh) with two workers. sh as PID 1 of a
# namespace ignores SIGTERM (no handler), like many container entrypoints: a "polite" stop
# waits out its whole timeout, which is the slow path seed 001 describes.
CONTAINER_SCRIPT = "sleep 86400 & sleep 86400 & wait"


class Container:
    """`unshare --pid --fork --mount-proc` started from here; `init_pid` is PID 1 inside it."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process) -> None:
        self.name, self.proc = name, proc
        self.init_pid: int | None = None

    async def find_init(self, timeout: float = 2.0) -> int | None:
        # unshare --fork: the namespace's PID 1 is unshare's only child.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
            except OSError:
                children = []
            if children:
                self.init_pid = int(children[0])
                return self.init_pid
            await asyncio.sleep(0.02)
        return None

    @property
    def running(self) -> bool:
        return self.proc.returncode is None


class NodeAgent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.redis = Redis.from_pool(BlockingConnectionPool(
            host="127.0.0.1", port=args.redis_port, max_connections=2, timeout=None,
            socket_timeout=0.5, socket_connect_timeout=0.5))
        self.containers: list[Container] = []
        self.notice_deadline: float | None = None
        self.registry = CollectorRegistry()
        r = self.registry
        self.redis_up = Gauge("coldstart_lab_redis_up", "1 if the local redis answers PING", registry=r)
        self.redis_keys = Gauge("coldstart_lab_redis_keys", "keys in the local redis", registry=r)
        self.running_g = Gauge("coldstart_lab_containers_running", "containers alive on this node", registry=r)
        self.notice_g = Gauge("coldstart_lab_preemption_notice_seconds",
                              "seconds left before forced termination; -1 when no notice", registry=r)
        self.stopped = Counter("coldstart_lab_containers_stopped", "containers stopped, by how", ["how"], registry=r)
        self.stop_seconds = Gauge("coldstart_lab_container_stop_seconds",
                                  "wall time of the last stop of all containers", ["how"], registry=r)
        for how in ("fast_path", "graceful", "forced"):
            self.stopped.labels(how)
        self.notice_g.set(-1)

    # ---- containers ----------------------------------------------------------------------
    async def start_containers(self, count: int) -> list[dict]:
        for i in range(count):
            proc = await asyncio.create_subprocess_exec(
                "unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", CONTAINER_SCRIPT,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            c = Container(f"{self.args.node}-c{len(self.containers) + 1}", proc)
            await c.find_init()
            self.containers.append(c)
        return self.describe()

    def describe(self) -> list[dict]:
        return [{"name": c.name, "unshare_pid": c.proc.pid, "init_pid": c.init_pid, "running": c.running}
                for c in self.containers]

    async def stop_containers(self, how: str, timeout: float = 10.0) -> dict:
        started = time.monotonic()
        live = [c for c in self.containers if c.running]
        sig = signal.SIGKILL if how in ("fast_path", "forced") else signal.SIGTERM
        for c in live:
            if c.init_pid:
                try:
                    # Killing PID 1 of the namespace makes the kernel SIGKILL everything in it.
                    os.kill(c.init_pid, sig)
                except ProcessLookupError:
                    pass
        waits = [asyncio.wait_for(c.proc.wait(), timeout) for c in live]
        results = await asyncio.gather(*waits, return_exceptions=True)
        leftovers = [c for c, res in zip(live, results) if isinstance(res, asyncio.TimeoutError)]
        for c in leftovers:  # polite stop ignored: finish the job the fast way
            if c.init_pid:
                try:
                    os.kill(c.init_pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            await c.proc.wait()
        elapsed = time.monotonic() - started
        self.stopped.labels(how).inc(len(live))
        self.stop_seconds.labels(how).set(elapsed)
        self.containers = [c for c in self.containers if c.running]
        return {"stopped": len(live), "how": how, "seconds": round(elapsed, 3), "timed_out": len(leftovers)}

    async def preempt(self, notice_s: float) -> None:
        self.notice_deadline = time.monotonic() + notice_s
        await asyncio.sleep(notice_s)
        if self.notice_deadline is not None:
            # The provider pulls the plug: whatever still runs dies now.
            await self.stop_containers("forced")
            self.notice_deadline = None

    # ---- metrics -------------------------------------------------------------------------
    async def collect(self) -> bytes:
        try:
            await self.redis.ping()
            self.redis_up.set(1)
            self.redis_keys.set(await self.redis.dbsize())
        except RedisError:
            self.redis_up.set(0)
            self.redis_keys.set(0)
        self.running_g.set(sum(1 for c in self.containers if c.running))
        left = self.notice_deadline - time.monotonic() if self.notice_deadline is not None else -1
        self.notice_g.set(max(left, 0) if self.notice_deadline is not None else -1)
        return generate_latest(self.registry)


async def serve(args: argparse.Namespace) -> None:
    agent = NodeAgent(args)
    await agent.start_containers(args.containers)
    tasks: set[asyncio.Task] = set()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=await agent.collect(), content_type="text/plain", charset="utf-8")

    async def containers(_: web.Request) -> web.Response:
        return web.json_response({"node": args.node, "containers": agent.describe()})

    async def start(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        count = int(body.get("count", 1))
        if not 0 < count <= 64:
            return web.json_response({"error": "count must be 1..64"}, status=400)
        return web.json_response({"containers": await agent.start_containers(count)})

    async def stop(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        how = body.get("method", "fast_path")
        if how not in ("fast_path", "graceful"):
            return web.json_response({"error": "method is fast_path or graceful"}, status=400)
        return web.json_response(await agent.stop_containers(how, float(body.get("timeout_s", 10.0))))

    async def preempt(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        notice = float(body.get("notice_s", args.notice_s))
        task = asyncio.create_task(agent.preempt(notice))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return web.json_response({"node": args.node, "notice_s": notice, "containers": agent.describe()})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/containers", containers)
    app.router.add_post("/containers/start", start)
    app.router.add_post("/containers/stop", stop)
    app.router.add_post("/_lab/preempt", preempt)
    runner = await serve_app(app, args.listen)
    stop_ev = stop_on_signals()
    print(f"node agent {args.node} on {args.listen} with {args.containers} containers", flush=True)
    await stop_ev.wait()
    for task in list(tasks):
        task.cancel()
    await agent.stop_containers("fast_path")
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.node_agent", description=__doc__)
    ap.add_argument("--node", required=True)
    ap.add_argument("--listen", required=True, help="HOST:PORT")
    ap.add_argument("--redis-port", type=int, default=6379)
    ap.add_argument("--containers", type=int, default=0)
    ap.add_argument("--notice-s", type=float, default=30.0)
    asyncio.run(serve(ap.parse_args(argv)))


if __name__ == "__main__":
    main()

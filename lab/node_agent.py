"""Cache-node agent: exports the local Redis's state and runs the node's containers (PID namespaces) and preemption notices."""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import RedisError

from lab.containers import ContainerHost, Refused, SessionStore
from lab.serving import serve_app, stop_on_signals

__all__ = ["NodeAgent", "main"]

class NodeAgent:
    def __init__(self, args: argparse.Namespace, store: SessionStore | None = None) -> None:
        self.args = args
        self.redis = Redis.from_pool(BlockingConnectionPool(
            host="127.0.0.1", port=args.redis_port, max_connections=2, timeout=None,
            socket_timeout=0.5, socket_connect_timeout=0.5))
        self.store = store
        self.host = ContainerHost(args.node, args.prefix, Path(args.state_dir), store, drain_s=args.drain_s)
        self.notice_deadline: float | None = None  # unix time the provider terminates the host
        self.booting = False  # still starting the containers it was started with
        self._plug: asyncio.Task | None = None
        self.registry = CollectorRegistry()
        r = self.registry
        self.redis_up = Gauge("coldstart_lab_redis_up", "1 if the local redis answers PING", registry=r)
        self.redis_keys = Gauge("coldstart_lab_redis_keys", "keys in the local redis", registry=r)
        self.running_g = Gauge("coldstart_lab_containers_running", "containers alive on this node", registry=r)
        self.host_containers = Gauge("coldstart_host_containers",
                                     "session containers with a process left on the host, read from their cgroups",
                                     ["host"], registry=r)
        self.notice_g = Gauge("coldstart_lab_preemption_notice_seconds",
                              "seconds left before forced termination; -1 when no notice", registry=r)
        self.deadline_g = Gauge("coldstart_host_preemption_deadline_timestamp_seconds",
                                "when the provider terminates the host (unix seconds); 0 without a notice",
                                ["host"], registry=r)
        self.stopped = Counter("coldstart_lab_containers_stopped", "containers stopped, by how", ["how"], registry=r)
        self.stop_seconds = Gauge("coldstart_lab_container_stop_seconds",
                                  "wall time of the last stop of all containers", ["how"], registry=r)
        for how in ("fast_path", "graceful", "forced"):
            self.stopped.labels(how)
        self.notice_g.set(-1)

    # ---- containers ----------------------------------------------------------------------
    async def start_containers(self, repls: list[str], parallel: int = 16) -> list[dict]:
        """Start one container per repl (claimed in the store first), `parallel` at a time; wait until they answer."""
        gate = asyncio.Semaphore(parallel)

        async def one(repl: str):
            async with gate:
                return await self.host.start(repl)

        started = await asyncio.gather(*(one(r) for r in repls))
        silent = await self.host.wait_answering(list(started))
        if silent:
            raise RuntimeError(f"containers never answered: {', '.join(silent[:10])}")
        return self.host.describe()

    def describe(self) -> list[dict]:
        return self.host.describe()

    async def stop_containers(self, how: str, timeout: float = 10.0, release: bool = False) -> dict:
        result = await self.host.stop_all(how, timeout, release=release)
        self.stopped.labels(how).inc(result["stopped"])
        self.stop_seconds.labels(how).set(result["seconds"])
        return result

    def preempt(self, notice_s: float) -> float:
        """A preemption notice: the provider terminates the host `notice_s` from now (forced stop of what's left)."""
        if self.notice_deadline is None:
            self.notice_deadline = time.time() + notice_s
            self._plug = asyncio.create_task(self._pull_the_plug())
        return self.notice_deadline

    async def _pull_the_plug(self) -> None:
        assert self.notice_deadline is not None
        await asyncio.sleep(max(0.0, self.notice_deadline - time.time()))
        # The provider terminates the VM: whatever still runs dies now, and the notice goes with the VM
        # (the lab's agent stays, as the host's replacement, but not uncordoned: that is provisioning's job).
        await self.stop_containers("forced")
        self.notice_deadline = None

    async def reset(self) -> dict:
        """The host replaced by a fresh one: no notice, not cordoned, and no store entry left pointing at a
        container of the old one (a set-up that failed half-way, say a graceful stop cut short, leaves some)."""
        if self._plug is not None:
            self._plug.cancel()
            self._plug = None
        self.notice_deadline = None
        released = 0
        if self.store is not None:
            await self.store.uncordon(self.args.node)
            live = {c["name"] for c in self.host.describe() if c["running"]}
            for entry in await self.store.entries():
                if entry.get("host") == self.args.node and entry.get("container") not in live:
                    released += await self.store.drop(str(entry.get("repl")), str(entry.get("container")))
        return {"node": self.args.node, "notice": None, "cordoned": False, "stale_entries_released": released}

    # ---- cloud metadata ------------------------------------------------------------------
    def gce_preempted(self) -> str:
        return "TRUE" if self.notice_deadline is not None else "FALSE"

    def aws_instance_action(self) -> dict | None:
        if self.notice_deadline is None:
            return None
        when = datetime.fromtimestamp(self.notice_deadline, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"action": "terminate", "time": when}

    # ---- metrics -------------------------------------------------------------------------
    async def collect(self) -> bytes:
        try:
            await self.redis.ping()
            self.redis_up.set(1)
            self.redis_keys.set(await self.redis.dbsize())
        except RedisError:
            self.redis_up.set(0)
            self.redis_keys.set(0)
        live = await asyncio.to_thread(self.host.live_count)
        self.running_g.set(live)
        self.host_containers.labels(self.args.node).set(live)
        left = self.notice_deadline - time.time() if self.notice_deadline is not None else -1
        self.notice_g.set(max(left, 0) if self.notice_deadline is not None else -1)
        self.deadline_g.labels(self.args.node).set(self.notice_deadline or 0)
        return generate_latest(self.registry)


def _repl(i: int) -> str:
    return f"r{i:04d}"


async def serve(args: argparse.Namespace) -> None:
    store = None
    if args.consul:
        token = Path(args.token_file).read_text().strip() if args.token_file else None
        store = SessionStore(args.consul, token, args.store_prefix)
    agent = NodeAgent(args, store)

    async def body(request: web.Request) -> dict:
        if not request.can_read_body:
            return {}
        data = await request.json()
        if not isinstance(data, dict):
            raise web.HTTPBadRequest(text="a JSON object is expected")
        return data

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=await agent.collect(), content_type="text/plain", charset="utf-8")

    async def containers(_: web.Request) -> web.Response:
        return web.json_response({"node": args.node, "booting": agent.booting, "containers": agent.describe()})

    async def start(request: web.Request) -> web.Response:
        data = await body(request)
        repls = data.get("repls")
        if repls is None:
            first = int(data.get("first", 1))
            repls = [_repl(i) for i in range(first, first + int(data.get("count", 1)))]
        if not (isinstance(repls, list) and 0 < len(repls) <= 1000 and all(isinstance(r, str) for r in repls)):
            return web.json_response({"error": "repls: 1 to 1000 names (or count and first)"}, status=400)
        try:
            return web.json_response({"containers": await agent.start_containers(repls)})
        except Refused as exc:
            return web.json_response({"error": str(exc)}, status=409)
        except RuntimeError as exc:  # started, but some never answered (a loaded host): say which
            return web.json_response({"error": str(exc)}, status=503)

    async def stop(request: web.Request) -> web.Response:
        data = await body(request)
        how = data.get("method", "fast_path")
        if how not in ("fast_path", "graceful"):
            return web.json_response({"error": "method is fast_path or graceful"}, status=400)
        return web.json_response(await agent.stop_containers(how, float(data.get("timeout_s", 10.0)),
                                                             release=bool(data.get("release", False))))

    async def preempt(request: web.Request) -> web.Response:
        notice = float((await body(request)).get("notice_s", args.notice_s))
        deadline = agent.preempt(notice)
        return web.json_response({"node": args.node, "notice_s": notice, "deadline": deadline,
                                  "containers": agent.describe()})

    async def reset(_: web.Request) -> web.Response:
        return web.json_response(await agent.reset())

    # Cloud metadata, as the providers serve it to the VM (GCE needs its header; AWS answers 404 until a notice).
    async def gce_preempted(request: web.Request) -> web.Response:
        if request.headers.get("Metadata-Flavor") != "Google":
            return web.Response(status=403, text="Missing Metadata-Flavor:Google header.")
        return web.Response(text=agent.gce_preempted(), headers={"Metadata-Flavor": "Google"})

    async def aws_instance_action(_: web.Request) -> web.Response:
        action = agent.aws_instance_action()
        return web.json_response(action) if action else web.Response(status=404, text="Not Found")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/containers", containers)
    app.router.add_post("/containers/start", start)
    app.router.add_post("/containers/stop", stop)
    app.router.add_post("/_lab/preempt", preempt)
    app.router.add_post("/_lab/reset", reset)
    app.router.add_get("/computeMetadata/v1/instance/preempted", gce_preempted)
    app.router.add_get("/latest/meta-data/spot/instance-action", aws_instance_action)
    runner = await serve_app(app, args.listen)
    stop_ev = stop_on_signals()
    # Listening first: a host with hundreds of containers answers (and is scraped) while they start.
    began = time.monotonic()
    agent.booting = True
    try:
        await agent.start_containers([_repl(i) for i in range(1, args.containers + 1)])
    finally:
        agent.booting = False
    print(f"node agent {args.node} on {args.listen}: {args.containers} containers serving after "
          f"{time.monotonic() - began:.1f} s", flush=True)
    await stop_ev.wait()
    if agent._plug is not None:
        agent._plug.cancel()
    await agent.host.close()
    if store is not None:
        await store.close()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.node_agent", description=__doc__)
    ap.add_argument("--node", required=True)
    ap.add_argument("--listen", required=True, help="HOST:PORT")
    ap.add_argument("--redis-port", type=int, default=6379)
    ap.add_argument("--containers", type=int, default=0, help="session containers to start, repls r0001..")
    ap.add_argument("--notice-s", type=float, default=30.0)
    ap.add_argument("--prefix", default="cs", help="the lab's prefix (names its session cgroup)")
    ap.add_argument("--state-dir", default=".state/lab", help="where the sessions' unix sockets go")
    ap.add_argument("--consul", help="Consul URL of the global store (none: containers are not registered)")
    ap.add_argument("--token-file")
    ap.add_argument("--store-prefix", default="sessions/")
    ap.add_argument("--drain-s", type=float, default=0.5, help="what a container's graceful stop takes")
    asyncio.run(serve(ap.parse_args(argv)))


if __name__ == "__main__":
    main()

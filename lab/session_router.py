"""Session router: serves players their repl's container by the global store and measures stuck sessions."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from lab.containers import session_answers
from lab.serving import serve_app, stop_on_signals

__all__ = ["SessionRouter", "main"]

# Stuck episodes last from well under a second (a fast drain) to minutes (a stop waited out past the notice).
STUCK_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)


class SessionRouter:
    """Polls the store; a session is stuck while its repl points at a container that does not answer."""

    def __init__(self, consul_url: str, token: str | None, prefix: str, http: httpx.AsyncClient | None = None):
        self.prefix = f"{prefix}repls/"
        self._http = http or httpx.AsyncClient(base_url=consul_url, timeout=2.0,
                                               headers={"X-Consul-Token": token} if token else {})
        self.entries: dict[str, dict[str, Any]] = {}
        self.stuck_since: dict[str, float] = {}
        self.store_errors = 0
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions = Gauge("coldstart_sessions", "sessions by state", ["state"], registry=r)
        self.stuck = Histogram("coldstart_session_stuck_seconds",
                               "length of each stuck episode (repl pointing at a container that does not answer), "
                               "observed when it ends", buckets=STUCK_BUCKETS, registry=r)
        self.oldest = Gauge("coldstart_session_stuck_oldest_seconds", "the longest ongoing stuck episode",
                            registry=r)
        self.polled = Gauge("coldstart_session_router_poll_timestamp_seconds",
                            "when the store read behind the session numbers started (unix seconds)", registry=r)
        self.errors = Gauge("coldstart_session_router_store_errors", "store reads that failed since start",
                            registry=r)
        for state in ("serving", "stuck"):
            self.sessions.labels(state).set(0)

    async def _read_store(self) -> dict[str, dict[str, Any]]:
        r = await self._http.get(f"/v1/kv/{self.prefix}", params={"recurse": "true"})
        if r.status_code == 404:
            return {}
        r.raise_for_status()
        found = {}
        for entry in r.json():
            try:
                value = json.loads(base64.b64decode(entry.get("Value") or b""))
            except ValueError:
                continue
            if isinstance(value, dict) and value.get("socket"):
                found[value.get("repl") or entry["Key"].rsplit("/", 1)[-1]] = value
        return found

    async def poll(self) -> None:
        """One round: read the store, probe every repl's container, end or start stuck episodes."""
        started = time.time()
        try:
            self.entries = await self._read_store()
        except (httpx.HTTPError, ValueError):
            # Store unreachable: keep probing what we last knew, and count it.
            self.store_errors += 1
            self.errors.set(self.store_errors)
            return
        # A dead container's socket refuses at once; the timeout only decides when a live but slow one counts as
        # stuck, and a second keeps a loaded machine's slow scheduling from reading as stuck players.
        answers = await asyncio.gather(*(session_answers(Path(e["socket"]), timeout=1.0)
                                         for e in self.entries.values()))
        now = time.time()
        stuck_now = {repl for repl, ok in zip(self.entries, answers, strict=True) if not ok}
        for repl in list(self.stuck_since):
            if repl not in stuck_now:  # answered again, or its entry is gone (released): the episode ends
                self.stuck.observe(now - self.stuck_since.pop(repl))
        for repl in stuck_now:
            self.stuck_since.setdefault(repl, now)
        self.sessions.labels("stuck").set(len(stuck_now))
        self.sessions.labels("serving").set(len(self.entries) - len(stuck_now))
        self.oldest.set(max((now - t for t in self.stuck_since.values()), default=0))
        self.polled.set(started)

    async def route(self, repl: str) -> tuple[int, str]:
        """What a player opening `repl` gets: its container's answer, 502 while stuck, 404 with no container."""
        entry = self.entries.get(repl)
        if entry is None:
            return 404, f"repl {repl} has no container: start one\n"
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(entry["socket"]), 0.5)
        except (TimeoutError, OSError):
            return 502, f"repl {repl}: container {entry.get('container')} on {entry.get('host')} does not answer\n"
        try:
            return 200, (await asyncio.wait_for(reader.readline(), 0.5)).decode(errors="replace")
        except (TimeoutError, OSError):
            return 502, f"repl {repl}: container {entry.get('container')} hung up\n"
        finally:
            writer.close()

    async def close(self) -> None:
        await self._http.aclose()


async def serve(args: argparse.Namespace) -> None:
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    router = SessionRouter(args.consul, token, args.store_prefix)

    async def loop() -> None:
        while True:
            began = time.monotonic()
            await router.poll()
            await asyncio.sleep(max(0.0, args.interval - (time.monotonic() - began)))

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(router.registry), content_type="text/plain", charset="utf-8")

    async def repl(request: web.Request) -> web.Response:
        code, text = await router.route(request.match_info["repl"])
        return web.Response(status=code, text=text)

    async def sessions(_: web.Request) -> web.Response:
        now = time.time()
        return web.json_response({"sessions": len(router.entries),
                                  "stuck": {r: round(now - t, 3) for r, t in sorted(router.stuck_since.items())}})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/repl/{repl}", repl)
    app.router.add_get("/sessions", sessions)
    poller = asyncio.create_task(loop())
    runner = await serve_app(app, args.listen)
    stop = stop_on_signals()
    print(f"session router on {args.listen}, store {args.consul} {args.store_prefix}", flush=True)
    await stop.wait()
    poller.cancel()
    await router.close()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.session_router", description=__doc__)
    ap.add_argument("--listen", required=True, help="HOST:PORT")
    ap.add_argument("--consul", required=True)
    ap.add_argument("--token-file")
    ap.add_argument("--store-prefix", default="sessions/")
    ap.add_argument("--interval", type=float, default=0.25, help="seconds between store reads and probes")
    asyncio.run(serve(ap.parse_args(argv)))


if __name__ == "__main__":
    main()

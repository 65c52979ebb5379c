"""The lab daemons' shared frame: an aiohttp app served on HOST:PORT, and a stop on SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import signal

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

__all__ = ["metrics_app", "serve_app", "stop_on_signals"]


async def serve_app(app: web.Application, listen: str, *, backlog: int = 128) -> web.AppRunner:
    """Serve `app` on HOST:PORT until the returned runner is cleaned up."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    host, _, port = listen.rpartition(":")
    await web.TCPSite(runner, host, int(port), backlog=backlog).start()
    return runner


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM: the daemon's cue to clean up and exit."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def metrics_app(registry: CollectorRegistry) -> web.Application:
    """An app serving `registry` on /metrics, as Prometheus scrapes it."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app

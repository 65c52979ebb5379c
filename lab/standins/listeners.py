"""Listener specs, sockets bound inside network namespaces, and serving aiohttp apps on them."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

__all__ = ["LABEL", "ListenSpec", "bind_socket", "parse_listen", "serve_forever", "setns", "start_sites"]

CLONE_NEWNET = 0x40000000
LABEL = web.AppKey("standin_label", str)  # what a listener serves, for the startup log


@dataclass(frozen=True)
class ListenSpec:
    """`[NETNS:]HOST:PORT` -- NETNS names a namespace under /run/netns."""

    host: str
    port: int
    netns: str | None = None

    def __str__(self) -> str:
        prefix = f"{self.netns}:" if self.netns else ""
        return f"{prefix}{self.host}:{self.port}"


def parse_listen(text: str) -> ListenSpec:
    parts = text.split(":")
    if len(parts) == 2:
        return ListenSpec(parts[0], int(parts[1]))
    if len(parts) == 3:
        return ListenSpec(parts[1], int(parts[2]), parts[0])
    raise ValueError(f"listen address must be [NETNS:]HOST:PORT, got {text!r}")


def setns(fd: int, nstype: int = CLONE_NEWNET) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns failed: {os.strerror(err)}")


def bind_socket(spec: ListenSpec) -> socket.socket:
    """Bind a listening TCP socket, inside spec.netns when given.

    setns() switches only the calling thread, so this must run on the main thread
    before the event loop (and its executor threads) exist; the socket keeps the
    namespace it was created in after we switch back.
    """
    if spec.netns is None:
        return _bind(spec.host, spec.port)
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{spec.netns}", os.O_RDONLY)
    try:
        setns(target)
        try:
            return _bind(spec.host, spec.port)
        finally:
            setns(own)
    finally:
        os.close(target)
        os.close(own)


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(512)
    sock.setblocking(False)
    return sock


async def start_sites(pairs: list[tuple[web.Application, socket.socket]]) -> list[web.AppRunner]:
    """Start one runner per (app, socket); returns the runners for cleanup."""
    runners = []
    for app, sock in pairs:
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        runners.append(runner)
    return runners


async def serve_forever(
    pairs: list[tuple[web.Application, socket.socket]],
    on_stop: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM, then stop the sites and run on_stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    runners = await start_sites(pairs)
    for app, sock in pairs:
        host, port = sock.getsockname()[:2]
        print(f"listening on {host}:{port} ({app.get(LABEL, '')})", flush=True)
    await stop.wait()
    if on_stop is not None:
        await on_stop()
    for runner in runners:
        await runner.cleanup()

"""Run stand-in aiohttp apps on a background thread's event loop (tests and embedding)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from .listeners import start_sites

__all__ = ["InProcServer", "free_socket"]


def free_socket(host: str = "127.0.0.1") -> socket.socket:
    """A bound, listening socket on an OS-chosen port: no pick-then-bind race."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(512)
    sock.setblocking(False)
    return sock


class InProcServer:
    """Serve (app, socket) pairs from a private loop thread until stop()."""

    def __init__(
        self,
        pairs: list[tuple[web.Application, socket.socket]],
        on_stop: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.pairs = pairs
        self.on_stop = on_stop
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="standin-loop", daemon=True)
        self._runners: list[web.AppRunner] = []

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [sock.getsockname()[:2] for _, sock in self.pairs]

    def start(self) -> InProcServer:
        self._thread.start()
        self._runners = self.call(start_sites(self.pairs))
        return self

    def call(self, coro: Awaitable[Any], timeout: float = 30.0) -> Any:
        """Run a coroutine on the server loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        async def _stop() -> None:
            if self.on_stop is not None:
                await self.on_stop()
            for runner in self._runners:
                await runner.cleanup()

        try:
            self.call(_stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()

"""Async HTTP clients for the activities' reads, sharing one TLS context per worker process."""

from __future__ import annotations

import asyncio
import functools
import ssl
import weakref

import httpx

__all__ = ["async_client", "reading_client"]

# Gate readings come back to the same few endpoints every few seconds: kept-alive connections spare
# each reading a TCP (and TLS) handshake. Idle ones close after this, so a moved endpoint is met anew.
_KEEPALIVE_S = 5.0
_reading_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # Building a context loads the CA bundle: about 0.1 s of CPU each time. Per request, a flood of
    # gate readings spent most of the worker's CPU here and slowed every other run on the worker.
    return httpx.create_ssl_context()


def async_client(timeout: float) -> httpx.AsyncClient:
    """A client for one activity's requests, closed by its caller (gate readings keep theirs: reading_client)."""
    return httpx.AsyncClient(timeout=timeout, verify=_tls_context())


def reading_client() -> httpx.AsyncClient:
    """The running event loop's client for gate readings, kept across activities (pass each request's timeout).

    Async activities share the worker's one loop, so its client's connections stay open between
    readings; a client is never used from another loop."""
    loop = asyncio.get_running_loop()
    client = _reading_clients.get(loop)
    if client is None or client.is_closed:
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=_KEEPALIVE_S)
        client = _reading_clients[loop] = httpx.AsyncClient(verify=_tls_context(), limits=limits)
    return client

"""Async HTTP clients for the activities' reads, sharing one TLS context per worker process."""

from __future__ import annotations

import functools
import ssl

import httpx

__all__ = ["async_client"]


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # Building a context loads the CA bundle: about 0.1 s of CPU each time. Per request, a flood of
    # gate readings spent most of the worker's CPU here and slowed every other run on the worker.
    return httpx.create_ssl_context()


def async_client(timeout: float) -> httpx.AsyncClient:
    """A client for one activity's requests (async clients belong to one event loop, so none is kept)."""
    return httpx.AsyncClient(timeout=timeout, verify=_tls_context())

"""Shared plumbing for the Consul, Nomad and Vault actions: targets, tokens from Vault, argument checks."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import consul
import consul.exceptions as cex
import consul.std
import nomad
import nomad.api.exceptions as nex
import requests
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities._fields import go_duration_seconds
from activities.binding import invalid_argument
from activities.contracts.targets import ConsulTarget, NomadTarget, VaultSecretRef
from activities.secrets import forget_cached_secrets, read_kv_secret

__all__ = [
    "CLIENT_ERRORS",
    "ConsulTarget",
    "NomadTarget",
    "bad",
    "call",
    "consul_client",
    "consul_get",
    "consul_http",
    "consul_token",
    "describe",
    "dumps",
    "go_duration_seconds",
    "heartbeat",
    "http_session",
    "nomad_client",
    "resume_details",
    "secret_of",
    "translate",
    "unavailable",
]

T = TypeVar("T")


bad = invalid_argument


def unavailable(message: str, *, retryable: bool = True, details: Any = None) -> ApplicationError:
    """The cluster could not do what was asked; retryable unless the caller knows better."""
    args = (details,) if details is not None else ()
    return ApplicationError(message, *args, type="Unavailable", non_retryable=not retryable)


def heartbeat(*details: Any) -> None:
    # Plain calls (tests, scripts) run outside an activity; heartbeating there is a no-op.
    if activity.in_activity():
        activity.heartbeat(*details)


def resume_details() -> Any:
    """The last heartbeat's first detail from a previous attempt, or None."""
    if not activity.in_activity():
        return None
    details = activity.info().heartbeat_details
    return details[0] if details else None


# --------------------------------------------------------------------------- targets


# --------------------------------------------------------------------------- clients


def secret_of(ref: VaultSecretRef | None) -> str | None:
    return read_kv_secret(ref) if ref is not None else None


_local = threading.local()


def http_session() -> requests.Session:
    """This worker thread's HTTP session for the Consul and Nomad clients: connections stay open across
    activities (sessions are not thread-safe, so each thread of the activity pool keeps its own).

    It reads no proxy or netrc settings from the environment: the controller talks to the clusters it
    recovers directly (a proxy is one more thing that can be down), TLS trust comes from each target's
    ca_cert, tokens travel in headers, and scanning the environment on every call cost a tenth of a
    1,000-service fan-out's CPU.
    """
    session = getattr(_local, "session", None)
    if session is None:
        session = _local.session = requests.Session()
        session.trust_env = False
    return session


def consul_client(target: ConsulTarget, address: str | None = None, token: str | None = None) -> consul.Consul:
    """A py-consul client for one agent; `token` lets callers reuse one Vault read for many agents."""
    parts = urlsplit(address or target.address)
    secret = token if token is not None else secret_of(target.token)
    client = consul.Consul(
        host=parts.hostname,
        port=parts.port or (443 if parts.scheme == "https" else 80),
        scheme=parts.scheme,
        dc=target.datacenter,
        verify=target.ca_cert or True,
        connections_timeout=target.timeout_seconds,
    )
    consul_http(client).session = http_session()
    # py-consul lets $CONSUL_HTTP_TOKEN override the constructor's token; the Vault one must win.
    client.token = secret
    return client


def consul_http(client: consul.Consul) -> consul.std.HTTPClient:
    """The client's HTTP layer. py-consul sets it from an abstract method that returns nothing, so a type
    checker takes it for None; this says what it is."""
    return cast(consul.std.HTTPClient, client.http)


def consul_token(target: ConsulTarget) -> str | None:
    return secret_of(target.token)


def consul_get(client: consul.Consul, path: str, params: list[tuple[str, Any]] | None = None) -> Any:
    """GET a documented JSON endpoint py-consul has no token-aware wrapper for (raft config, agent self)."""
    from consul.callback import CB

    return consul_http(client).get(CB.json(), path, params=params or [], headers=client.prepare_headers())


def nomad_client(target: NomadTarget, token: str | None = None) -> nomad.Nomad:
    parts = urlsplit(target.address)
    secret = token if token is not None else secret_of(target.token)
    client = nomad.Nomad(
        # The address is given whole, so $NOMAD_ADDR cannot redirect the client; one session for every
        # endpoint (python-nomad would otherwise open a session per endpoint, about thirty per client).
        address=f"{parts.scheme}://{parts.netloc}",
        session=http_session(),
        host=parts.hostname or "",
        port=parts.port or (443 if parts.scheme == "https" else 80),
        secure=parts.scheme == "https",
        # Both go to requests, which takes a CA bundle's path and a float; python-nomad's hints say bool and int.
        verify=target.ca_cert or (parts.scheme == "https"),  # pyright: ignore[reportArgumentType]
        timeout=target.timeout_seconds,  # pyright: ignore[reportArgumentType]
        region=target.region,
        token=secret or None,
    )
    # python-nomad falls back to $NOMAD_TOKEN when given none; pin every endpoint to ours (None = anonymous).
    for endpoint in vars(client).values():
        if hasattr(endpoint, "token") and hasattr(endpoint, "request"):
            endpoint.token = secret or None
    return client


def describe(exc: BaseException) -> str:
    """One line about a client error; never includes request headers (where tokens travel)."""
    resp = getattr(exc, "nomad_resp", None)
    if resp is not None and hasattr(resp, "status_code"):
        text = (getattr(resp, "text", "") or "").strip().replace("\n", " ")
        return f"HTTP {resp.status_code}: {text[:300]}"
    if resp is not None:
        return f"{type(resp).__name__}: {str(resp)[:300]}"
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def translate(what: str, exc: BaseException, not_found: str | None = None) -> ApplicationError:
    """A client library error as an ApplicationError: 4xx are not retryable, transport trouble and 5xx are."""
    if isinstance(exc, (cex.ACLPermissionDenied, nex.URLNotAuthorizedNomadException)):
        # A token reused from the worker's cache may have been rotated since: drop the cache, and let the
        # next attempt read Vault again rather than failing the step on a stale token.
        stale = forget_cached_secrets() > 0
        return ApplicationError(f"{what}: permission denied ({describe(exc)})"
                                + ("; cached tokens dropped, the next attempt reads them from Vault" if stale else ""),
                                type="PermissionDenied", non_retryable=not stale)
    if isinstance(exc, (cex.NotFound, nex.URLNotFoundNomadException)):
        return ApplicationError(not_found or f"{what}: not found ({describe(exc)})", type="NotFound",
                                non_retryable=True)
    if isinstance(exc, (cex.BadRequest, cex.ClientError, nex.BadRequestNomadException)):
        return ApplicationError(f"{what}: rejected ({describe(exc)})", type="Rejected", non_retryable=True)
    return unavailable(f"{what}: {describe(exc)}")


CLIENT_ERRORS = (cex.ConsulException, nex.BaseNomadException, requests.RequestException)


def call(what: str, fn: Callable[[], T], *, not_found: str | None = None) -> T:
    """Run one client call, turning library errors into clear ApplicationErrors."""
    try:
        return fn()
    except CLIENT_ERRORS as exc:
        raise translate(what, exc, not_found) from None


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))

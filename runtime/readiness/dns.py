"""The DNS steering key works: its secret resolves in Vault and signs an UPDATE each steering server accepts."""

from __future__ import annotations

import asyncio

import dns.asyncquery
import dns.exception
import dns.name
import dns.rcode
import dns.tsig
import dns.update
from temporalio.exceptions import ApplicationError

from activities.contracts.dns import parse_server
from activities.inventory import DnsSteering
from activities.secrets import read_kv_secret
from runtime.readiness.model import Verdict, not_ready, ready

__all__ = ["tsig_verdict"]


def _probe(steering: DnsSteering, key: dns.tsig.Key) -> dns.update.UpdateMessage:
    """An UPDATE that only states a prerequisite (the steered name exists) and changes nothing: the server checks
    its signature before anything else, and the update policy has no record to judge."""
    fqdn = dns.name.from_text(steering.name, origin=dns.name.from_text(steering.zone))
    probe = dns.update.UpdateMessage(steering.zone, keyring=key, keyname=key.name, keyalgorithm=dns.tsig.HMAC_SHA256)
    probe.present(fqdn)
    return probe


async def _ask(steering: DnsSteering, key: dns.tsig.Key, server: str, timeout: float) -> str | None:
    """None when the server accepted the signed UPDATE, else why not (never the secret)."""
    host, port = parse_server(server)
    try:
        reply = await dns.asyncquery.tcp(_probe(steering, key), host, port=port, timeout=timeout)
    except dns.exception.Timeout:
        return f"{server} did not answer within {timeout:g}s"
    except (dns.exception.DNSException, OSError) as exc:
        # pdns answers a bad signature or an unknown key unsigned, which dnspython refuses.
        return f"{server} refused the key: {type(exc).__name__}: {exc}"
    rcode = reply.rcode()
    if rcode == dns.rcode.NXDOMAIN:
        return f"{server} accepted the key but has no {steering.name} in {steering.zone}"
    if rcode != dns.rcode.NOERROR:
        return f"{server} answered {dns.rcode.to_text(rcode)}"
    return None


async def tsig_verdict(steering: DnsSteering, *, timeout: float = 3.0, token: str | None = None) -> Verdict:
    """`token`: the Vault login the key is read with (the worker's AppRole); None: its reference's own."""
    try:
        secret = await asyncio.to_thread(read_kv_secret, steering.tsig_secret.model_copy(update={"cache_seconds": 0}),
                                         token=token)
    except ApplicationError as exc:
        return not_ready(f"the TSIG key {steering.tsig_key_name} does not resolve in Vault: {exc.message}")
    except Exception as exc:  # noqa: BLE001 - hvac's connection and sealed-Vault errors, named by type only
        return not_ready(f"the TSIG key {steering.tsig_key_name} does not resolve in Vault: {type(exc).__name__}")
    try:
        key = dns.tsig.Key(steering.tsig_key_name, secret, dns.tsig.HMAC_SHA256)
    except Exception:  # noqa: BLE001 - a value that is not base64; the message could quote it
        return not_ready(f"the TSIG key {steering.tsig_key_name} in Vault is not a base64 HMAC secret")
    problems = [p for p in await asyncio.gather(*(_ask(steering, key, s, timeout) for s in steering.servers)) if p]
    if problems:
        return not_ready("; ".join(problems))
    return ready(f"the TSIG key {steering.tsig_key_name} signs an UPDATE that {', '.join(steering.servers)} accept")

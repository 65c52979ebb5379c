"""Verify a Vault/OpenBao OIDC identity token against the keys captured at the run's start.

An approval or a skip names a person; a typed name is not an identity. The approver fetches a
short-lived identity token signed by Vault's identity secrets engine with their own login
(`identity/oidc/token/<role>`), and the workflow's Update validator checks it here. Validators
cannot do I/O, so the issuer and the public keys (`/v1/identity/oidc/.well-known/...`) are read
by the `vault.identity_keys` activity at run start and handed in as `IdentityKeys`.

Pure and deterministic: no I/O and no wall clock (the caller passes `now`, e.g. workflow.now()),
so it runs inside Temporal's workflow sandbox. Imports: stdlib, pydantic, PyJWT, cryptography.
Only PyJWT's signature check is used; every claim is checked here against `now`.

Every failure is an `IdentityError` with a one-line message that never contains the token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
from pydantic import BaseModel, Field

from activities.errors import InvalidInput
from activities.oidc import IdentityKeys
from activities.policy import TargetIdentity
from workflows.spec import IdentityPolicy

__all__ = [
    "ALLOWED_ALGORITHMS",
    "CLOCK_SKEW",
    "MAX_TOKEN_BYTES",
    "RUN_LEVEL",
    "IdentityError",
    "VerifiedIdentity",
    "decision_nonce",
    "effective_identity",
    "start_nonce",
    "verify_identity_token",
]

# Clock skew tolerated between Vault and the workflow's clock, on exp, iat and nbf alike (and no
# other leeway): a token is accepted until exp + 30 s, and may be issued up to 30 s "in the future".
CLOCK_SKEW = timedelta(seconds=30)
# Vault's tokens are about 1 KiB; anything much larger is refused before it is parsed.
MAX_TOKEN_BYTES = 16 * 1024

# The algorithms Vault's and OpenBao's OIDC named keys sign with, by the JWK key type (and curve)
# that verifies them. Never `none`, never HMAC (a public key must not become a shared secret).
_ALGS_BY_KEY: dict[tuple[str, str | None], str] = {
    ("RSA", None): "RS256|RS384|RS512",
    ("EC", "P-256"): "ES256",
    ("EC", "P-384"): "ES384",
    ("EC", "P-521"): "ES512",
    ("OKP", "Ed25519"): "EdDSA",
}
ALLOWED_ALGORITHMS: tuple[str, ...] = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "EdDSA")

_COMPACT_JWS = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
_PREFIX = "identity token"


# The `step` of a decision about the whole run (abort, pause, resume).
RUN_LEVEL = "-"


def _nonce(*parts: str) -> str:
    # Newline-joined: no part of a workflow id, step id or digest holds one, so distinct tuples never collide.
    return hashlib.sha256("\n".join(("coldstart-decision/v1", *parts)).encode()).hexdigest()


def decision_nonce(workflow_id: str, run_id: str, verb: str, step: str = RUN_LEVEL) -> str:
    """The nonce a decision's identity token must carry: it binds the token to one run (its first run id,
    which continue-as-new keeps), one verb and one step, so a token copied from one run's history is
    refused in another run, for another step and for another verb."""
    return _nonce(workflow_id, run_id, verb, step or RUN_LEVEL)


def start_nonce(workflow_id: str, runbook_digest: str, target: str, params: dict[str, Any], drill: bool) -> str:
    """The nonce a starter's identity token must carry: the run is not yet started (no run id), so it
    binds the workflow id, the runbook version, the target, the parameters and the drill flag instead."""
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return _nonce(workflow_id, "start", runbook_digest, target, canonical, "drill" if drill else "run")


def effective_identity(book: IdentityPolicy | None, held: TargetIdentity | None) -> IdentityPolicy | None:
    """The verified identity a run enforces: the target's (its Vault, provider and audience, from the controller's
    inventory) with the runbook's decisions added to its own; only the runbook's when the target sets none."""
    if held is None:
        return book
    controls = sorted(set(held.controls) | set(book.controls if book is not None else []))
    return IdentityPolicy(vault=held.vault, audience=held.audience, provider=held.provider, ca_cert=held.ca_cert,
                          name_claim=held.name_claim, controls=controls)  # type: ignore[arg-type]


class IdentityError(InvalidInput):
    """A token that does not prove who sent the request; the message is one operator-readable line."""


class VerifiedIdentity(BaseModel):
    """Who a verified token says sent the request."""

    subject: str = Field(description="`sub`: the Vault entity id")
    name: str = Field(description="the name claim (by default `name`, e.g. the entity's name)")
    issuer: str
    expires_at: datetime


def _show(value: Any, limit: int = 80) -> str:
    """A claim or header value for a message: repr'd (one line, quoted) and cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fail(message: str) -> IdentityError:
    return IdentityError(f"{_PREFIX} {message}")


def _b64json(part: str) -> Any:
    try:
        raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        return json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError):
        return None


def _utc(moment: datetime) -> datetime:
    # A naive datetime is taken as UTC (workflow.now() is aware; a local-time reading would be wrong).
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _numeric_date(claims: dict[str, Any], name: str, *, required: bool) -> float | None:
    value = claims.get(name)
    if value is None:
        if required:
            raise _fail(f"has no {name!r} claim")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(f"claim {name!r} is not a NumericDate (seconds since the epoch): {_show(value, 40)}")
    # Beyond year 9999 datetime cannot represent it; no honest token gets there.
    if not 0 <= value < 253402300800:
        raise _fail(f"claim {name!r} is out of range: {_show(value, 40)}")
    return float(value)


def _key_for(header: dict[str, Any], keys: IdentityKeys) -> tuple[str, dict[str, Any]]:
    alg = header.get("alg")
    if not isinstance(alg, str) or alg not in ALLOWED_ALGORITHMS:
        raise _fail(f"alg {_show(alg, 40)} is not allowed (allowed: {', '.join(ALLOWED_ALGORITHMS)})")
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid:
        raise _fail("has no key id (kid) in its header")
    found = [k for k in keys.keys if isinstance(k, dict) and k.get("kid") == kid]
    if not found:
        raise _fail(f"was signed by key {_show(kid)}, which is not among the {len(keys.keys)} key(s) captured from "
                    f"{keys.issuer} at run start (a token from another Vault, or a key created since the run began)")
    jwk_data = found[0]
    kty, crv = jwk_data.get("kty"), jwk_data.get("crv")
    curve = None if kty == "RSA" or not isinstance(crv, str) else crv
    fits = _ALGS_BY_KEY.get((kty, curve), "") if isinstance(kty, str) else ""
    if alg not in fits.split("|") or jwk_data.get("alg") not in (None, alg) or jwk_data.get("use") not in (None, "sig"):
        raise _fail(f"alg {alg} does not match its key {_show(kid)} ({kty}"
                    f"{'/' + str(crv) if crv else ''}, alg {jwk_data.get('alg') or 'unset'})")
    return alg, jwk_data


def verify_identity_token(
    token: str,
    keys: IdentityKeys,
    *,
    audience: str,
    now: datetime,
    name_claim: str = "name",
    max_ttl: timedelta = timedelta(minutes=15),
    nonce: str | None = None,
) -> VerifiedIdentity:
    """Check a Vault OIDC identity token and return who it identifies, or raise IdentityError.

    Checks, in order: size (MAX_TOKEN_BYTES) and compact JWS form; `alg` allowed and fitting the
    key; `kid` among the captured keys; the signature; `iss` == keys.issuer; `aud` contains
    `audience`; `exp` not passed at `now` and `iat`/`nbf` not ahead of it (CLOCK_SKEW either way);
    exp - iat <= max_ttl; `sub` and the `name_claim` claim non-empty strings; with `nonce`, the
    token's `nonce` claim equals it (a token bound to this decision: decision_nonce, start_nonce).
    """
    if not isinstance(token, str):
        raise _fail(f"must be a string, not {type(token).__name__}")
    size = len(token.encode("utf-8", "surrogatepass"))
    if size > MAX_TOKEN_BYTES:
        raise _fail(f"is {size} bytes, over the {MAX_TOKEN_BYTES}-byte limit")
    token = token.strip()
    if not token:
        raise _fail("is empty")
    if not _COMPACT_JWS.fullmatch(token):
        raise _fail("is not a compact JWS (three base64url parts: header.payload.signature)")
    header = _b64json(token.split(".", 1)[0])
    if not isinstance(header, dict):
        raise _fail("header is not a base64url-encoded JSON object")
    if not keys.keys:
        raise _fail(f"cannot be checked: no keys were captured from {keys.issuer} at run start")

    alg, jwk_data = _key_for(header, keys)
    kid = header["kid"]
    try:
        key = jwt.PyJWK(jwk_data, algorithm=alg)
    except jwt.PyJWTError:
        raise _fail(f"cannot be checked: the captured key {_show(kid)} is not a usable {alg} key") from None
    try:
        decoded = jwt.PyJWS().decode_complete(token, key=key, algorithms=[alg])
    except jwt.InvalidSignatureError:
        raise _fail(f"signature does not verify with key {_show(kid)} (altered, or not signed by that key)") from None
    except jwt.PyJWTError:
        raise _fail("is not a well-formed JWS") from None
    try:
        claims = json.loads(decoded["payload"])
    except (ValueError, UnicodeDecodeError, RecursionError):
        claims = None
    if not isinstance(claims, dict):
        raise _fail("payload is not a JSON object")

    issuer = claims.get("iss")
    if issuer != keys.issuer:
        raise _fail(f"issuer {_show(issuer)} is not this run's Vault issuer {_show(keys.issuer)}")
    aud = claims.get("aud")
    audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if audience not in [a for a in audiences if isinstance(a, str)]:
        raise _fail(f"is for audience {_show(aud)}, not {_show(audience)} (the Vault role's client_id)")

    at = _utc(now).timestamp()
    skew = CLOCK_SKEW.total_seconds()
    exp = _numeric_date(claims, "exp", required=True)
    iat = _numeric_date(claims, "iat", required=True)
    nbf = _numeric_date(claims, "nbf", required=False)
    assert exp is not None and iat is not None
    if at >= exp + skew:
        raise _fail(f"expired at {_when(exp)} (now {_when(at)}, {int(skew)} s clock skew allowed): fetch a new one")
    if iat > at + skew:
        raise _fail(f"was issued in the future ({_when(iat)}, now {_when(at)}): check the clocks")
    if nbf is not None and nbf > at + skew:
        raise _fail(f"is not valid before {_when(nbf)} (now {_when(at)})")
    if exp - iat > max_ttl.total_seconds():
        raise _fail(f"lives {int(exp - iat)} s (exp - iat), over the {int(max_ttl.total_seconds())} s allowed: "
                    f"use a Vault role with a short ttl")

    if nonce is not None and claims.get("nonce") != nonce:
        if "nonce" not in claims:
            raise _fail("is not bound to a decision (no nonce): fetch one for this run, step and verb "
                        "(`coldstart identity token`, or --vault-login)")
        raise _fail("is bound to another run, step or verb (its nonce differs): fetch one for this decision")
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject.strip():
        raise _fail("has no subject (sub)")
    name = claims.get(name_claim)
    if not isinstance(name, str) or not name.strip():
        raise _fail(f"has no {name_claim!r} claim (a non-empty string): the Vault role's template must set it, "
                    f'e.g. {{"{name_claim}": {{{{identity.entity.name}}}}}}')
    return VerifiedIdentity(subject=subject, name=name, issuer=keys.issuer,  # == iss, checked above
                            expires_at=datetime.fromtimestamp(exp, UTC))

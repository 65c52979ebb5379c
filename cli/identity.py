"""Fetch an operator's OIDC identity token from Vault/OpenBao with the operator's own login.

A decision's token comes from the Vault OIDC provider (`identity/oidc/provider/<name>`): the operator's
login authorizes a public client with PKCE and the decision's nonce, and the id token Vault signs carries
that nonce, so it serves one run, one step and one verb (workflows/identity.decision_nonce). The login
must have an entity (a person's login, e.g. userpass); a root token has none, so it decides for nobody.
`fetch_identity_token` reads the older unbound `identity/oidc/token/<role>` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from activities.errors import ColdstartError
from activities.oidc import DECISION_REDIRECT_URI

__all__ = ["DEFAULT_ROLE", "REDIRECT_URI", "DecisionSource", "IdentityTokenError", "decision_source",
           "fetch_decision_token", "fetch_identity_token", "own_vault", "same_vault", "start_source"]

DEFAULT_ROLE = "coldstart-approver"
REDIRECT_URI = DECISION_REDIRECT_URI


class IdentityTokenError(ColdstartError, RuntimeError):
    """Getting the identity token failed; the message is one line and never holds a secret."""


def _first_line(exc: BaseException) -> str:
    # hvac appends ", on get http://..." and Vault's own messages may span lines ("1 error occurred:\n\t* ...").
    text = " ".join(part.strip(" \t*") for part in str(exc).splitlines() if part.strip(" \t*"))
    text = text.split(", on ", 1)[0].strip()
    return (text[:200] + "...") if len(text) > 200 else text or type(exc).__name__


def fetch_identity_token(
    vault_addr: str,
    role: str,
    *,
    token: str | None = None,
    username: str | None = None,
    password: str | None = None,
    mount: str = "userpass",
) -> str:
    """Log in as the approver and return a signed identity token for `role` (its audience is the role's client_id).

    With `username` (and `password`): a userpass login on `mount`. Otherwise `token`, else
    VAULT_TOKEN or ~/.vault-token, the approver's existing login.
    """
    import hvac
    import hvac.exceptions
    import requests

    if not role:
        raise IdentityTokenError("no Vault OIDC role given")
    try:
        client = _login(vault_addr, token=token, username=username, password=password, mount=mount)
        try:
            reply = client.secrets.identity.generate_signed_id_token(name=role)
        except hvac.exceptions.InvalidRequest as exc:
            message = _first_line(exc)
            if "no entity" in message:
                raise IdentityTokenError("this Vault token has no identity (entity): log in as yourself "
                                         "(e.g. --vault-login); a root token has no identity") from None
            raise IdentityTokenError(f"Vault refused an identity token for role {role!r}: {message}") from None
        except (hvac.exceptions.Forbidden, hvac.exceptions.Unauthorized) as exc:
            raise IdentityTokenError(f"Vault denied reading identity/oidc/token/{role} ({_first_line(exc)}): "
                                     f"your login needs a policy with read on that path") from None
        except hvac.exceptions.InvalidPath:
            raise IdentityTokenError(f"Vault has no OIDC role {role!r} (identity/oidc/role/{role})") from None
    except requests.RequestException as exc:
        raise IdentityTokenError(f"Vault at {vault_addr} unreachable: {type(exc).__name__}") from None
    except hvac.exceptions.VaultError as exc:
        raise IdentityTokenError(f"Vault at {vault_addr}: {_first_line(exc)}") from None
    signed = ((reply or {}).get("data") or {}).get("token") if isinstance(reply, dict) else None
    if not isinstance(signed, str) or not signed:
        raise IdentityTokenError(f"Vault answered identity/oidc/token/{role} without a token")
    return signed


def _login(vault_addr: str, *, token: str | None, username: str | None, password: str | None, mount: str) -> Any:
    import hvac
    import hvac.exceptions

    if not vault_addr:
        raise IdentityTokenError("no Vault address: set VAULT_ADDR or pass --vault-addr")
    # A userpass login starts from no token at all (token="": hvac would otherwise pick up VAULT_TOKEN).
    client: Any = hvac.Client(url=vault_addr, token="" if username else (token or None), timeout=15)
    if username:
        if not password:
            raise IdentityTokenError(f"no password for Vault user {username!r} (set VAULT_PASSWORD or type it)")
        try:
            client.auth.userpass.login(username=username, password=password, mount_point=mount)
        except (hvac.exceptions.InvalidRequest, hvac.exceptions.Forbidden, hvac.exceptions.Unauthorized,
                hvac.exceptions.InvalidPath) as exc:
            raise IdentityTokenError(f"Vault login as {username!r} on auth/{mount} failed: {_first_line(exc)}") from None
    elif not client.token:
        raise IdentityTokenError("no Vault login: set VAULT_TOKEN or run `vault login` (as yourself), "
                                 "or log in with --vault-login")
    return client


def _vault_message(response: Any) -> str:
    try:
        errors = response.json().get("errors") or [response.json().get("error_description") or ""]
    except ValueError:
        errors = [response.text]
    return _first_line(ValueError(" ".join(str(e) for e in errors if e) or f"HTTP {response.status_code}"))


def fetch_decision_token(
    vault_addr: str,
    provider: str,
    client_id: str,
    nonce: str,
    *,
    token: str | None = None,
    username: str | None = None,
    password: str | None = None,
    mount: str = "userpass",
    ca_cert: str | None = None,
) -> str:
    """Log in as the operator and return an id token from `provider` for public client `client_id` carrying
    `nonce` (a decision's, from workflows/identity). With `username`: a userpass login on `mount`; otherwise
    `token`, else VAULT_TOKEN or ~/.vault-token, the operator's existing login."""
    import base64
    import hashlib
    import secrets

    import hvac.exceptions
    import requests

    try:
        client = _login(vault_addr, token=token, username=username, password=password, mount=mount)
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        base = f"{vault_addr.rstrip('/')}/v1/identity/oidc/provider/{provider}"
        verify: Any = ca_cert or True
        asked = requests.get(f"{base}/authorize", timeout=15, verify=verify, headers={"X-Vault-Token": client.token},
                             params={"client_id": client_id, "scope": "openid coldstart", "response_type": "code",
                                     "redirect_uri": REDIRECT_URI, "state": secrets.token_urlsafe(12), "nonce": nonce,
                                     "code_challenge": challenge, "code_challenge_method": "S256"})
        if asked.status_code in (401, 403):
            raise IdentityTokenError(f"Vault denied identity/oidc/provider/{provider}/authorize "
                                     f"({_vault_message(asked)}): your login needs read on that path and a place in "
                                     "the client's assignments")
        if asked.status_code != 200 or "code" not in asked.json():
            message = _vault_message(asked)
            if "entity" in message:
                raise IdentityTokenError("this Vault token has no identity (entity): log in as yourself "
                                         "(e.g. --vault-login); a root token has no identity")
            raise IdentityTokenError(f"Vault refused a decision token from provider {provider!r}: {message}")
        answered = requests.post(f"{base}/token", timeout=15, verify=verify,
                                 data={"grant_type": "authorization_code", "code": asked.json()["code"],
                                       "redirect_uri": REDIRECT_URI, "client_id": client_id,
                                       "code_verifier": verifier})
        if answered.status_code != 200:
            raise IdentityTokenError(f"Vault refused the code exchange at provider {provider!r}: "
                                     f"{_vault_message(answered)}")
    except requests.RequestException as exc:
        raise IdentityTokenError(f"Vault at {vault_addr} unreachable: {type(exc).__name__}") from None
    except hvac.exceptions.VaultError as exc:
        raise IdentityTokenError(f"Vault at {vault_addr}: {_first_line(exc)}") from None
    signed = answered.json().get("id_token")
    if not isinstance(signed, str) or not signed:
        raise IdentityTokenError(f"Vault answered provider {provider!r}'s token endpoint without an id token")
    return signed


def same_vault(one: str, other: str) -> bool:
    """Whether two Vault addresses name the same server: scheme and host compared without case, a port left out
    read as the scheme's, a trailing slash ignored."""
    def key(address: str) -> tuple[str, str, int | None, str]:
        parts = urlsplit(address.strip())
        try:
            port = parts.port or {"https": 443, "http": 80}.get(parts.scheme.lower())
        except ValueError:  # a port that is not a number: compared as written
            return (address.strip(), "", None, "")
        return (parts.scheme.lower(), (parts.hostname or "").lower(), port, parts.path.rstrip("/"))
    return key(one) == key(other)


def own_vault(configured: str | None, named: str) -> str:
    """The Vault an operator's login goes to: their own (`configured`, from VAULT_ADDR or --vault-addr), when it
    is the one the run names (`named`, where its tokens verify); IdentityTokenError in one line otherwise. Never
    the run's address in place of a configured one: what a run's status says comes from whoever started it or
    answers its queries, and the login carries the operator's password or token."""
    if not configured or not configured.strip():
        raise IdentityTokenError(f"no Vault of your own configured: set VAULT_ADDR (or pass --vault-addr) to your "
                                 f"Vault; this run's tokens come from {named}")
    if not same_vault(configured, named):
        raise IdentityTokenError(f"your Vault is {configured} (VAULT_ADDR or --vault-addr) and this run's tokens come "
                                 f"from {named}: your login goes to your own Vault only")
    return configured.strip()


@dataclass(frozen=True)
class DecisionSource:
    """Where one decision's token comes from, and the nonce it must carry."""

    vault: str
    provider: str
    audience: str
    nonce: str
    ca_cert: str | None = None


def start_source(run: Any, workflow_id: str) -> DecisionSource | None:
    """The source of a starter's token for planned run `run` (a RunInput with its request); None: no verified identity."""
    from activities.policy import TargetPolicy
    from workflows.identity import effective_identity, start_nonce

    identity = effective_identity(run.runbook.identity, TargetPolicy.of(run.target).identity)
    if identity is None or identity.provider is None or run.request is None:
        return None
    req = run.request
    return DecisionSource(identity.vault, identity.provider, identity.audience,
                          start_nonce(workflow_id, req.digest, req.target, req.params, req.drill), identity.ca_cert)


async def decision_source(handle: Any, verb: str, step: str | None) -> tuple[DecisionSource | None, str | None]:
    """(the source of a token for `verb` on `step` of the run behind `handle`, or None when the run binds none;
    the step decided on, the one held step when `step` is None and `verb` is about a held step)."""
    from workflows.contract import RunStatus
    from workflows.identity import RUN_LEVEL, decision_nonce

    status = await handle.query("status", result_type=RunStatus)
    described = await handle.describe()
    first_run = described.raw_description.workflow_execution_info.first_run_id or described.run_id
    source = status.identity_source
    if verb in ("retry", "skip") and step is None and len(status.held) == 1:
        step = status.held[0]
    if not source.get("provider"):
        return None, step
    bound_step = RUN_LEVEL if verb in ("abort", "pause", "resume") else (step or RUN_LEVEL)
    return DecisionSource(source["vault"], source["provider"], source["audience"],
                          decision_nonce(status.workflow_id, first_run, verb, bound_step),
                          source.get("ca_cert")), step

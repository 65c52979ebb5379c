"""Fetch an approver's OIDC identity token from Vault/OpenBao with the approver's own login.

The token is read from `identity/oidc/token/<role>` with a token that has an entity (a person's
login, e.g. userpass), so it says who approves; the run checks it against the keys it captured
at start (workflows/identity.py). A root token has no entity, so it cannot approve for anyone.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_ROLE", "IdentityTokenError", "fetch_identity_token"]

DEFAULT_ROLE = "coldstart-approver"


class IdentityTokenError(RuntimeError):
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

    if not vault_addr:
        raise IdentityTokenError("no Vault address: set VAULT_ADDR or pass --vault-addr")
    if not role:
        raise IdentityTokenError("no Vault OIDC role given")
    # A userpass login starts from no token at all (token="": hvac would otherwise pick up VAULT_TOKEN).
    client: Any = hvac.Client(url=vault_addr, token="" if username else (token or None), timeout=15)
    try:
        if username:
            if not password:
                raise IdentityTokenError(f"no password for Vault user {username!r} (set VAULT_PASSWORD or type it)")
            try:
                client.auth.userpass.login(username=username, password=password, mount_point=mount)
            except (hvac.exceptions.InvalidRequest, hvac.exceptions.Forbidden, hvac.exceptions.Unauthorized,
                    hvac.exceptions.InvalidPath) as exc:
                raise IdentityTokenError(f"Vault login as {username!r} on auth/{mount} failed: "
                                         f"{_first_line(exc)}") from None
        elif not client.token:
            raise IdentityTokenError("no Vault login: set VAULT_TOKEN or run `vault login` (as yourself), "
                                     "or log in with --vault-login")
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

"""The lab Vault as an identity provider for decisions: OIDC key, provider and client, userpass operators with entities.

Operators log in with userpass (`auth/userpass/login/<name>`) and get a short-lived id token from the
`coldstart` OIDC provider (a public client, PKCE) carrying their decision's nonce; the run verifies it
against the keys it captured at start (workflows/identity.py). The older unbound role tokens
(`identity/oidc/token/coldstart-approver`) stay configured. Each user has an entity named like the user (created
with its alias explicitly, so the token's `name` claim, `{{identity.entity.name}}`, is the user
name and `sub` the entity id). The passwords live in the lab's secrets dir, one file per user.
Idempotent: `lab up` runs it on every start, and the same passwords and audience come back.
"""

from __future__ import annotations

import os
import secrets as _random
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import hvac

    from lab.services import Secrets
    from lab.settings import LabConfig

__all__ = [
    "APPROVER_POLICY",
    "IDENTITY_AUDIENCE",
    "IDENTITY_KEY",
    "IDENTITY_PROVIDER",
    "IDENTITY_ROLE",
    "LAB_APPROVERS",
    "approver_password",
    "configure_identity",
    "configure_lab_identity",
    "identity_facts",
]

IDENTITY_KEY = "coldstart"
IDENTITY_ROLE = "coldstart-approver"
# The role's client_id, i.e. the tokens' `aud`: set explicitly so it is stable across `lab up`s.
IDENTITY_AUDIENCE = "coldstart-approvals"
IDENTITY_TTL = "5m"
# {{identity.entity.name}} renders as a JSON string (quotes included), hence no quotes around it.
IDENTITY_TEMPLATE = '{"name": {{identity.entity.name}}}'
APPROVER_POLICY = "coldstart-approver"
# The OIDC provider whose id tokens carry a decision's nonce, its public client and the scope naming the person.
IDENTITY_PROVIDER = "coldstart"
IDENTITY_CLIENT = "coldstart-cli"
IDENTITY_SCOPE = "coldstart"
IDENTITY_ASSIGNMENT = "coldstart-operators"
USERPASS_MOUNT = "userpass"
# drill-starter starts the drills (four eyes: the starter is verified, and differs from the approver);
# drill-approver, plus the approvers of the runbook the drill runs (runbooks/consul-cold-start.yaml:
# `approvers:`; drill-bot is lab/drills/demo.py's DRILL_APPROVER). tests/test_identity.py keeps them in step.
LAB_APPROVERS = ("drill-approver", "incident-commander", "sre-lead", "drill-bot", "drill-starter")


def _policy(role: str, provider: str) -> str:
    return (f'path "identity/oidc/token/{role}" {{\n  capabilities = ["read"]\n}}\n'
            f'path "identity/oidc/provider/{provider}/authorize" {{\n  capabilities = ["read", "update"]\n}}\n')


def configure_identity(
    client: hvac.Client,
    users: Mapping[str, str],
    *,
    key: str = IDENTITY_KEY,
    role: str = IDENTITY_ROLE,
    audience: str = IDENTITY_AUDIENCE,
    ttl: str = IDENTITY_TTL,
    policy: str = APPROVER_POLICY,
    mount: str = USERPASS_MOUNT,
    issuer: str | None = None,
) -> dict[str, Any]:
    """Set up `identity/oidc/key/<key>` (RS256, only `audience` may use it), `identity/oidc/role/<role>`
    (client_id `audience`, ttl, template {"name": entity name}), the policy reading
    `identity/oidc/token/<role>`, a userpass mount, and per user (name -> password) a userpass user
    with that policy and an entity of the same name aliased to it. `client` holds a root/admin token.

    `issuer` (a URL like http://10.0.0.5:8200) pins identity/oidc/config's issuer; by default Vault
    derives it from its api_addr. Returns {role, audience, issuer, users: {name: entity id}}.
    """
    ident = client.secrets.identity
    if issuer is not None:
        ident.configure_tokens_backend(issuer=issuer)
    ident.create_named_key(key, algorithm="RS256", allowed_client_ids=[audience], rotation_period="24h",
                           verification_ttl="24h")
    ident.create_or_update_role(role, key=key, template=IDENTITY_TEMPLATE, client_id=audience, ttl=ttl)
    client.sys.create_or_update_policy(policy, _policy(role, IDENTITY_PROVIDER))
    methods = client.sys.list_auth_methods()["data"]
    if f"{mount}/" not in methods:
        client.sys.enable_auth_method("userpass", path=mount)
        methods = client.sys.list_auth_methods()["data"]
    accessor = methods[f"{mount}/"]["accessor"]
    entities: dict[str, str] = {}
    for name, password in users.items():
        client.auth.userpass.create_or_update_user(name, password=password, token_policies=[policy],
                                                   mount_point=mount)
        entities[name] = _entity_with_alias(client, name, accessor)
    config = ident.read_well_known_configurations()
    client_id = _provider(client, key, audience, list(entities.values()), issuer)
    return {"role": role, "audience": audience, "issuer": config["issuer"], "users": entities,
            "provider": IDENTITY_PROVIDER, "client_id": client_id}


def _provider(client: hvac.Client, key: str, audience: str, entity_ids: list[str], issuer: str | None) -> str:
    """The OIDC provider, its public client (PKCE, no secret) and the scope naming the person; the client's
    id (Vault makes it) is the decision tokens' audience, returned."""
    import base64

    api = client.adapter
    api.post(f"/v1/identity/oidc/assignment/{IDENTITY_ASSIGNMENT}", json={"entity_ids": entity_ids})
    api.post(f"/v1/identity/oidc/scope/{IDENTITY_SCOPE}",
             json={"template": base64.b64encode(IDENTITY_TEMPLATE.encode()).decode(),
                   "description": "the person's name, matched against a target's approvers and operators"})
    from activities.oidc import DECISION_REDIRECT_URI as REDIRECT_URI

    api.post(f"/v1/identity/oidc/client/{IDENTITY_CLIENT}",
             json={"key": key, "redirect_uris": [REDIRECT_URI], "assignments": [IDENTITY_ASSIGNMENT],
                   "client_type": "public", "id_token_ttl": IDENTITY_TTL, "access_token_ttl": IDENTITY_TTL})
    client_id = api.get(f"/v1/identity/oidc/client/{IDENTITY_CLIENT}")["data"]["client_id"]
    client.secrets.identity.create_named_key(key, algorithm="RS256", allowed_client_ids=[audience, client_id],
                                             rotation_period="24h", verification_ttl="24h")
    body: dict[str, Any] = {"allowed_client_ids": [client_id], "scopes_supported": [IDENTITY_SCOPE]}
    if issuer is not None:
        body["issuer"] = issuer
    api.post(f"/v1/identity/oidc/provider/{IDENTITY_PROVIDER}", json=body)
    return client_id


def _entity_with_alias(client: hvac.Client, name: str, accessor: str) -> str:
    """An entity named `name` with the userpass alias `name`; an alias Vault made implicitly (a login
    before this ran) is moved onto it, so the token's name claim is always the user name."""
    ident = client.secrets.identity
    ident.create_or_update_entity_by_name(name=name)
    entity_id = ident.read_entity_by_name(name=name)["data"]["id"]
    found = ident.lookup_entity(alias_name=name, alias_mount_accessor=accessor)
    data = (found or {}).get("data") if isinstance(found, dict) else None
    if not data:
        ident.create_or_update_entity_alias(name=name, canonical_id=entity_id, mount_accessor=accessor)
    elif data["id"] != entity_id:
        alias = next(a for a in data.get("aliases") or []
                     if a.get("mount_accessor") == accessor and a.get("name") == name)
        ident.update_entity_alias(alias_id=alias["id"], name=name, canonical_id=entity_id, mount_accessor=accessor)
    return entity_id


def approver_password(sec: Secrets, name: str) -> str:
    """The lab approver's Vault password (generated once, 0600 in the lab's secrets dir)."""
    path = sec.file(f"vault-password-{name}")
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(_random.token_urlsafe(18) + "\n")
    return path.read_text().strip()


def identity_facts(cfg: LabConfig, sec: Secrets, approvers: Iterable[str] = LAB_APPROVERS) -> dict[str, Any]:
    """The inventory's `facts.identity`: what `coldstart approve --vault-login` and the run's verifier need."""
    client_id = sec.file("vault-oidc-client-id")
    return {"role": IDENTITY_ROLE, "vault": cfg.vault_url, "provider": IDENTITY_PROVIDER,
            "audience": client_id.read_text().strip() if client_id.exists() else IDENTITY_AUDIENCE,
            "issuer": f"{cfg.vault_url}/v1/identity/oidc/provider/{IDENTITY_PROVIDER}", "userpass_mount": USERPASS_MOUNT,
            "approvers": list(approvers),
            "password_files": {name: str(sec.file(f"vault-password-{name}")) for name in approvers}}


def configure_lab_identity(cfg: LabConfig, sec: Secrets, client: hvac.Client) -> dict[str, Any]:
    """The lab's Vault (root `client`): the setup above for LAB_APPROVERS, issuer pinned to the lab's Vault URL."""
    users = {name: approver_password(sec, name) for name in LAB_APPROVERS}
    setup = configure_identity(client, users, issuer=cfg.vault_url)
    # The provider's client id is Vault's own; the inventory's facts read it back from here.
    path = sec.file("vault-oidc-client-id")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(setup["client_id"] + "\n")
    return setup

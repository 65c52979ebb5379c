"""Attributable approvals: Vault/OpenBao OIDC identity tokens, fetched with the approver's own login and
verified against the keys captured at run start.

Against real dev servers (lab.hashistack.local.VaultDev): OpenBao's `bao` from its wheel always, and
HashiCorp Vault too when `vault` is on PATH or unpacked in .cache/hashistack. Each one is configured
with lab/identity.py, tokens come from cli/identity.fetch_identity_token, the keys from the
`vault.identity_keys` action, and workflows/identity.verify_identity_token checks them. Every refusal
is one line that never holds the token.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import shutil
import stat
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import hvac
import jwt
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from temporalio.exceptions import ApplicationError
from typer.testing import CliRunner

from activities.contracts.vault import IdentityKeysInput
from activities.oidc import IdentityKeys
from activities.vault import identity_keys
from cli.identity import IdentityTokenError, fetch_decision_token, fetch_identity_token
from lab.hashistack.binaries import _openbao_wheel
from lab.hashistack.local import VaultDev
from lab.identity import (
    IDENTITY_AUDIENCE,
    IDENTITY_ROLE,
    LAB_APPROVERS,
    approver_password,
    configure_identity,
    configure_lab_identity,
    identity_facts,
)
from runtime.processes import free_port
from tests import support
from tests.real import needs
from workflows.contract import ApproveRequest
from workflows.identity import (
    CLOCK_SKEW,
    MAX_TOKEN_BYTES,
    IdentityError,
    VerifiedIdentity,
    decision_nonce,
    verify_identity_token,
)

REPO = Path(__file__).resolve().parents[1]
ROOT = "identity-test-root"
USERS = {"sre-lead": "sre-lead-pw", "incident-commander": "ic-pw"}
OTHER_ROLE, OTHER_AUDIENCE = "other-role", "other-audience"


def _binaries() -> list:
    found = [pytest.param(_openbao_wheel() or shutil.which("bao"), id="openbao")]
    vault = shutil.which("vault") or next((str(p) for p in [REPO / ".cache/hashistack/vault"] if os.access(p, os.X_OK)),
                                         None)
    found.append(pytest.param(vault, id="vault", marks=needs(vault, "no vault binary")))
    return found


class Idp:
    """One configured dev server: its URL, what lab/identity.py set up, and the keys captured "at run start"."""

    def __init__(self, vault: VaultDev, setup: dict, keys: IdentityKeys, unconfigured: ApplicationError | None):
        self.vault, self.url, self.setup, self.keys, self.unconfigured = vault, vault.url, setup, keys, unconfigured
        self.root = hvac.Client(url=vault.url, token=ROOT)

    def token(self, user: str = "sre-lead", role: str = IDENTITY_ROLE) -> str:
        return fetch_identity_token(self.url, role, username=user, password=USERS[user])


@pytest.fixture(scope="module", params=_binaries())
def idp(request, tmp_path_factory):
    vault = VaultDev(tmp_path_factory.mktemp("vault"), ROOT, binary=Path(request.param)).start()
    try:
        root = hvac.Client(url=vault.url, token=ROOT)
        # A fresh server has no OIDC key: the capture must say how to configure one.
        try:
            identity_keys(IdentityKeysInput(address=vault.url))
            unconfigured = None
        except ApplicationError as exc:
            unconfigured = exc
        # sre-lead logs in before the setup: Vault makes an entity implicitly (entity_<hex>); the
        # setup must move the alias onto an entity named like the user.
        root.sys.enable_auth_method("userpass")
        root.auth.userpass.create_or_update_user("sre-lead", password="before-setup")
        hvac.Client(url=vault.url, token="").auth.userpass.login("sre-lead", "before-setup")
        configure_identity(root, USERS)
        setup = configure_identity(root, USERS)  # idempotent: lab up runs it on every start
        # A second role, its own key and audience, that sre-lead may also read.
        ident = root.secrets.identity
        ident.create_named_key("other", allowed_client_ids=[OTHER_AUDIENCE])
        ident.create_or_update_role(OTHER_ROLE, key="other", client_id=OTHER_AUDIENCE, ttl="5m",
                                    template='{"name": {{identity.entity.name}}}')
        root.sys.create_or_update_policy("other-reader", f'path "identity/oidc/token/{OTHER_ROLE}" '
                                                         '{ capabilities = ["read"] }')
        root.auth.userpass.create_or_update_user("sre-lead", token_policies=["coldstart-approver", "other-reader"])
        keys = identity_keys(IdentityKeysInput(address=vault.url))
        yield Idp(vault, setup, keys, unconfigured)
    finally:
        vault.stop()


def refused(token: str, keys: IdentityKeys, expected: str, **kw) -> str:
    """verify_identity_token refuses with one line containing `expected`, and never echoes the token."""
    kw.setdefault("audience", IDENTITY_AUDIENCE)
    kw.setdefault("now", datetime.now(UTC))
    with pytest.raises(IdentityError) as caught:
        verify_identity_token(token, keys, **kw)
    message = str(caught.value)
    assert expected in message, message
    assert "\n" not in message and message.startswith("identity token ")
    for part in token.split("."):
        if len(part) >= 16:
            assert part not in message and part[:16] not in message
    return message


def b64(data: bytes | dict) -> str:
    raw = json.dumps(data).encode() if isinstance(data, dict) else data
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def parts(token: str) -> tuple[dict, dict, str]:
    header, payload, sig = token.split(".")
    pad = lambda s: s + "=" * (-len(s) % 4)
    return (json.loads(base64.urlsafe_b64decode(pad(header))), json.loads(base64.urlsafe_b64decode(pad(payload))),
            sig)


# ---- against the real Vault / OpenBao --------------------------------------------------------------------

def test_approver_token_verifies_to_the_entity(idp):
    token = idp.token("sre-lead")
    now = datetime.now(UTC)
    who = verify_identity_token(token, idp.keys, audience=IDENTITY_AUDIENCE, now=now)
    entity = idp.root.secrets.identity.read_entity_by_name("sre-lead")["data"]
    assert who == VerifiedIdentity(subject=entity["id"], name="sre-lead", issuer=f"{idp.url}/v1/identity/oidc",
                                   expires_at=who.expires_at)
    assert who.subject == idp.setup["users"]["sre-lead"]
    assert timedelta(minutes=4) < who.expires_at - now <= timedelta(minutes=5) + CLOCK_SKEW  # the role's ttl: 5m
    header, claims, _ = parts(token)
    assert header["alg"] == "RS256" and header["kid"] in {k["kid"] for k in idp.keys.keys}
    assert claims["aud"] == IDENTITY_AUDIENCE == idp.setup["audience"] and claims["iss"] == idp.keys.issuer
    other = verify_identity_token(idp.token("incident-commander"), idp.keys, audience=IDENTITY_AUDIENCE, now=now)
    assert other.name == "incident-commander" and other.subject == idp.setup["users"]["incident-commander"]


def test_capture_is_public_and_says_how_to_configure(idp, monkeypatch):
    assert idp.keys.issuer == idp.setup["issuer"] == f"{idp.url}/v1/identity/oidc"
    assert all({"kid", "kty"} <= k.keys() for k in idp.keys.keys)
    assert abs(idp.keys.captured_at - datetime.now(UTC)) < timedelta(minutes=5)
    assert IdentityKeys.model_validate_json(idp.keys.model_dump_json()) == idp.keys  # travels in a history
    # The worker's own Vault token does not travel to the public endpoints.
    import requests

    sent_headers: list[dict] = []
    real_request = requests.Session.request

    def spy(self, method, url, *args, **kwargs):
        sent_headers.append(dict(kwargs.get("headers") or {}) | dict(self.headers))
        return real_request(self, method, url, *args, **kwargs)

    monkeypatch.setattr(requests.Session, "request", spy)
    monkeypatch.setenv("VAULT_TOKEN", "the-workers-own-token")
    assert identity_keys({"address": idp.url}).keys == idp.keys.keys
    assert len(sent_headers) == 2 and not any("X-Vault-Token" in h for h in sent_headers)
    exc = idp.unconfigured
    assert exc is not None and exc.non_retryable and exc.type == "VaultIdentityUnconfigured"
    assert "has no OIDC signing key" in exc.message and "identity/oidc/key/" in exc.message
    assert "identity/oidc/provider/" in exc.message and "\n" not in exc.message


def test_capture_from_a_vault_that_does_not_answer_is_retryable():
    with pytest.raises(ApplicationError) as caught:
        identity_keys(IdentityKeysInput(address=f"http://127.0.0.1:{free_port()}", timeout_seconds=2))
    assert not caught.value.non_retryable and "unreachable" in caught.value.message


def test_wrong_audience_and_another_roles_token(idp):
    token = idp.token("sre-lead")
    refused(token, idp.keys, "is for audience 'coldstart-approvals', not 'someone-else' (the Vault role's client_id)",
            audience="someone-else")
    # Same Vault, same user, signed by a captured key, but minted for another role: its audience.
    other = idp.token("sre-lead", role=OTHER_ROLE)
    assert verify_identity_token(other, idp.keys, audience=OTHER_AUDIENCE, now=datetime.now(UTC)).name
    refused(other, idp.keys, "is for audience 'other-audience', not 'coldstart-approvals'")


def test_expired_token(idp):
    token = idp.token("sre-lead")
    exp = datetime.fromtimestamp(parts(token)[1]["exp"], UTC)
    # Up to CLOCK_SKEW (30 s) past exp still passes; from then on it is expired.
    assert verify_identity_token(token, idp.keys, audience=IDENTITY_AUDIENCE,
                                 now=exp + CLOCK_SKEW - timedelta(seconds=1))
    message = refused(token, idp.keys, "expired at ", now=exp + CLOCK_SKEW)
    assert "fetch a new one" in message
    refused(token, idp.keys, "expired at ", now=exp + timedelta(hours=1))
    # Issued "in the future" for a verifier whose clock is behind by more than the skew.
    refused(token, idp.keys, "was issued in the future",
            now=exp - timedelta(minutes=5) - CLOCK_SKEW - timedelta(seconds=5))


def test_token_from_another_vault_or_a_key_made_after_capture(idp, tmp_path):
    # Another Vault, set up exactly like the lab's (same role, audience and user names): its own keys.
    cfg = _lab_config(tmp_path)
    from lab.services import Secrets

    sec = Secrets(cfg)
    other = VaultDev(tmp_path / "other-vault", ROOT, binary=idp.vault.binary).start()
    try:
        facts = configure_lab_identity(cfg, sec, hvac.Client(url=other.url, token=ROOT))
        again = configure_lab_identity(cfg, sec, hvac.Client(url=other.url, token=ROOT))
        assert facts == again and set(facts["users"]) == set(LAB_APPROVERS)
        lab = identity_facts(cfg, sec)
        # Decisions are bound: the run reads the provider's keys, the CLI uses its public client.
        assert (facts["issuer"], lab["issuer"]) == (f"{cfg.vault_url}/v1/identity/oidc",
                                                    f"{cfg.vault_url}/v1/identity/oidc/provider/coldstart")
        assert lab["audience"] == facts["client_id"] and lab["provider"] == facts["provider"] == "coldstart"
        nonce = decision_nonce("coldstart-lab", "run-1", "approve", "restore")
        token = fetch_decision_token(other.url, lab["provider"], lab["audience"], nonce, username="drill-bot",
                                     password=approver_password(sec, "drill-bot"))
        own_keys = identity_keys(IdentityKeysInput(address=other.url, provider=lab["provider"]))
        assert own_keys.issuer == lab["issuer"]  # pinned to the lab's Vault URL, not the address asked
        who = verify_identity_token(token, own_keys, audience=lab["audience"], now=datetime.now(UTC),
                                    nonce=nonce)
        assert who.name == "drill-bot" and who.subject == facts["users"]["drill-bot"]
    finally:
        other.stop()
    refused(token, idp.keys, "not among the ")
    message = refused(token, idp.keys, "captured from ")
    assert "at run start" in message and parts(token)[0]["kid"] in message

    # A key (and role) created on this Vault after the run captured its keys.
    ident = idp.root.secrets.identity
    ident.create_named_key("late", allowed_client_ids=["late-audience"])
    ident.create_or_update_role("late-role", key="late", client_id="late-audience", ttl="5m",
                                template='{"name": {{identity.entity.name}}}')
    idp.root.sys.create_or_update_policy("late", 'path "identity/oidc/token/late-role" { capabilities = ["read"] }')
    idp.root.auth.userpass.create_or_update_user("incident-commander", token_policies=["coldstart-approver", "late"])
    late = idp.token("incident-commander", role="late-role")
    refused(late, idp.keys, "which is not among the ", audience="late-audience")
    fresh = identity_keys(IdentityKeysInput(address=idp.url))
    assert verify_identity_token(late, fresh, audience="late-audience", now=datetime.now(UTC)).name == \
        "incident-commander"


def test_tampered_token(idp):
    token = idp.token("sre-lead")
    header, claims, sig = token.split(".")
    forged_claims = {**parts(token)[1], "name": "incident-commander"}
    refused(f"{header}.{b64(forged_claims)}.{sig}", idp.keys, "signature does not verify with key")
    flipped = sig[:10] + ("A" if sig[10] != "A" else "B") + sig[11:]
    refused(f"{header}.{claims}.{flipped}", idp.keys, "signature does not verify")
    refused(f"{header}.{claims}.", idp.keys, "signature does not verify")


def test_alg_none_and_hmac_with_the_public_key(idp):
    token = idp.token("sre-lead")
    head, claims, _ = parts(token)
    kid = head["kid"]
    body = b64({**claims, "name": "incident-commander"})
    refused(f"{b64({'alg': 'none', 'kid': kid})}.{body}.", idp.keys, "alg 'none' is not allowed")
    refused(f"{b64({'alg': 'None', 'typ': 'JWT'})}.{body}.", idp.keys, "alg 'None' is not allowed")
    # HS256 "signed" with the RSA public key (as PEM and as the JWK's JSON): the classic key confusion.
    jwk = next(k for k in idp.keys.keys if k["kid"] == kid)
    pem = jwt.PyJWK(jwk).key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    for secret in (pem, json.dumps(jwk).encode()):
        signing_input = f"{b64({'alg': 'HS256', 'kid': kid})}.{body}"
        mac = b64(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())
        message = refused(f"{signing_input}.{mac}", idp.keys, "alg 'HS256' is not allowed")
        assert "RS256" in message and "EdDSA" in message
    # An allowed alg that does not fit the key (RS256 key, ES256 claimed).
    refused(f"{b64({'alg': 'ES256', 'kid': kid})}.{body}.AAAA", idp.keys, "alg ES256 does not match its key")
    refused(f"{b64({'alg': 'RS256'})}.{body}.AAAA", idp.keys, "has no key id (kid)")


def test_oversized_and_garbage(idp):
    token = idp.token("sre-lead")
    refused("a" * (MAX_TOKEN_BYTES + 1), idp.keys, f"is {MAX_TOKEN_BYTES + 1} bytes, over the {MAX_TOKEN_BYTES}-byte")
    padded = token + "." + "A" * MAX_TOKEN_BYTES
    refused(padded, idp.keys, "over the 16384-byte limit")
    refused("", idp.keys, "is empty")
    refused("  \n", idp.keys, "is empty")
    refused("not a token", idp.keys, "is not a compact JWS")
    refused(token.replace(".", "..", 1), idp.keys, "is not a compact JWS")
    refused("a.b.c", idp.keys, "header is not a base64url-encoded JSON object")
    refused(f"{b64(b'[1, 2]')}.e30.AAAA", idp.keys, "header is not a base64url-encoded JSON object")
    refused(token + "\u00e9", idp.keys, "is not a compact JWS")
    with pytest.raises(IdentityError, match="must be a string"):
        verify_identity_token(token.encode(), idp.keys, audience=IDENTITY_AUDIENCE, now=datetime.now(UTC))
    # Surrounding whitespace (a token pasted from a terminal) is fine.
    assert verify_identity_token(f"  {token}\n", idp.keys, audience=IDENTITY_AUDIENCE, now=datetime.now(UTC))


def test_fetch_refuses_a_token_without_identity_and_bad_logins(idp, monkeypatch):
    with pytest.raises(IdentityTokenError) as caught:
        fetch_identity_token(idp.url, IDENTITY_ROLE, token=ROOT)
    assert str(caught.value) == ("this Vault token has no identity (entity): log in as yourself (e.g. --vault-login); "
                                 "a root token has no identity")
    with pytest.raises(IdentityTokenError, match=r"^Vault login as 'sre-lead' on auth/userpass failed: invalid "):
        fetch_identity_token(idp.url, IDENTITY_ROLE, username="sre-lead", password="wrong")
    with pytest.raises(IdentityTokenError, match=r"^Vault denied reading identity/oidc/token/nope .*needs a policy"):
        fetch_identity_token(idp.url, "nope", username="sre-lead", password=USERS["sre-lead"])
    with pytest.raises(IdentityTokenError, match=r"^no password for Vault user 'sre-lead'"):
        fetch_identity_token(idp.url, IDENTITY_ROLE, username="sre-lead")
    with pytest.raises(IdentityTokenError, match=r"unreachable: ConnectionError$"):
        fetch_identity_token(f"http://127.0.0.1:{free_port()}", IDENTITY_ROLE, username="sre-lead", password="x")
    # The approver's existing login: a token given, or VAULT_TOKEN / ~/.vault-token.
    login = hvac.Client(url=idp.url, token="")
    login.auth.userpass.login("incident-commander", USERS["incident-commander"])
    now = datetime.now(UTC)
    given = fetch_identity_token(idp.url, IDENTITY_ROLE, token=login.token)
    assert verify_identity_token(given, idp.keys, audience=IDENTITY_AUDIENCE, now=now).name == "incident-commander"
    monkeypatch.setenv("VAULT_TOKEN", login.token)
    from_env = fetch_identity_token(idp.url, IDENTITY_ROLE)
    assert verify_identity_token(from_env, idp.keys, audience=IDENTITY_AUDIENCE, now=now).name == "incident-commander"
    monkeypatch.setenv("VAULT_TOKEN", ROOT)
    with pytest.raises(IdentityTokenError, match="a root token has no identity"):
        fetch_identity_token(idp.url, IDENTITY_ROLE)
    # A userpass login is the user's identity whatever VAULT_TOKEN holds (here a root token).
    assert verify_identity_token(idp.token("sre-lead"), idp.keys, audience=IDENTITY_AUDIENCE, now=now).name == \
        "sre-lead"


async def test_cli_vault_login_fetches_a_token_bound_to_the_decision(idp, env, task_queue, tmp_path, monkeypatch):
    """`coldstart approve --vault-login` against a real run: the approver's own Vault (VAULT_ADDR, the one the run
    names) gives a token from the run's OIDC provider with the approval's nonce; `coldstart identity token` prints
    one for the Web UI; a bad password is one line, exit 1."""
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: cli-bound}}
        target: t
        approvers: [sre-lead, incident-commander]
        identity: {{vault: "{idp.url}", audience: {idp.setup["client_id"]}, provider: {idp.setup["provider"]}}}
        steps:
          - id: approve-restore
            approval: {{prompt: "restore?"}}
          - id: ready
            approval: {{prompt: "ready?"}}
    """)
    monkeypatch.setenv("TEMPORAL_ADDRESS", env.client.service_client.config.target_host)
    monkeypatch.setenv("VAULT_ADDR", idp.url)  # the approver's own Vault, the one the run names
    monkeypatch.setenv("VAULT_PASSWORD", USERS["sre-lead"])
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        await support.wait_for(lambda: _awaiting(handle, "approve-restore"))
        result = await asyncio.to_thread(CliRunner().invoke, _app(), [
            "approve", handle.id, "approve-restore", "--as", "sre-lead", "--vault-login"])
        assert result.exit_code == 0, (result.output, result.exception)
        await support.wait_for(lambda: _awaiting(handle, "ready"))
        [granted] = [s for s in (await support.status(handle)).steps if s.id == "approve-restore"]
        assert [a.subject for a in granted.approvals] == [idp.setup["users"]["sre-lead"]]

        # What the Web UI's approver pastes: printed alone on stdout, and it approves exactly that decision.
        printed = await asyncio.to_thread(CliRunner().invoke, _app(), [
            "identity", "token", handle.id, "--verb", "approve", "--step", "ready", "--as", "sre-lead"])
        assert printed.exit_code == 0, (printed.output, printed.exception)
        token = printed.stdout.strip()
        assert token.count(".") == 2 and "\n" not in token
        described = await handle.describe()
        nonce = decision_nonce(handle.id, described.run_id, "approve", "ready")
        keys = identity_keys(IdentityKeysInput(address=idp.url, provider=idp.setup["provider"]))
        who = verify_identity_token(token, keys, audience=idp.setup["client_id"], now=datetime.now(UTC),
                                    nonce=nonce)
        assert who.name == "sre-lead"

        monkeypatch.setenv("VAULT_PASSWORD", "wrong")
        result = await asyncio.to_thread(CliRunner().invoke, _app(), [
            "approve", handle.id, "ready", "--as", "ic", "--vault-login", "--vault-user", "incident-commander"])
        assert "Vault login as 'incident-commander' on auth/userpass failed" in str(result.exception)
        assert result.exception.code == 1
        await handle.execute_update("approve", ApproveRequest(step="ready", approver="sre-lead", identity_token=token))
        await handle.result()


async def _awaiting(handle, step: str) -> bool:
    return step in (await support.status(handle)).awaiting_approval


# ---- pure verifier checks with locally made keys -----------------------------------------------------------

ISSUER = "https://vault.example:8200/v1/identity/oidc"
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _local_keys():
    made = {"RS256": rsa.generate_private_key(public_exponent=65537, key_size=2048),
            "ES256": ec.generate_private_key(ec.SECP256R1()), "ES384": ec.generate_private_key(ec.SECP384R1()),
            "ES512": ec.generate_private_key(ec.SECP521R1()), "EdDSA": ed25519.Ed25519PrivateKey.generate()}
    jwks = []
    for alg, private in made.items():
        algo = jwt.get_algorithm_by_name(alg)
        jwks.append({**json.loads(algo.to_jwk(private.public_key())), "kid": f"kid-{alg}", "alg": alg, "use": "sig"})
    return made, IdentityKeys(issuer=ISSUER, keys=jwks, captured_at=NOW)


@pytest.fixture(scope="module")
def local():
    return _local_keys()


def sign(local, alg: str = "RS256", *, kid: str | None = None, drop: tuple[str, ...] = (), **claims) -> str:
    made, _ = local
    iat = int(NOW.timestamp())
    body = {"iss": ISSUER, "aud": IDENTITY_AUDIENCE, "sub": "entity-1", "name": "sre-lead", "iat": iat,
            "exp": iat + 300, "namespace": "root", **claims}
    for key in drop:
        body.pop(key)
    return jwt.encode(body, made[alg], algorithm=alg, headers={"kid": kid or f"kid-{alg}"})


def test_every_vault_algorithm_verifies(local):
    _, keys = local
    for alg in ("RS256", "ES256", "ES384", "ES512", "EdDSA"):
        who = verify_identity_token(sign(local, alg), keys, audience=IDENTITY_AUDIENCE, now=NOW)
        assert (who.subject, who.name, who.issuer) == ("entity-1", "sre-lead", ISSUER)
        assert who.expires_at == NOW + timedelta(seconds=300)
    # RS384/RS512 with an RSA key that does not pin its alg; a list audience.
    made, _ = local
    rsa_jwk = {k: v for k, v in keys.keys[0].items() if k != "alg"}
    unpinned = IdentityKeys(issuer=ISSUER, keys=[rsa_jwk], captured_at=NOW)
    for alg in ("RS384", "RS512"):
        iat = int(NOW.timestamp())
        token = jwt.encode({"iss": ISSUER, "aud": ["x", IDENTITY_AUDIENCE], "sub": "e", "name": "n", "iat": iat,
                            "exp": iat + 60}, made["RS256"], algorithm=alg, headers={"kid": "kid-RS256"})
        assert verify_identity_token(token, unpinned, audience=IDENTITY_AUDIENCE, now=NOW).name == "n"
    # A key pinned to RS256 refuses RS384 from the same RSA key.
    token = jwt.encode({"iss": ISSUER}, made["RS256"], algorithm="RS384", headers={"kid": "kid-RS256"})
    refused(token, keys, "alg RS384 does not match its key 'kid-RS256' (RSA, alg RS256)", now=NOW)
    # The naive `now` is taken as UTC.
    assert verify_identity_token(sign(local), keys, audience=IDENTITY_AUDIENCE, now=NOW.replace(tzinfo=None))


def test_claims(local):
    _, keys = local
    iat = int(NOW.timestamp())
    refused(sign(local, iss="https://other.example/v1/identity/oidc"), keys,
            f"issuer 'https://other.example/v1/identity/oidc' is not this run's Vault issuer '{ISSUER}'", now=NOW)
    refused(sign(local, drop=("iss",)), keys, "issuer None is not this run's Vault issuer", now=NOW)
    refused(sign(local, drop=("aud",)), keys, "is for audience None, not 'coldstart-approvals'", now=NOW)
    refused(sign(local, aud=["a", "b"]), keys, "is for audience ['a', 'b'], not", now=NOW)
    refused(sign(local, drop=("exp",)), keys, "has no 'exp' claim", now=NOW)
    refused(sign(local, drop=("iat",)), keys, "has no 'iat' claim", now=NOW)
    refused(sign(local, exp="soon"), keys, "claim 'exp' is not a NumericDate", now=NOW)
    refused(sign(local, exp=True), keys, "claim 'exp' is not a NumericDate", now=NOW)
    refused(sign(local, exp=1e30), keys, "claim 'exp' is out of range", now=NOW)
    refused(sign(local, exp=iat + 3600), keys, "lives 3600 s (exp - iat), over the 900 s allowed", now=NOW)
    assert verify_identity_token(sign(local, exp=iat + 3600), keys, audience=IDENTITY_AUDIENCE, now=NOW,
                                 max_ttl=timedelta(hours=1))
    refused(sign(local, iat=iat + 60, exp=iat + 300), keys, "was issued in the future", now=NOW)
    assert verify_identity_token(sign(local, iat=iat + 29), keys, audience=IDENTITY_AUDIENCE, now=NOW)
    refused(sign(local, nbf=iat + 120), keys, "is not valid before 2026-03-01T12:02:00Z", now=NOW)
    refused(sign(local, drop=("sub",)), keys, "has no subject (sub)", now=NOW)
    refused(sign(local, sub=" "), keys, "has no subject (sub)", now=NOW)
    message = refused(sign(local, drop=("name",)), keys, "has no 'name' claim (a non-empty string)", now=NOW)
    assert '{"name": {{identity.entity.name}}}' in message
    refused(sign(local, name=["sre-lead"]), keys, "has no 'name' claim", now=NOW)
    refused(sign(local, name=""), keys, "has no 'name' claim", now=NOW)
    who = verify_identity_token(sign(local, username="alice"), keys, audience=IDENTITY_AUDIENCE, now=NOW,
                                name_claim="username")
    assert who.name == "alice"
    # A claim value is quoted and cut short, never spread over lines.
    message = refused(sign(local, iss="x\n" * 200), keys, "is not this run's Vault issuer", now=NOW)
    assert len(message) < 300
    refused(sign(local, kid="k\n" + "z" * 500), keys, "which is not among the 5 key(s) captured", now=NOW)
    refused(sign(local), IdentityKeys(issuer=ISSUER, keys=[], captured_at=NOW), "no keys were captured", now=NOW)
    # Unverifiable payloads: not JSON objects, even when signed.
    made, _ = local
    head = b64({"alg": "EdDSA", "kid": "kid-EdDSA"})
    for payload in (b"[1]", b"not json"):
        body = b64(payload)
        sig = b64(made["EdDSA"].sign(f"{head}.{body}".encode()))
        refused(f"{head}.{body}.{sig}", keys, "payload is not a JSON object", now=NOW)


# ---- the lab and the CLI seam ------------------------------------------------------------------------------

def _lab_config(tmp_path: Path):
    from lab.settings import LabConfig

    return LabConfig(state_dir=tmp_path / "lab", inventory_path=tmp_path / "lab.yaml")


def test_lab_approvers_cover_the_drill_runbook(tmp_path):
    from lab.drills.demo import DRILL_APPROVER

    runbook = yaml.safe_load((REPO / "runbooks/consul-cold-start.yaml").read_text())
    assert set(runbook["approvers"]) | {DRILL_APPROVER, "drill-approver"} <= set(LAB_APPROVERS)
    from lab.services import Secrets

    cfg = _lab_config(tmp_path)
    sec = Secrets(cfg)
    first = approver_password(sec, "drill-approver")
    assert first == approver_password(sec, "drill-approver") != approver_password(sec, "sre-lead")
    assert stat.S_IMODE(sec.file("vault-password-drill-approver").stat().st_mode) == 0o600
    facts = identity_facts(cfg, sec)
    assert facts["role"] == IDENTITY_ROLE and facts["audience"] == IDENTITY_AUDIENCE and facts["vault"] == cfg.vault_url
    assert facts["password_files"]["drill-approver"] == str(sec.file("vault-password-drill-approver"))


def _app():
    from cli.main import app

    return app


def _capture_updates(monkeypatch) -> list:
    import cli.main

    sent: list = []
    monkeypatch.setattr(cli.main, "_update", lambda ref, name, body: sent.append((ref, name, body)))
    return sent


def test_cli_identity_token_options(monkeypatch, local, tmp_path):
    sent = _capture_updates(monkeypatch)
    token = sign(local)
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    junk = tmp_path / "junk"
    junk.write_text("definitely not a jwt")
    runner = CliRunner()
    result = runner.invoke(_app(), ["approve", "local", "go", "--as", "bob", "-m", "ok", "--identity-token", "-"],
                           input=f"{token}\n")
    assert result.exit_code == 0, (result.output, result.exception)
    result = runner.invoke(_app(), ["skip", "local", "held", "--as", "carol", "--identity-token", str(token_file)])
    assert result.exit_code == 0, (result.output, result.exception)
    result = runner.invoke(_app(), ["pause", "local", "--as", "dave"])
    assert result.exit_code == 0, (result.output, result.exception)
    (r1, n1, approve), (_r2, n2, skip), (_r3, n3, pause) = sent
    assert (r1, n1, approve.step, approve.approver, approve.comment, approve.identity_token) == \
        ("local", "approve", "go", "bob", "ok", token)
    assert (n2, skip.step, skip.actor, skip.identity_token) == ("skip", "held", "carol", token)
    assert (n3, pause.step, pause.identity_token) == ("pause", None, None)
    # Misuse: one line, exit 2, nothing sent.
    for args, stdin, expected in [
        (["--identity-token", "x.y.z", "--vault-login"], None, "give one of them"),
        (["--identity-token", "-"], "\n", "the token is empty"),
        (["--vault-login", "--vault-auth", "kerberos"], None, "use userpass or token"),
        (["--identity-token", str(junk)], None, "identity_token"),
        # The token itself on the command line is refused: the process list and shell history would keep it.
        (["--identity-token", token], None, "give a file holding the token"),
    ]:
        monkeypatch.delenv("VAULT_ADDR", raising=False)
        result = runner.invoke(_app(), ["approve", "local", "go", "--as", "bob", *args], input=stdin)
        assert expected in str(result.exception), (args, result.exception)
        assert result.exception.code == 2 and "\n" not in str(result.exception)
    # --vault-login asks the run where its tokens come from (its Vault, provider and the decision's nonce).
    monkeypatch.setenv("TEMPORAL_ADDRESS", f"127.0.0.1:{free_port()}")
    result = runner.invoke(_app(), ["resume", "local", "--vault-login"])
    assert str(result.exception).startswith("cannot reach Temporal at 127.0.0.1:")
    assert len(sent) == 3


def test_uuid_named_kid_is_reported_for_operators(local):
    # The kid in the message is what an operator compares with `vault read identity/oidc/.well-known/keys`.
    kid = str(uuid.uuid4())
    message = refused(sign(local, kid=kid), local[1], "was signed by key", now=NOW)
    assert kid in message

"""Vault HTTP API stand-in: sys/health, token lookup-self, AppRole login and KV v2 at secret/."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import secrets
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from .clock import Clock, RealClock
from .listeners import LABEL, bind_socket, parse_listen, serve_forever
from .persist import load_json, save_json

__all__ = ["VaultState", "AppRole", "make_app", "main", "STATE"]

VAULT_VERSION = "1.8.4"
KV_MOUNT = "secret"
TOKEN_TTL_S = 1200  # approle default token_ttl in the lab config


@dataclass
class AppRole:
    name: str
    role_id: str
    secret_id: str
    policies: list[str] = field(default_factory=lambda: ["default"])


def _rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class VaultState:
    def __init__(
        self,
        root_token: str,
        approles: list[AppRole] | None = None,
        clock: Clock | None = None,
        state_dir: Path | None = None,
        cluster_name: str = "vault-cluster-lab",
    ) -> None:
        self.clock = clock or RealClock()
        self.root_token = root_token
        self.approles = {r.role_id: r for r in (approles or [])}
        self.state_dir = Path(state_dir) if state_dir else None
        self.cluster_name = cluster_name
        self.cluster_id = str(uuid.uuid5(uuid.NAMESPACE_DNS, cluster_name))
        self.sealed = False
        self.standby = False
        # One key share (t = n = 1), as a dev server prints it: PUT sys/unseal with it unseals.
        self.unseal_key = secrets.token_urlsafe(32)
        now = self.clock.time()
        self.tokens: dict[str, dict[str, Any]] = {
            root_token: {"policies": ["root"], "path": "auth/token/root", "display_name": "root",
                         "accessor": secrets.token_hex(12), "issue_time": now, "ttl": 0, "meta": None}
        }
        # path -> {"versions": {n: {...}}, "current": n, "created": ts, "updated": ts, "max_versions": 0}
        self.kv: dict[str, dict[str, Any]] = {}
        self.dirty = False
        self._load()

    @property
    def state_file(self) -> Path | None:
        return self.state_dir / "vault-state.json" if self.state_dir else None

    def _load(self) -> None:
        if self.state_file is None:
            return
        data = load_json(self.state_file)
        if data:
            self.kv = data.get("kv", {})
            self.tokens.update(data.get("tokens", {}))

    def save(self) -> None:
        if self.state_file is not None and self.dirty:
            self.dirty = False
            tokens = {k: v for k, v in self.tokens.items() if k != self.root_token}
            save_json(self.state_file, {"kv": self.kv, "tokens": tokens})


STATE = web.AppKey("vault_state", VaultState)


class VaultError(Exception):
    def __init__(self, status: int, *errors: str) -> None:
        super().__init__(*errors)
        self.status = status
        self.errors = list(errors)


def _st(request: web.Request) -> VaultState:
    return request.app[STATE]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(data), content_type="application/json",
                        headers={"Cache-Control": "no-store"})


def _envelope(data: Any = None, auth: Any = None, warnings: Any = None) -> dict[str, Any]:
    return {"request_id": str(uuid.uuid4()), "lease_id": "", "renewable": False, "lease_duration": 0,
            "data": data, "wrap_info": None, "warnings": warnings, "auth": auth}


def _token(request: web.Request) -> dict[str, Any]:
    st = _st(request)
    tok = request.headers.get("X-Vault-Token")
    if not tok:
        auth = request.headers.get("Authorization", "")
        if auth.lower().startswith("bearer "):
            tok = auth[7:].strip()
    info = st.tokens.get(tok or "")
    if info is None:
        raise VaultError(403, "permission denied")
    ttl = info["ttl"]
    if ttl and st.clock.time() > info["issue_time"] + ttl:
        raise VaultError(403, "permission denied")
    return dict(info, id=tok)


UNSEALED_OK = ("/v1/sys/health", "/v1/sys/seal-status", "/v1/sys/unseal")


@web.middleware
async def vault_middleware(request: web.Request, handler):
    st = _st(request)
    try:
        if st.sealed and request.path.startswith("/v1/") and request.path not in UNSEALED_OK:
            raise VaultError(503, "Vault is sealed")
        return await handler(request)
    except VaultError as exc:
        return _json({"errors": exc.errors}, status=exc.status)


# ---- sys ------------------------------------------------------------------------------------
def _health_body(st: VaultState) -> dict[str, Any]:
    if st.sealed:  # as Vault answers sealed: a standby, replication unknown, no cluster name or ID
        return {"initialized": True, "sealed": True, "standby": True, "performance_standby": False,
                "replication_performance_mode": "unknown", "replication_dr_mode": "unknown",
                "server_time_utc": int(st.clock.time()), "version": VAULT_VERSION}
    return {
        "initialized": True, "sealed": False, "standby": st.standby, "performance_standby": False,
        "replication_performance_mode": "disabled", "replication_dr_mode": "disabled",
        "server_time_utc": int(st.clock.time()), "version": VAULT_VERSION,
        "cluster_name": st.cluster_name, "cluster_id": st.cluster_id,
    }


async def sys_health(request: web.Request) -> web.Response:
    """GET|HEAD /v1/sys/health -- 200 active, 429 standby, 503 sealed (overridable by query).
    https://developer.hashicorp.com/vault/api-docs/system/health"""
    st = _st(request)
    q = request.query

    def code(name: str, default: int) -> int:
        return int(q[name]) if name in q else default

    if st.sealed:
        status = code("sealedcode", 503)
    elif st.standby:
        standby_ok = q.get("standbyok", "").lower() in ("", "true", "1") and "standbyok" in q
        status = code("activecode", 200) if standby_ok else code("standbycode", 429)
    else:
        status = code("activecode", 200)
    if request.method == "HEAD":
        return web.Response(status=status)
    return _json(_health_body(st), status=status)


def _seal_status(st: VaultState) -> dict[str, Any]:
    return {"type": "shamir", "initialized": True, "sealed": st.sealed, "t": 1, "n": 1, "progress": 0,
            "nonce": "", "version": VAULT_VERSION, "migration": False, "cluster_name": st.cluster_name,
            "cluster_id": st.cluster_id, "recovery_seal": False, "storage_type": "raft"}


async def sys_seal_status(request: web.Request) -> web.Response:
    """GET /v1/sys/seal-status -- https://developer.hashicorp.com/vault/api-docs/system/seal-status"""
    return _json(_seal_status(_st(request)))


async def sys_seal(request: web.Request) -> web.Response:
    """PUT /v1/sys/seal -- needs a sudo (here: the root) token -- https://developer.hashicorp.com/vault/api-docs/system/seal"""
    st = _st(request)
    if "root" not in _token(request)["policies"]:
        raise VaultError(403, "permission denied")
    st.sealed = True
    return web.Response(status=204)


async def sys_unseal(request: web.Request) -> web.Response:
    """PUT /v1/sys/unseal {"key"} -- one share unseals (t = 1) -- https://developer.hashicorp.com/vault/api-docs/system/unseal"""
    st = _st(request)
    try:
        body = json.loads(await request.read() or b"{}")
    except json.JSONDecodeError as exc:
        raise VaultError(400, f"failed to parse JSON input: {exc}") from exc
    if body.get("reset"):
        return _json(_seal_status(st))
    if not body.get("key"):
        raise VaultError(400, "'key' must be specified in request body as JSON, or 'reset' set to true")
    if st.sealed and body["key"] != st.unseal_key:
        raise VaultError(400, "Unseal failed, invalid key")
    st.sealed = False
    return _json(_seal_status(st))


# ---- auth --------------------------------------------------------------------------------------
async def token_lookup_self(request: web.Request) -> web.Response:
    """GET /v1/auth/token/lookup-self -- https://developer.hashicorp.com/vault/api-docs/auth/token#lookup-a-token-self"""
    st = _st(request)
    info = _token(request)
    now = st.clock.time()
    ttl = info["ttl"]
    data = {
        "accessor": info["accessor"], "creation_time": int(info["issue_time"]), "creation_ttl": ttl,
        "display_name": info["display_name"], "entity_id": "",
        "expire_time": _rfc3339(info["issue_time"] + ttl) if ttl else None, "explicit_max_ttl": 0,
        "id": info["id"], "issue_time": _rfc3339(info["issue_time"]), "meta": info["meta"], "num_uses": 0,
        "orphan": True, "path": info["path"], "policies": info["policies"], "renewable": bool(ttl),
        "ttl": max(0, int(info["issue_time"] + ttl - now)) if ttl else 0, "type": "service",
    }
    return _json(_envelope(data))


async def approle_login(request: web.Request) -> web.Response:
    """POST /v1/auth/approle/login {"role_id","secret_id"} -> auth.client_token.
    https://developer.hashicorp.com/vault/api-docs/auth/approle#login-with-approle"""
    st = _st(request)
    try:
        body = json.loads(await request.read() or b"{}")
    except json.JSONDecodeError as exc:
        raise VaultError(400, f"failed to parse JSON input: {exc}") from exc
    role_id = body.get("role_id")
    if not role_id:
        raise VaultError(400, "missing role_id")
    role = st.approles.get(role_id)
    if role is None:
        raise VaultError(400, "invalid role ID")
    if body.get("secret_id") != role.secret_id:
        raise VaultError(400, "invalid secret id")
    token = "hvs." + secrets.token_urlsafe(24)
    accessor = secrets.token_hex(12)
    st.tokens[token] = {"policies": sorted(set(["default", *role.policies])), "path": "auth/approle/login",
                        "display_name": "approle", "accessor": accessor, "issue_time": st.clock.time(),
                        "ttl": TOKEN_TTL_S, "meta": {"role_name": role.name}}
    st.dirty = True
    policies = st.tokens[token]["policies"]
    auth = {"client_token": token, "accessor": accessor, "policies": policies, "token_policies": policies,
            "metadata": {"role_name": role.name}, "lease_duration": TOKEN_TTL_S, "renewable": True,
            "entity_id": "", "token_type": "service", "orphan": True, "mfa_requirement": None,
            "num_uses": 0}
    return _json(_envelope(None, auth=auth))


# ---- KV v2 --------------------------------------------------------------------------------------------
def _version_meta(v: dict[str, Any]) -> dict[str, Any]:
    return {"created_time": v["created_time"], "custom_metadata": None,
            "deletion_time": v["deletion_time"], "destroyed": v["destroyed"], "version": v["version"]}


async def kv_data_read(request: web.Request) -> web.Response:
    """GET /v1/secret/data/:path[?version=] -- https://developer.hashicorp.com/vault/api-docs/secret/kv/kv-v2#read-secret-version"""
    st = _st(request)
    _token(request)
    entry = st.kv.get(request.match_info["path"])
    if entry is None:
        raise VaultError(404)
    version = int(request.query.get("version") or 0) or entry["current"]
    v = entry["versions"].get(str(version))
    if v is None:
        raise VaultError(404)
    if v["deletion_time"] or v["destroyed"]:
        # Deleted versions answer 404 with the metadata so clients can tell why.
        return _json(_envelope({"data": None, "metadata": _version_meta(v)}), status=404)
    return _json(_envelope({"data": v["data"], "metadata": _version_meta(v)}))


async def kv_data_write(request: web.Request) -> web.Response:
    """POST|PUT /v1/secret/data/:path {"data", "options": {"cas"}} -- https://developer.hashicorp.com/vault/api-docs/secret/kv/kv-v2#create-update-secret"""
    st = _st(request)
    _token(request)
    path = request.match_info["path"]
    try:
        body = json.loads(await request.read() or b"{}")
    except json.JSONDecodeError as exc:
        raise VaultError(400, f"failed to parse JSON input: {exc}") from exc
    if not isinstance(body.get("data"), dict):
        raise VaultError(400, "no data provided")
    entry = st.kv.get(path)
    current = entry["current"] if entry else 0
    cas = (body.get("options") or {}).get("cas")
    if cas is not None and int(cas) != current:
        raise VaultError(400, "check-and-set parameter did not match the current version")
    now = _rfc3339(st.clock.time())
    if entry is None:
        entry = st.kv[path] = {"versions": {}, "current": 0, "created_time": now, "updated_time": now}
    version = current + 1
    entry["versions"][str(version)] = {"data": body["data"], "created_time": now, "deletion_time": "",
                                       "destroyed": False, "version": version}
    entry["current"] = version
    entry["updated_time"] = now
    st.dirty = True
    return _json(_envelope(_version_meta(entry["versions"][str(version)])))


async def kv_data_delete(request: web.Request) -> web.Response:
    """DELETE /v1/secret/data/:path -- soft-deletes the latest version.
    https://developer.hashicorp.com/vault/api-docs/secret/kv/kv-v2#delete-latest-version-of-secret"""
    st = _st(request)
    _token(request)
    entry = st.kv.get(request.match_info["path"])
    if entry is not None:
        entry["versions"][str(entry["current"])]["deletion_time"] = _rfc3339(st.clock.time())
        st.dirty = True
    return web.Response(status=204)


def _list_keys(st: VaultState, prefix: str) -> list[str]:
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    keys = set()
    for path in st.kv:
        if path.startswith(prefix):
            rest = path[len(prefix):]
            keys.add(rest.split("/", 1)[0] + "/" if "/" in rest else rest)
    return sorted(keys)


async def kv_metadata_read(request: web.Request) -> web.Response:
    """GET /v1/secret/metadata/:path (or LIST / ?list=true) -- https://developer.hashicorp.com/vault/api-docs/secret/kv/kv-v2#read-secret-metadata"""
    st = _st(request)
    _token(request)
    path = request.match_info["path"]
    if request.method == "LIST" or request.query.get("list") in ("true", "1"):
        keys = _list_keys(st, path)
        if not keys:
            raise VaultError(404)
        return _json(_envelope({"keys": keys}))
    entry = st.kv.get(path)
    if entry is None:
        raise VaultError(404)
    versions = {k: {"created_time": v["created_time"], "deletion_time": v["deletion_time"],
                    "destroyed": v["destroyed"]} for k, v in entry["versions"].items()}
    return _json(_envelope({
        "cas_required": False, "created_time": entry["created_time"], "current_version": entry["current"],
        "custom_metadata": None, "delete_version_after": "0s", "max_versions": 0,
        "oldest_version": min(int(k) for k in entry["versions"]), "updated_time": entry["updated_time"],
        "versions": versions,
    }))


async def kv_metadata_delete(request: web.Request) -> web.Response:
    """DELETE /v1/secret/metadata/:path -- https://developer.hashicorp.com/vault/api-docs/secret/kv/kv-v2#delete-metadata-and-all-versions"""
    st = _st(request)
    _token(request)
    st.kv.pop(request.match_info["path"], None)
    st.dirty = True
    return web.Response(status=204)


# ---- lab fault injection (NOT part of the Vault API) ----------------------------------------------
async def lab_faults(request: web.Request) -> web.Response:
    """GET|POST|DELETE /_lab/faults {"fault": sealed|standby|clear} -- lab-only."""
    st = _st(request)
    if request.method == "DELETE":
        st.sealed = st.standby = False
    elif request.method == "POST":
        fault = (json.loads(await request.read() or b"{}")).get("fault")
        if fault == "sealed":
            st.sealed = True
        elif fault == "standby":
            st.standby = True
        elif fault == "clear":
            st.sealed = st.standby = False
        else:
            return _json({"errors": [f"unknown fault {fault!r}"]}, status=400)
    return _json({"sealed": st.sealed, "standby": st.standby})


async def housekeeping(st: VaultState, period: float = 1.0) -> None:
    try:
        while True:
            await asyncio.sleep(period)
            st.save()
    finally:
        st.save()


def make_app(st: VaultState, run_housekeeping: bool = True) -> web.Application:
    app = web.Application(middlewares=[vault_middleware])
    app[STATE] = st
    app[LABEL] = "vault"
    r = app.router
    r.add_route("GET", "/v1/sys/health", sys_health)
    r.add_route("HEAD", "/v1/sys/health", sys_health)
    r.add_get("/v1/sys/seal-status", sys_seal_status)
    r.add_put("/v1/sys/seal", sys_seal)
    r.add_post("/v1/sys/seal", sys_seal)
    r.add_put("/v1/sys/unseal", sys_unseal)
    r.add_post("/v1/sys/unseal", sys_unseal)
    r.add_get("/v1/auth/token/lookup-self", token_lookup_self)
    r.add_post("/v1/auth/approle/login", approle_login)
    r.add_put("/v1/auth/approle/login", approle_login)
    r.add_get(f"/v1/{KV_MOUNT}/data/{{path:.+}}", kv_data_read)
    r.add_post(f"/v1/{KV_MOUNT}/data/{{path:.+}}", kv_data_write)
    r.add_put(f"/v1/{KV_MOUNT}/data/{{path:.+}}", kv_data_write)
    r.add_delete(f"/v1/{KV_MOUNT}/data/{{path:.+}}", kv_data_delete)
    r.add_get(f"/v1/{KV_MOUNT}/metadata/{{path:.*}}", kv_metadata_read)
    r.add_route("LIST", f"/v1/{KV_MOUNT}/metadata/{{path:.*}}", kv_metadata_read)
    r.add_delete(f"/v1/{KV_MOUNT}/metadata/{{path:.+}}", kv_metadata_delete)
    r.add_route("*", "/_lab/faults", lab_faults)
    if run_housekeeping:

        async def _ctx(app: web.Application):
            task = asyncio.create_task(housekeeping(st))
            yield
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

        app.cleanup_ctx.append(_ctx)
    return app


def _parse_approle(text: str) -> AppRole:
    parts = text.split(":")
    if len(parts) not in (3, 4):
        raise argparse.ArgumentTypeError("--approle wants NAME:ROLE_ID:SECRET_ID[:policy+policy]")
    policies = parts[3].split("+") if len(parts) == 4 else ["default"]
    return AppRole(parts[0], parts[1], parts[2], policies)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.standins vault", description=__doc__)
    ap.add_argument("--listen", action="append", type=parse_listen, required=True, help="[NETNS:]HOST:PORT")
    tok = ap.add_mutually_exclusive_group(required=True)
    tok.add_argument("--root-token")
    tok.add_argument("--root-token-file", type=Path)
    ap.add_argument("--approle", action="append", type=_parse_approle, default=[],
                    help="NAME:ROLE_ID:SECRET_ID[:policy+policy] (repeat)")
    ap.add_argument("--state-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    root = args.root_token or args.root_token_file.read_text().strip()
    st = VaultState(root, args.approle, state_dir=args.state_dir)
    socks = [bind_socket(spec) for spec in args.listen]
    apps = [(make_app(st, run_housekeeping=(i == 0)), s) for i, s in enumerate(socks)]
    asyncio.run(serve_forever(apps))

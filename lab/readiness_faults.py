"""Faults that break the recovery path, not the platform: what `coldstart readiness` must turn red for.

Each is made with the system's own API or files (a snapshot archive rewritten, a KV version, Vault's seal, a
Prometheus job, a Nomad drain), remembered in the lab's fault file, and undone by `clear`.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import secrets
import shutil
import tarfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from lab.fault_record import forget, recorded, remember
from lab.hosts.shell import LabError
from lab.services import Secrets
from lab.settings import CACHE_HOSTS, LabConfig

__all__ = ["READINESS_FAULTS", "clear_readiness_faults"]

TSIG_PATH = "coldstart/dns-tsig"  # lab.lifecycle's KV_SECRETS["dns_tsig"]
CONSUL_SD_JOB = "services-from-consul"
DRAINED_NODE = CACHE_HOSTS[1]


# ---- the snapshot store ----------------------------------------------------------------------------
def _aside(cfg: LabConfig) -> Path:
    """Where the store's real snapshots wait while a faulty one stands in for them (not matched by *.snap)."""
    return cfg.path("snapshots") / ".faulted"


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, mode="r:gz") as tar:
        return {m.name: (tar.extractfile(m) or io.BytesIO()).read() for m in tar.getmembers() if m.isfile()}


def _write_archive(path: Path, members: dict[str, bytes]) -> None:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buffer.getvalue())


def _sums(members: dict[str, bytes]) -> bytes:
    return "".join(f"{hashlib.sha256(members[n]).hexdigest()}  {n}\n" for n in ("meta.json", "state.bin")).encode()


def _replace_snapshots(cfg: LabConfig, fault: str, make: Any) -> dict[str, Any]:
    """Move the store's snapshots aside and put one faulty archive, made from the newest, in their place."""
    store, aside = cfg.path("snapshots"), _aside(cfg)
    if fault in recorded(cfg):
        return {"already": fault}
    originals = sorted(store.glob("*.snap"))
    if not originals:
        raise LabError(f"no snapshot in {store} to make {fault} from (lab up takes one)")
    aside.mkdir(exist_ok=True)
    members = _members(originals[-1])
    for path in originals:
        path.rename(aside / path.name)
    faulty = store / f"{fault}.snap"
    _write_archive(faulty, make(members))
    remember(cfg, fault, faulty.name)
    return {"moved_aside": [p.name for p in originals], "in_their_place": faulty.name}


def _restore_snapshots(cfg: LabConfig) -> list[str]:
    store, aside = cfg.path("snapshots"), _aside(cfg)
    restored: list[str] = []
    for fault in ("snapshot-stale", "snapshot-corrupt"):
        name = recorded(cfg).get(fault)
        if name:
            (store / name).unlink(missing_ok=True)
            forget(cfg, fault)
    if aside.is_dir():
        for path in sorted(aside.glob("*.snap")):
            path.rename(store / path.name)
            restored.append(path.name)
        shutil.rmtree(aside, ignore_errors=True)
    return restored


def snapshot_stale(cfg: LabConfig, *, age_hours: float = 48.0, **_: Any) -> Any:
    """The backup job stopped two days ago: the store's newest snapshot is a valid one taken `age_hours` ago
    (its raft ID's timestamp moved back, SHA256SUMS recomputed), older than the lab's facts.rpo."""
    def stale(members: dict[str, bytes]) -> dict[str, bytes]:
        meta = json.loads(members["meta.json"])
        term_index, _, _ms = str(meta["ID"]).rpartition("-")
        meta["ID"] = f"{term_index}-{int((time.time() - age_hours * 3600) * 1000)}"
        out = {**members, "meta.json": json.dumps(meta).encode()}
        return {**out, "SHA256SUMS": _sums(out)}

    return _replace_snapshots(cfg, "snapshot-stale", stale)


def snapshot_corrupt(cfg: LabConfig, **_: Any) -> Any:
    """A snapshot damaged after it was written: state.bin's bytes no longer match its SHA256SUMS."""
    def corrupt(members: dict[str, bytes]) -> dict[str, bytes]:
        state = bytearray(members["state.bin"])
        state[len(state) // 2] ^= 0xFF
        return {**members, "state.bin": bytes(state)}

    return _replace_snapshots(cfg, "snapshot-corrupt", corrupt)


# ---- Vault -----------------------------------------------------------------------------------------
def _vault(cfg: LabConfig, method: str, path: str, body: dict | None = None) -> httpx.Response:
    headers = {"X-Vault-Token": Secrets(cfg).read("vault-root-token")}
    return httpx.request(method, f"{cfg.vault_url}/v1/{path}", json=body, headers=headers, timeout=10)


def tsig_wrong(cfg: LabConfig, **_: Any) -> Any:
    """The TSIG key in Vault no longer matches the DNS server's (a rotation done on one side only): a new KV
    version with a random secret. `clear` writes the previous version back; no secret is kept on disk."""
    if "tsig-wrong" in recorded(cfg):
        return {"already": "tsig-wrong"}
    reply = _vault(cfg, "GET", f"secret/data/{TSIG_PATH}")
    reply.raise_for_status()
    data, version = reply.json()["data"]["data"], reply.json()["data"]["metadata"]["version"]
    wrong = {**data, "secret": base64.b64encode(secrets.token_bytes(32)).decode()}
    _vault(cfg, "POST", f"secret/data/{TSIG_PATH}", {"data": wrong}).raise_for_status()
    remember(cfg, "tsig-wrong", version)
    return {"vault": f"secret/{TSIG_PATH}", "good_version": version}


def _tsig_restore(cfg: LabConfig) -> str | None:
    version = recorded(cfg).get("tsig-wrong")
    if version is None:
        return None
    reply = _vault(cfg, "GET", f"secret/data/{TSIG_PATH}?version={version}")
    reply.raise_for_status()
    _vault(cfg, "POST", f"secret/data/{TSIG_PATH}", {"data": reply.json()["data"]["data"]}).raise_for_status()
    forget(cfg, "tsig-wrong")
    return f"version {version} written back"


def vault_sealed(cfg: LabConfig, **_: Any) -> Any:
    """Vault sealed (as after a restart without auto-unseal): no AppRole login, no secret reads."""
    if not Secrets(cfg).file("vault-unseal-key").exists():
        raise LabError("the lab did not keep Vault's unseal key (bring the lab down and up again)")
    reply = _vault(cfg, "PUT", "sys/seal")
    if reply.status_code not in (200, 204):
        raise LabError(f"Vault refused to seal ({reply.status_code}): {reply.text.strip()}")
    remember(cfg, "vault-sealed", True)
    return {"vault": f"{cfg.vault_url} sealed"}


def _unseal(cfg: LabConfig) -> str | None:
    if not recorded(cfg).get("vault-sealed"):
        return None
    key = Secrets(cfg).read("vault-unseal-key")
    reply = httpx.put(f"{cfg.vault_url}/v1/sys/unseal", json={"key": key}, timeout=10)
    reply.raise_for_status()
    if reply.json().get("sealed"):
        raise LabError(f"Vault at {cfg.vault_url} is still sealed after its unseal key")
    deadline = time.monotonic() + 30
    while httpx.get(f"{cfg.vault_url}/v1/sys/health", timeout=2).status_code != 200:  # active, unsealed
        if time.monotonic() > deadline:
            raise LabError(f"Vault at {cfg.vault_url} unsealed but not active after 30s")
        time.sleep(0.1)
    forget(cfg, "vault-sealed")
    return "unsealed"


# ---- Prometheus ------------------------------------------------------------------------------------
def prometheus_consul_sd(cfg: LabConfig, **_: Any) -> Any:
    """Someone adds a scrape job that finds its targets through Consul's DNS interface: the gates' telemetry
    now depends on what the runbook recovers. The live config changes (written and reloaded), not only a
    rendered file. (Debian's Prometheus is built without consul_sd_configs; Consul DNS names are the same
    dependency.) A refused reload puts the previous file back."""
    conf = cfg.path("prometheus") / "prometheus.yml"
    before = conf.read_text()
    config = yaml.safe_load(before)
    jobs = config.setdefault("scrape_configs", [])
    if not any(job.get("job_name") == CONSUL_SD_JOB for job in jobs):
        jobs.append({"job_name": CONSUL_SD_JOB,
                     "dns_sd_configs": [{"names": ["game.service.consul"], "type": "A", "port": 8080}]})
        conf.write_text(yaml.safe_dump(config, sort_keys=False))
        from lab.telemetry_stack import reload_prometheus

        try:
            reload_prometheus(cfg)
        except LabError:
            conf.write_text(before)
            raise
    remember(cfg, "prometheus-consul-sd", True)
    return {"job": CONSUL_SD_JOB, "reloaded": cfg.prometheus_url}


def _prometheus_restore(cfg: LabConfig) -> str | None:
    if not recorded(cfg).get("prometheus-consul-sd"):
        return None
    from lab.telemetry_stack import deploy_in_place, lab_backends

    deploy_in_place(cfg, lab_backends(cfg))  # the lab's own rendering, as `lab telemetry` deploys it
    forget(cfg, "prometheus-consul-sd")
    return "re-rendered and reloaded"


# ---- Nomad -----------------------------------------------------------------------------------------
def _nomad(cfg: LabConfig, method: str, path: str, body: dict | None = None) -> httpx.Response:
    headers = {"X-Nomad-Token": Secrets(cfg).read("nomad-token")}
    reply = httpx.request(method, f"{cfg.nomad_url}/v1/{path}", json=body, headers=headers, timeout=10)
    if reply.status_code >= 400:
        raise LabError(f"Nomad {method} /v1/{path}: {reply.status_code} {reply.text.strip()[:200]}")
    return reply


def _node_id(cfg: LabConfig, name: str) -> str:
    for node in _nomad(cfg, "GET", "nodes").json():
        if node.get("Name") == name:
            return node["ID"]
    raise LabError(f"Nomad has no node {name}")


def _a_cache_node(cfg: LabConfig) -> str:
    """A cache host the cache job runs on now (the second, when it runs on all)."""
    running = {a.get("NodeName") for a in _nomad(cfg, "GET", "job/cache/allocations").json()
               if a.get("ClientStatus") == "running"}
    for host in (DRAINED_NODE, *CACHE_HOSTS):
        if host in running:
            return host
    raise LabError("the cache job runs on no cache host: nothing a drain would take from it")


def nomad_node_drained(cfg: LabConfig, *, target: str | None = None, **_: Any) -> Any:
    """A cache node left draining (system jobs ignored, so its cache keeps serving): a redeploy from scratch
    could not put the cache back on it."""
    node = target or _a_cache_node(cfg)
    spec = {"DrainSpec": {"Deadline": 3600 * 10**9, "IgnoreSystemJobs": True},
            "Meta": {"message": "coldstart lab fault nomad-node-drained"}}
    _nomad(cfg, "POST", f"node/{_node_id(cfg, node)}/drain", spec)
    remember(cfg, "nomad-node-drained", node)
    return {"draining": node}


def _undrain(cfg: LabConfig) -> str | None:
    node = recorded(cfg).get("nomad-node-drained")
    if not node:
        return None
    _nomad(cfg, "POST", f"node/{_node_id(cfg, node)}/drain", {"DrainSpec": None, "MarkEligible": True})
    forget(cfg, "nomad-node-drained")
    return f"{node} eligible"


READINESS_FAULTS = {
    "snapshot-stale": snapshot_stale,
    "snapshot-corrupt": snapshot_corrupt,
    "tsig-wrong": tsig_wrong,
    "vault-sealed": vault_sealed,
    "prometheus-consul-sd": prometheus_consul_sd,
    "nomad-node-drained": nomad_node_drained,
}


def clear_readiness_faults(cfg: LabConfig) -> dict[str, Any]:
    """Undo every fault above that is in place (Vault unsealed before the TSIG key is written back)."""
    done = {"snapshots": _restore_snapshots(cfg), "vault": _unseal(cfg), "tsig": _tsig_restore(cfg),
            "prometheus": _prometheus_restore(cfg), "nomad": _undrain(cfg)}
    return {k: v for k, v in done.items() if v}

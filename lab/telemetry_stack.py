"""The lab's Prometheus config and rules: rendered in place by `lab up`, or deployed by `pulumi up` of infra/."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import httpx

from infra.engine import PulumiEngine, PulumiError, find_engine
from infra.telemetry import ScrapeTargets, write_prometheus_files
from infra.telemetry.rules import HOSTS_GROUP
from lab.agents import NOMAD_CLIENTS
from lab.hashistack import Backends, backends
from lab.hosts import LabSpec, setup_ssh
from lab.hosts.shell import LabError
from lab.hosts.sshd import SshPaths, start_sshd
from lab.services import Secrets
from lab.settings import CACHE_HOSTS, CONSUL_HOSTS, LabConfig

__all__ = [
    "TELEMETRY_HOST", "deploy_in_place", "deploy_with_pulumi", "lab_backends", "lab_stack_config", "prometheus_options", "render_in_place",
    "telemetry_ssh_spec",
]

TELEMETRY_HOST = "prom"
STACK = "lab"
# The jobs a drain reads: the node agents (the notice, the host's containers), the cgroup exporter, the router.
_DRAIN_SIGNAL_JOBS = ("cache", "containers", "sessions")


def prometheus_options(cfg: LabConfig, sec: Secrets, found: Backends) -> tuple[ScrapeTargets, dict[str, Any]]:
    """The lab's targets and rendering options: one answer for `lab up` and for the Pulumi stack."""
    p = cfg.ports
    targets = ScrapeTargets(
        consul=[f"{cfg.ip(h)}:{p.consul_http}" for h in CONSUL_HOSTS],
        # Real Nomad clients publish their allocation metrics themselves (the stand-in's server does).
        nomad=[f"{cfg.ip('nomad')}:{p.nomad_http}",
               *([f"{cfg.ip(h)}:{p.nomad_http}" for h, _, _ in NOMAD_CLIENTS] if found.nomad else [])],
        vault=[f"{cfg.ip('vault')}:{p.vault_http}"],
        dns=[f"{cfg.ip('dns')}:{p.pdns_web}"],
        cache=[f"{cfg.ip(h)}:{p.node_agent}" for h in CACHE_HOSTS],
        game_edge=[f"{cfg.ip('edge')}:{p.edge_http}"],
        players=[f"{cfg.ip('players')}:{p.players_metrics}"],
        internal_load=[f"{cfg.ip('internal')}:{p.internal_metrics}"],
        coldstart_worker=[cfg.worker_metrics] if cfg.worker_metrics else [],
        containers=[f"{cfg.ip(TELEMETRY_HOST)}:{p.cgroup_exporter}"] if found.consul else [],
        sessions=[f"{cfg.ip('edge')}:{p.session_router}"],
        telemetry=[f"{cfg.ip(TELEMETRY_HOST)}:{p.prometheus}"],
    )
    # infra renders a fixed 10 s global scrape_timeout, so the global interval can't go below it;
    # the lab scrapes faster per job and records the gates' series every 5 s (drills are short).
    fast = {"scrape_interval": cfg.scrape_interval, "scrape_timeout": cfg.scrape_interval}
    overrides: dict[str, dict] = {job: dict(fast) for job in targets.jobs()}
    overrides["consul"]["authorization"] = {"type": "Bearer", "credentials_file": str(sec.file("consul-token"))}
    overrides["vault"]["authorization"] = {"type": "Bearer", "credentials_file": str(sec.file("vault-root-token"))}
    drain = cfg.drain_signals_interval
    for job in _DRAIN_SIGNAL_JOBS if drain else ():
        if job in overrides:
            overrides[job].update(scrape_interval=drain, scrape_timeout=drain)
    options: dict[str, Any] = {
        "scrape_interval": "10s", "external_labels": {"lab": cfg.prefix}, "job_overrides": overrides,
        "recording_interval": "5s", "alertmanagers": [f"{cfg.ip(TELEMETRY_HOST)}:{p.alertmanager}"],
        # A preemption leaves 30 s: its alert is evaluated every second (or drain_signals_interval), not every 10.
        "group_intervals": {HOSTS_GROUP: drain or "1s"},
    }
    return targets, options


def render_in_place(cfg: LabConfig, sec: Secrets, found: Backends) -> Path:
    """`lab up`'s path: write the files where the lab's Prometheus reads them; returns prometheus.yml."""
    targets, options = prometheus_options(cfg, sec, found)
    return write_prometheus_files(cfg.path("prometheus"), targets, **options)["config"]


def deploy_in_place(cfg: LabConfig, found: Backends) -> dict[str, Any]:
    """`lab telemetry`: re-render the files in place and ask Prometheus to reload them."""
    conf = render_in_place(cfg, Secrets(cfg), found)
    reload_prometheus(cfg)
    return {"config": str(conf), "reloaded": cfg.prometheus_url}


def reload_prometheus(cfg: LabConfig) -> None:
    """Ask the lab's Prometheus to reload its files; LabError saying why when it does not."""
    try:
        r = httpx.post(f"{cfg.prometheus_url}/-/reload", timeout=10)
    except httpx.HTTPError as exc:
        raise LabError(f"Prometheus at {cfg.prometheus_url} did not answer the reload: {exc}") from None
    if r.status_code != 200:
        raise LabError(f"Prometheus refused the reload ({r.status_code}): {r.text.strip()}")


def lab_backends(cfg: LabConfig) -> Backends:
    """What the running lab was built on (its inventory), else what PATH holds now."""
    from lab.lifecycle import recorded_backends

    recorded = recorded_backends(cfg)
    if not recorded:
        return backends()
    # "real (/path)" or "stand-in", as Backends.describe() wrote them.
    paths = {name: Path(how[len("real ("):-1]) if how.startswith("real (") else None for name, how in recorded.items()}
    return Backends(consul=paths.get("consul"), nomad=paths.get("nomad"), vault=paths.get("vault"))


def telemetry_ssh_spec(cfg: LabConfig) -> LabSpec:
    # The telemetry host takes SSH only for this deploy; the inventory keeps reaching it as before.
    spec = cfg.spec
    hosts = [*spec.ssh_hosts, *([TELEMETRY_HOST] if TELEMETRY_HOST not in spec.ssh_hosts else [])]
    return spec.model_copy(update={"ssh_hosts": hosts})


def lab_stack_config(cfg: LabConfig, sec: Secrets, found: Backends, *, host_key: str,
                     client_key: Path) -> dict[str, Any]:
    """The Pulumi stack configuration (keys of infra/README.md) deploying the lab's files to its telemetry host."""
    targets, options = prometheus_options(cfg, sec, found)
    return {
        "prometheusHosts": [{
            "name": TELEMETRY_HOST,
            "address": cfg.ip(TELEMETRY_HOST),
            "configDir": str(cfg.path("prometheus").resolve()),
            "reloadUrl": f"{cfg.prometheus_url}/-/reload",
            "hostKey": host_key,
        }],
        "sshPrivateKeyPath": str(client_key.resolve()),
        "targets": dataclasses.asdict(targets),
        "scrapeOverrides": options["job_overrides"],
        "externalLabels": options["external_labels"],
        "scrapeInterval": options["scrape_interval"],
        "recordingInterval": options["recording_interval"],
        "groupIntervals": options["group_intervals"],
        "alertmanagers": options["alertmanagers"],
    }


def deploy_with_pulumi(cfg: LabConfig, found: Backends, *, engine_dir: Path | None = None) -> dict[str, Any]:
    """`lab telemetry --pulumi`: sshd on the telemetry host, then a real `pulumi up` of infra/ to it."""
    bin_dir = engine_dir or find_engine()
    if bin_dir is None:
        raise LabError("no Pulumi engine: put `pulumi` on PATH or provide ../shared/pulumi (scripts/pulumi-install.sh)")
    spec = telemetry_ssh_spec(cfg)
    paths = setup_ssh(spec)
    start_sshd(spec, TELEMETRY_HOST)
    host_key = " ".join(paths.host_key(TELEMETRY_HOST).with_suffix(".pub").read_text().split()[:2])
    sec = Secrets(cfg)
    engine = PulumiEngine(bin_dir=bin_dir, root=cfg.path("pulumi").resolve(), stack=STACK)
    config = lab_stack_config(cfg, sec, found, host_key=host_key, client_key=SshPaths(spec).client_key)
    t0 = time.monotonic()
    try:
        engine.prepare(config)
        engine.up()
    except PulumiError as exc:
        raise LabError(str(exc)) from None
    return {"seconds": round(time.monotonic() - t0, 2), "stack": STACK, "state": str(engine.root / "state"),
            "files": sorted(str(cfg.path("prometheus", rel)) for rel in ("prometheus.yml", "rules"))}

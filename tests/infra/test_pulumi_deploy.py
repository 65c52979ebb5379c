"""A real Pulumi engine deploys the lab's Prometheus files over SSH to a namespace host running Prometheus."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from infra.engine import PulumiEngine, PulumiError, find_engine, missing_engine_reason
from lab.hashistack import Backends
from lab.hosts import create, destroy, start_daemon, wait_for_port
from lab.services import Secrets
from lab.settings import LabConfig
from lab.telemetry_stack import TELEMETRY_HOST, deploy_with_pulumi, render_in_place, telemetry_ssh_spec
from tests.hosts.labkit import require_lab

pytestmark = pytest.mark.lab

NO_BACKENDS = Backends(consul=None, nomad=None, vault=None)


@dataclass
class Deployed:
    cfg: LabConfig
    engine: PulumiEngine
    config: dict

    @property
    def prom(self) -> str:
        return self.cfg.prometheus_url


def _require_engine() -> Path:
    reason = missing_engine_reason()
    if reason:
        pytest.skip(f"no Pulumi engine: {reason}")
    found = find_engine()
    assert found is not None
    return found


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    require_lab()
    bin_dir = _require_engine()
    state = tmp_path_factory.mktemp("pulumi-lab") / "state"
    cfg = LabConfig(state_dir=state, inventory_path=state.parent / "lab.yaml", prefix="csp", bridge="cspbr0",
                    veth_prefix="cspv", subnet="10.221.0.0/24")
    # Only the telemetry host's namespace: the deploy needs its sshd and its Prometheus, nothing else.
    spec = telemetry_ssh_spec(cfg).model_copy(update={"hosts": {TELEMETRY_HOST: cfg.spec.hosts[TELEMETRY_HOST]}})
    destroy(spec)
    try:
        create(spec)
        Secrets(cfg).ensure()
        # As `lab up` starts it: files rendered in place, the lifecycle endpoint on.
        conf = render_in_place(cfg, Secrets(cfg), NO_BACKENDS)
        prom = start_daemon(spec, TELEMETRY_HOST, "prometheus", [
            "/usr/bin/prometheus", f"--config.file={conf}", f"--storage.tsdb.path={cfg.path('prometheus', 'data')}",
            f"--web.listen-address={cfg.ip(TELEMETRY_HOST)}:{cfg.ports.prometheus}", "--web.enable-lifecycle"])
        wait_for_port(cfg.ip(TELEMETRY_HOST), cfg.ports.prometheus, timeout=30, pid=prom.pid)
        deploy_with_pulumi(cfg, NO_BACKENDS, engine_dir=bin_dir)
        engine = PulumiEngine(bin_dir=bin_dir, root=cfg.path("pulumi"), stack="lab")
        yield Deployed(cfg, engine, engine.read_config())
    finally:
        destroy(spec)


def _config_text(url: str) -> str:
    return httpx.get(f"{url}/api/v1/status/config", timeout=5).json()["data"]["yaml"]


def _files(cfg: LabConfig) -> dict[str, str]:
    root = cfg.path("prometheus")
    return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file() and "data" not in p.parts}


def test_preview_up_change_broken_rule_destroy(deployed: Deployed) -> None:
    cfg, engine = deployed.cfg, deployed.engine
    assert engine.preview() == {}, "a fresh `up` leaves nothing to change"
    before = _files(cfg)
    assert set(before) == {"prometheus.yml", "rules/coldstart.rules.yml"}

    # A new scrape target: exactly one file resource changes, and the reload after it.
    changed = copy.deepcopy(deployed.config)
    changed["targets"]["players"].append("10.221.0.250:9105")
    engine.write_config(changed)
    plan = engine.preview()
    files = [urn for urn in plan if "-file-" in urn]
    assert len(files) == 1 and files[0].endswith("prometheus.yml"), plan
    assert set(plan) == {*files, *[u for u in plan if u.endswith("::prom-reload")]}, plan
    engine.up()
    assert "10.221.0.250:9105" in _config_text(deployed.prom), "Prometheus reloaded the deployed config"
    serving = _config_text(deployed.prom)
    rules_before = (cfg.path("prometheus", "rules", "coldstart.rules.yml")).read_text()

    # A broken rule (an evaluation interval promtool rejects) fails the deploy; the old files keep serving.
    broken = copy.deepcopy(changed)
    broken["groupIntervals"] = {**broken["groupIntervals"], "coldstart-hosts": "1x"}
    engine.write_config(broken)
    with pytest.raises(PulumiError, match="promtool|rules"):
        engine.up()
    assert cfg.path("prometheus", "rules", "coldstart.rules.yml").read_text() == rules_before
    assert _config_text(deployed.prom) == serving
    assert httpx.get(f"{deployed.prom}/-/ready", timeout=5).status_code == 200
    groups = httpx.get(f"{deployed.prom}/api/v1/rules", timeout=5).json()["data"]["groups"]
    assert any(g["name"] == "coldstart-hosts" for g in groups)
    assert not list(cfg.path("prometheus").rglob(".coldstart.*")), "no temp file left behind"

    # Destroy removes what the stack deployed and nothing else (Prometheus' data stays).
    engine.write_config(changed)
    engine.destroy()
    assert _files(cfg) == {}
    assert not cfg.path("prometheus", "rules").exists()
    assert cfg.path("prometheus", "data").is_dir()

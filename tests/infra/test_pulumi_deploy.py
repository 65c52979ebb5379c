"""A real Pulumi engine deploys the lab's Prometheus files over SSH to a namespace host running Prometheus."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from infra.engine import PulumiError, find_engine, missing_engine_reason
from lab.cli import lab_app
from tests.hosts.labkit import require_lab
from tests.infra.pulumi_lab import PulumiLab, deployed_files, pulumi_lab
from tests.real import unavailable

pytestmark = pytest.mark.lab


def _require_engine() -> Path:
    reason = missing_engine_reason()
    if reason:
        unavailable(f"no Pulumi engine: {reason}")
    found = find_engine()
    assert found is not None
    return found


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulumiLab]:
    require_lab()
    with pulumi_lab(tmp_path_factory.mktemp("pulumi-lab") / "state", _require_engine()) as lab:
        yield lab


def _config_text(url: str) -> str:
    return httpx.get(f"{url}/api/v1/status/config", timeout=5).json()["data"]["yaml"]


def test_preview_up_change_broken_rule_destroy(deployed: PulumiLab) -> None:
    cfg, engine = deployed.cfg, deployed.engine
    assert engine.preview() == {}, "a fresh `up` leaves nothing to change"
    # What `lab up` rendered, byte for byte: the gates read what Pulumi deployed.
    assert deployed_files(cfg) == deployed.lab_up_files
    assert set(deployed.lab_up_files) == {"prometheus.yml", "rules/coldstart.rules.yml"}

    # A new scrape target: exactly one file resource changes, and the reload after it.
    changed = copy.deepcopy(deployed.config)
    changed["targets"]["players"].append("10.221.0.250:9105")
    engine.write_config(changed)
    plan = engine.preview()
    files = [urn for urn in plan if "-file-" in urn]
    assert len(files) == 1 and files[0].endswith("prometheus.yml"), plan
    assert set(plan) == {*files, *[u for u in plan if u.endswith("::prom-reload")]}, plan
    engine.up()
    assert "10.221.0.250:9105" in cfg.path("prometheus", "prometheus.yml").read_text()
    assert "10.221.0.250:9105" in _config_text(deployed.prometheus_url), "Prometheus reloaded the deployed config"
    assert engine.preview() == {}
    serving, after_change = _config_text(deployed.prometheus_url), deployed_files(cfg)

    # A broken rule (an evaluation interval promtool rejects) fails the deploy; the old files keep serving.
    broken = copy.deepcopy(changed)
    broken["groupIntervals"] = {**broken["groupIntervals"], "coldstart-hosts": "1x"}
    engine.write_config(broken)
    with pytest.raises(PulumiError, match=r"prom-file-rules-coldstart\.rules\.yml") as failed:
        engine.up()
    assert 'not a valid duration string: "1x"' in str(failed.value), str(failed.value)
    assert deployed_files(cfg) == after_change
    assert _config_text(deployed.prometheus_url) == serving
    assert httpx.get(f"{deployed.prometheus_url}/-/ready", timeout=5).status_code == 200
    groups = httpx.get(f"{deployed.prometheus_url}/api/v1/rules", timeout=5).json()["data"]["groups"]
    assert any(g["name"] == "coldstart-hosts" for g in groups)
    assert not list(cfg.path("prometheus").rglob(".coldstart.*")), "no temp file left behind"

    # The failed deploy left the stack's state at what is on the host.
    engine.write_config(changed)
    assert engine.preview() == {}

    # Destroy removes what the stack deployed and nothing else (Prometheus' data stays).
    engine.destroy()
    assert deployed_files(cfg) == {}
    assert not cfg.path("prometheus", "rules").exists()
    assert cfg.path("prometheus", "data").is_dir()

    # `coldstart lab telemetry` without --pulumi puts `lab up`'s files back and reloads.
    out = CliRunner().invoke(lab_app, ["telemetry", "--state-dir", str(cfg.state_dir)])
    assert out.exit_code == 0, out.output
    assert set(deployed_files(cfg)) == {"prometheus.yml", "rules/coldstart.rules.yml"}
    assert "10.221.0.250:9105" not in _config_text(deployed.prometheus_url)

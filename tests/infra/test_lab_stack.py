"""The lab's stack under mocks: the files Pulumi would deploy are byte for byte the ones `lab up` writes."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from lab.hashistack import Backends
from lab.services import Secrets
from lab.settings import LabConfig
from lab.telemetry_stack import lab_stack_config, render_in_place
from tests.infra.pulumi_harness import build_graph

CMD = "command:remote:Command"
NO_BACKENDS = Backends(consul=None, nomad=None, vault=None)


@pytest.fixture
def lab(tmp_path: Path) -> tuple[LabConfig, dict]:
    cfg = LabConfig(state_dir=tmp_path / "state", inventory_path=tmp_path / "lab.yaml",
                    subnet=ipaddress.IPv4Network("10.222.0.0/24"))
    key = tmp_path / "client_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nmock\n-----END OPENSSH PRIVATE KEY-----\n")
    config = lab_stack_config(cfg, Secrets(cfg), NO_BACKENDS, host_key="ssh-ed25519 AAAAmock", client_key=key)
    return cfg, config


def test_deployed_files_equal_what_lab_up_writes(lab):
    cfg, config = lab
    # The engine hands config objects to the program with their keys sorted (Go's JSON).
    mocks, result = build_graph(json.loads(json.dumps(config, sort_keys=True)), secrets={})
    assert result["hosts"] == {} and list(result["prometheus"]) == ["prom"]
    cmds = {r.name: r.inputs for r in mocks.of_type(CMD)}
    render_in_place(cfg, Secrets(cfg), NO_BACKENDS)
    for rel, name in (("prometheus.yml", "prom-file-prometheus.yml"),
                      ("rules/coldstart.rules.yml", "prom-file-rules-coldstart.rules.yml")):
        assert cmds[name]["stdin"] == cfg.path("prometheus", rel).read_text()
        create = cmds[name]["create"]
        # Checked on the temp file, before the rename over the file Prometheus serves.
        assert create.index("promtool check") < create.index("mv -f")
        assert f"rm -f {cfg.path('prometheus', rel)}" in cmds[name]["delete"]
    assert cmds["prom-reload"]["create"].endswith(f"-X POST {cfg.prometheus_url}/-/reload >&2")
    assert len(cmds["prom-reload"]["triggers"]) == 2
    assert set(cmds) == {"prom-file-prometheus.yml", "prom-file-rules-coldstart.rules.yml", "prom-reload"}


def test_a_stack_needs_a_host(lab):
    _, config = lab
    with pytest.raises(ValueError, match="must list at least one host"):
        build_graph({**config, "prometheusHosts": []}, secrets={})


def test_telemetry_hosts_need_the_paging_webhook(lab):
    _, config = lab
    hosts = [{"name": "telemetry-a", "address": "10.20.0.11"}]
    with pytest.raises(ValueError, match="pagingWebhookUrl"):
        build_graph({**config, "telemetryHosts": hosts}, secrets={})


def test_a_drain_lab_reads_the_preempted_hosts_signals_faster_and_nothing_else(tmp_path):
    """drain_signals_interval: the node agents' and the router's jobs scraped, and the host alerts evaluated,
    that often (the alert and the drain's fresh samples wait on them); every other job as before."""
    import shutil
    import subprocess

    import yaml

    cfg = LabConfig(state_dir=tmp_path / "state", inventory_path=tmp_path / "lab.yaml", scrape_interval="1s",
                    drain_signals_interval="250ms", subnet=ipaddress.IPv4Network("10.222.0.0/24"))
    config_file = render_in_place(cfg, Secrets(cfg), NO_BACKENDS)
    jobs = {job["job_name"]: job for job in yaml.safe_load(config_file.read_text())["scrape_configs"]}
    for name, job in jobs.items():
        if name in ("cache", "sessions"):
            assert (job["scrape_interval"], job["scrape_timeout"]) == ("250ms", "250ms"), name
        elif "scrape_interval" in job and name != "telemetry":
            assert job["scrape_interval"] == "1s", (name, job["scrape_interval"])
    groups = yaml.safe_load(cfg.path("prometheus", "rules/coldstart.rules.yml").read_text())["groups"]
    assert {g["name"]: g.get("interval") for g in groups}["coldstart-hosts"] == "250ms"
    if shutil.which("promtool"):  # what the Pulumi deploy checks before it swaps the file in
        checked = subprocess.run(["promtool", "check", "config", "--syntax-only", str(config_file)],
                                 check=False, capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr

"""The plain-Python renderers: static targets, contract metric names, and promtool-valid output."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from infra.telemetry import AlertThresholds, ScrapeTargets, render_rules, render_scrape_config, write_prometheus_files
from infra.telemetry.alertmanager_config import render_alertmanager_config
from infra.telemetry.blackbox_config import render_blackbox_config
from infra.telemetry.dashboard import dashboard_queries, recovery_dashboard
from infra.telemetry.rules import alert_rules, recording_rules
from infra.telemetry.targets import ForbiddenTargetError
from tests.infra.promtool import run_promtool

INFRA = Path(__file__).resolve().parents[2] / "infra"

LAB_TARGETS = ScrapeTargets(
    consul=["10.200.0.1:8500", "10.200.0.2:8500", "10.200.0.3:8500"],
    nomad=["10.200.1.1:4646"],
    vault=["10.200.2.1:8200"],
    dns=["10.200.3.1:9153"],
    cache=["10.200.4.1:9121"],
    game_edge=["10.200.5.1:9102"],
    players=["10.200.6.1:9105"],
    internal_load=["10.200.6.2:9106"],
    coldstart_worker=["127.0.0.1:9464"],
    blackbox_http=["http://10.200.5.1:8080/health"],
    blackbox_tcp=["10.200.3.1:53"],
)


def _jobs(config: dict) -> dict[str, dict]:
    return {c["job_name"]: c for c in config["scrape_configs"]}


def test_hashicorp_jobs_use_prometheus_format_paths():
    jobs = _jobs(render_scrape_config(LAB_TARGETS))
    assert jobs["consul"]["metrics_path"] == "/v1/agent/metrics"
    assert jobs["nomad"]["metrics_path"] == "/v1/metrics"
    assert jobs["vault"]["metrics_path"] == "/v1/sys/metrics"
    for job in ("consul", "nomad", "vault"):
        assert jobs[job]["params"] == {"format": ["prometheus"]}
    assert jobs["consul"]["static_configs"] == [{"targets": sorted(LAB_TARGETS.consul)}]


def test_only_static_discovery_and_every_job_present():
    config = render_scrape_config(LAB_TARGETS, alertmanagers=["127.0.0.1:9093"])
    text = yaml.safe_dump(config)
    assert re.search(r"_sd_configs", text) is None
    assert set(_jobs(config)) == {
        "consul", "nomad", "vault", "dns", "cache", "game_edge", "players", "internal_load",
        "coldstart_worker", "blackbox_http", "blackbox_tcp",
    }
    for job in config["scrape_configs"]:
        assert set(job) <= {"job_name", "metrics_path", "params", "static_configs", "relabel_configs"}
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9093"]


def test_blackbox_probe_relabels_target_to_exporter():
    bb = _jobs(render_scrape_config(LAB_TARGETS))["blackbox_http"]
    assert bb["params"] == {"module": ["http_2xx"]}
    assert bb["relabel_configs"][-1] == {"target_label": "__address__", "replacement": "127.0.0.1:9115"}
    assert set(render_blackbox_config()["modules"]) == {"http_2xx", "tcp_connect"}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"consul": ["consul.service.consul:8500"]},
        {"nomad": ["nomad.service.dc1.consul:4646"]},
        {"blackbox_http": ["http://www.service.consul/health"]},
    ],
)
def test_consul_dns_names_are_refused(kwargs):
    with pytest.raises(ForbiddenTargetError):
        ScrapeTargets(**kwargs)


def test_targets_must_be_host_port_and_from_mapping_accepts_camel_case():
    with pytest.raises(ValueError):
        ScrapeTargets(consul=["10.0.0.1"])
    with pytest.raises(TypeError):
        ScrapeTargets(consul="10.0.0.1:8500")  # a string would be iterated char by char
    t = ScrapeTargets.from_mapping({"gameEdge": ["10.0.0.5:9102"], "coldstart_worker": ["10.0.0.9:9464"]})
    assert t.game_edge == ["10.0.0.5:9102"] and t.coldstart_worker == ["10.0.0.9:9464"]
    with pytest.raises(ValueError, match="unknown scrape target job"):
        ScrapeTargets.from_mapping({"consul_servers": []})


def test_overrides_cannot_add_service_discovery():
    with pytest.raises(ValueError, match="not allowed"):
        render_scrape_config(LAB_TARGETS, job_overrides={"consul": {"consul_sd_configs": [{"server": "x:8500"}]}})


def test_recording_rules_match_the_metrics_contract():
    contract = (INFRA / "METRICS.md").read_text()
    for rule in recording_rules():
        assert f"`{rule.record}`" in contract, f"{rule.record} missing from infra/METRICS.md"
    raw = set(re.findall(r"^\| `([a-z_A-Z]+)`", contract, re.MULTILINE))
    used = set()
    for rule in recording_rules():
        used |= set(re.findall(r"\b(consul_\w+|nomad_\w+|game_\w+|coldstart_\w+|container_\w+)\b", rule.expr))
    used = {re.sub(r"_(bucket|count|sum)$", "", m) for m in used}
    assert used <= raw, f"recording rules use series not in the contract: {sorted(used - raw)}"


def test_postmortem_alerts_exist_with_severity_for_and_runbook():
    rules = {r["alert"]: r for g in render_rules()["groups"] for r in g["rules"] if "alert" in r}
    for name in ("ConsulKVApplySlow", "ConsulLeaderLastContactHigh", "ConsulBoltDBFreelistGrowing",
                 "ConsulRaftCommitSlow", "ConsulAutopilotUnhealthy", "NomadEligibleNodeFailingAllocations",
                 "CacheHitRatioLow", "DatabaseQueryRateHigh", "PlayersAdmittedOffTarget"):
        assert name in rules
    assert rules["ConsulKVApplySlow"]["expr"] == "coldstart:consul_kvs_apply_p50_ms > 300"
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in {"critical", "warning", "none"}
        assert rule["annotations"]["runbook_url"].endswith("#" + name.lower())
        if name not in ("Watchdog", "ColdstartStepFailed", "HostPreemptionNotice"):
            assert "for" in rule, f"{name} would page on a single bad scrape"


def test_readme_documents_every_alert():
    readme = (INFRA / "README.md").read_text()
    headings = {h.strip().lower() for h in re.findall(r"^#### (\S+)", readme, re.MULTILINE)}
    for alert in alert_rules():
        assert alert.name.lower() in headings, f"infra/README.md has no '#### {alert.name}' section"
    assert "prometheusreplicaunreachable" in headings


def test_thresholds_are_tunable():
    rules = render_rules(AlertThresholds(kv_apply_p50_ms=150))
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    assert "coldstart:consul_kvs_apply_p50_ms > 150" in exprs


def test_alertmanager_pages_via_webhook_and_keeps_watchdog_off_the_pager():
    cfg = render_alertmanager_config("https://pager.example.net/hook")
    receivers = {r["name"]: r for r in cfg["receivers"]}
    assert receivers["page"]["webhook_configs"][0]["url"] == "https://pager.example.net/hook"
    assert cfg["route"]["receiver"] == "page"
    watchdog = next(r for r in cfg["route"]["routes"] if r["matchers"] == ['alertname="Watchdog"'])
    assert watchdog["receiver"] == "null"
    with_heartbeat = render_alertmanager_config("https://p/h", "https://hb.example.net/ping")
    assert next(r for r in with_heartbeat["route"]["routes"] if "Watchdog" in r["matchers"][0])["receiver"] == "heartbeat"


def test_alertmanager_sends_the_preemption_notice_to_the_trigger_and_still_pages():
    import pytest

    assert "coldstart-trigger" not in {r["name"] for r in render_alertmanager_config("https://p/h")["receivers"]}
    cfg = render_alertmanager_config("https://p/h", trigger_webhook_url="http://10.0.0.5:9095/alerts",
                                     trigger_token_file="/etc/prometheus/secrets/coldstart-trigger.token")
    first = cfg["route"]["routes"][0]
    assert first["matchers"] == ['alertname="HostPreemptionNotice"'] and first["continue"] is True
    assert first["group_wait"] == "0s"
    hook = next(r for r in cfg["receivers"] if r["name"] == first["receiver"])["webhook_configs"][0]
    assert hook["http_config"]["authorization"]["credentials_file"].endswith("coldstart-trigger.token")
    with pytest.raises(ValueError, match="token"):
        render_alertmanager_config("https://p/h", trigger_webhook_url="http://10.0.0.5:9095/alerts")
    hosts = next(g for g in render_rules()["groups"] if g["name"] == "coldstart-hosts")
    assert hosts["interval"] == "5s"


def test_dashboard_covers_the_recovery_signals():
    dash = recovery_dashboard("coldstart-telemetry-a")
    titles = {p["title"] for p in dash["panels"]}
    for wanted in ("Consul KV apply p50", "Consul leader last contact", "Raft commit time p50", "BoltDB freelist size",
                   "Nomad allocation health", "Cache hit ratio", "Database load", "Admitted players vs target",
                   "Runbook steps", "Gate results (1 = pass)"):
        assert wanted in titles
    recorded = {r.record for r in recording_rules()}
    for expr in dashboard_queries(dash):
        for name in re.findall(r"coldstart:[a-z0-9_]+", expr):
            assert name in recorded, f"dashboard queries unknown recording rule {name}"


def test_written_files_pass_promtool_check(tmp_path):
    paths = write_prometheus_files(tmp_path, LAB_TARGETS, alertmanagers=["127.0.0.1:9093"],
                                   external_labels={"env": "lab"})
    assert paths["config"] == tmp_path / "prometheus.yml"
    assert paths["rules"] == tmp_path / "rules" / "coldstart.rules.yml"
    check = run_promtool("check", "config", paths["config"])
    assert check.returncode == 0, check.stdout + check.stderr
    assert "1 rule files found" in check.stdout
    rules = run_promtool("check", "rules", paths["rules"])
    assert rules.returncode == 0, rules.stdout + rules.stderr


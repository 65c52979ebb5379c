"""The Pulumi program under mocks: hosts, files (with sha256 triggers), dashboards, secrets."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
import yaml

from tests.infra.pulumi_harness import SAMPLE_SECRETS, build_graph, sample_config

SECRET_SIG = "4dabf18193072939515e22adb298388d"
CMD = "command:remote:Command"


def plain(value):
    """Strip Pulumi's secret wrapper from a mock input."""
    if isinstance(value, dict) and SECRET_SIG in value:
        return plain(value["value"])
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def is_secret(value) -> bool:
    return isinstance(value, dict) and SECRET_SIG in value


@pytest.fixture(scope="module")
def graph():
    return build_graph()


def _commands(mocks) -> dict[str, dict]:
    return {r.name: r.inputs for r in mocks.of_type(CMD)}


def test_two_hosts_each_with_packages_files_and_reloads(graph):
    mocks, result = graph
    assert sorted(result["hosts"]) == ["telemetry-a", "telemetry-b"]
    cmds = _commands(mocks)
    for host, address in (("telemetry-a", "10.20.0.11"), ("telemetry-b", "10.20.0.12")):
        install = cmds[f"{host}-packages"]
        for pkg in ("prometheus", "prometheus-alertmanager", "prometheus-blackbox-exporter"):
            assert pkg in install["create"]
        assert plain(install["connection"])["host"] == address
        assert plain(install["connection"])["hostKey"].startswith("ssh-ed25519 ")
        for unit in ("prometheus-apply", "alertmanager-apply", "blackbox-apply"):
            assert f"{host}-{unit}" in cmds
        assert "promtool check config" in cmds[f"{host}-prometheus-apply"]["create"]
        assert "amtool check-config" in cmds[f"{host}-alertmanager-apply"]["create"]


def test_declared_files_and_their_paths(graph):
    _, result = graph
    files = set(result["hosts"]["telemetry-a"].files)
    assert files == {
        "/etc/prometheus/prometheus.yml",
        "/etc/prometheus/rules/coldstart.rules.yml",
        "/etc/prometheus/alertmanager.yml",
        "/etc/prometheus/blackbox.yml",
        "/etc/prometheus/secrets/consul.token",
        "/etc/prometheus/secrets/vault.token",
        "/etc/default/prometheus",
        "/etc/default/prometheus-alertmanager",
    }


def test_every_file_is_triggered_by_the_sha256_of_its_content(graph):
    mocks, _ = graph
    files = {n: i for n, i in _commands(mocks).items() if "-file-" in n}
    assert len(files) == 16
    for name, inputs in files.items():
        content = plain(inputs["stdin"])
        assert plain(inputs["triggers"])[0] == hashlib.sha256(content.encode()).hexdigest(), name


def test_prometheus_config_on_host_is_static_and_alerts_both_alertmanagers(graph):
    mocks, _ = graph
    cfg = yaml.safe_load(plain(_commands(mocks)["telemetry-a-file-prometheus-yml"]["stdin"]))
    assert cfg["global"]["external_labels"] == {"site": "dc1", "replica": "telemetry-a"}
    assert cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["10.20.0.11:9093", "10.20.0.12:9093"]
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert jobs["consul"]["authorization"]["credentials_file"] == "/etc/prometheus/secrets/consul.token"
    assert jobs["vault"]["scheme"] == "https"
    am_defaults = plain(_commands(mocks)["telemetry-a-file-alertmanager-defaults"]["stdin"])
    assert "--cluster.peer=10.20.0.12:9094" in am_defaults


def test_secrets_stay_secret(graph):
    mocks, _ = graph
    cmds = _commands(mocks)
    am = cmds["telemetry-a-file-alertmanager-yml"]
    assert is_secret(am["stdin"]), "alertmanager.yml holds the paging URL"
    assert SAMPLE_SECRETS["pagingWebhookUrl"] in plain(am["stdin"])
    assert is_secret(cmds["telemetry-a-file-secret-consul"]["stdin"])
    assert plain(cmds["telemetry-a-file-secret-consul"]["stdin"]) == "consul-acl-mock"
    assert is_secret(cmds["telemetry-a-packages"]["connection"]), "the SSH key is in the connection"
    for name, inputs in cmds.items():
        if not is_secret(inputs.get("stdin")):
            assert SAMPLE_SECRETS["pagingWebhookUrl"] not in json.dumps(plain(inputs)), name


def test_grafana_datasources_dashboard_and_meta_alert(graph):
    mocks, _ = graph
    provider = mocks.of_type("pulumi:providers:grafana")[0]
    assert provider.inputs["url"] == "http://10.20.0.13:3000"
    ds = {r.inputs["name"]: r.inputs for r in mocks.of_type("grafana:oss/dataSource:DataSource")}
    assert {n: d["url"] for n, d in ds.items()} == {
        "coldstart-telemetry-telemetry-a": "http://10.20.0.11:9090",
        "coldstart-telemetry-telemetry-b": "http://10.20.0.12:9090",
    }
    (dash,) = mocks.of_type("grafana:oss/dashboard:Dashboard")
    body = json.loads(dash.inputs["configJson"])
    assert body["uid"] == "coldstart-recovery"
    assert "Consul KV apply p50" in {p["title"] for p in body["panels"]}
    (group,) = mocks.of_type("grafana:alerting/ruleGroup:RuleGroup")
    rules = plain(group.inputs["rules"])
    assert [r["name"] for r in rules] == ["PrometheusReplicaUnreachable telemetry-a",
                                         "PrometheusReplicaUnreachable telemetry-b"]
    assert all(r["noDataState"] == "Alerting" and r["execErrState"] == "Alerting" for r in rules)
    (contact,) = mocks.of_type("grafana:alerting/contactPoint:ContactPoint")
    assert plain(contact.inputs["webhooks"])[0]["url"] == SAMPLE_SECRETS["pagingWebhookUrl"]


def test_a_target_change_redeploys_only_prometheus_yml():
    before, _ = build_graph()
    config = copy.deepcopy(sample_config())
    config["targets"]["cache"].append("10.10.4.4:9121")
    after, _ = build_graph(config)

    def triggers(m):
        return {n: plain(i["triggers"]) for n, i in _commands(m).items()}

    changed = {n for n, t in triggers(after).items() if triggers(before)[n] != t}
    assert changed == {
        "telemetry-a-file-prometheus-yml", "telemetry-b-file-prometheus-yml",
        "telemetry-a-prometheus-apply", "telemetry-b-prometheus-apply",
    }


def test_without_grafana_url_no_grafana_resources():
    config = sample_config()
    del config["grafanaUrl"]
    mocks, result = build_graph(config)
    assert "dashboards" not in result
    assert not [r for r in mocks.resources if r.type_.startswith(("grafana:", "pulumi:providers:grafana"))]


def test_promtool_accepts_the_hosts_rendered_config(graph, tmp_path):
    from tests.infra.promtool import run_promtool

    mocks, _ = graph
    cmds = _commands(mocks)
    # Point the token paths at tmp: promtool stats credentials files.
    text = plain(cmds["telemetry-a-file-prometheus-yml"]["stdin"]).replace("/etc/prometheus/", f"{tmp_path}/")
    (tmp_path / "secrets").mkdir()
    for job in ("consul", "vault"):
        (tmp_path / "secrets" / f"{job}.token").write_text("t")
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "coldstart.rules.yml").write_text(plain(cmds["telemetry-a-file-rules"]["stdin"]))
    (tmp_path / "prometheus.yml").write_text(text)
    result = run_promtool("check", "config", tmp_path / "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr

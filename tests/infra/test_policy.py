"""Policy: no telemetry resource may depend on Consul, Nomad or Vault; and the policy catches violations."""

from __future__ import annotations

import copy

import pytest

from infra.policy import ResourceRecord, find_violations, watched_hosts
from infra.telemetry.prometheus_config import dump_yaml, render_scrape_config
from infra.telemetry.targets import ScrapeTargets
from tests.infra.pulumi_harness import SAMPLE_SECRETS, build_graph, sample_config


def _violations(config=None, secrets=None):
    config = sample_config() if config is None else config
    mocks, _ = build_graph(config, secrets)
    targets = ScrapeTargets.from_mapping(config["targets"])
    return mocks, find_violations(mocks.resources, watched_hosts(targets))


def test_sample_stack_has_no_dependency_on_watched_systems():
    mocks, violations = _violations()
    assert len(mocks.resources) > 30, "the policy must see the whole graph"
    assert violations == [], "\n".join(map(str, violations))


def _bad_grafana(config, secrets):
    config["grafanaUrl"] = "http://grafana.service.consul:3000"


def _host_on_consul_server(config, secrets):
    config["telemetryHosts"][1]["address"] = "10.10.0.3"


def _host_by_consul_name(config, secrets):
    config["telemetryHosts"][0]["address"] = "telemetry-a.node.dc1.consul"


def _webhook_from_vault(config, secrets):
    secrets["pagingWebhookUrl"] = "vault://secret/data/pager#url"


def _webhook_on_nomad_server(config, secrets):
    secrets["pagingWebhookUrl"] = "http://10.10.1.2:8080/page"


@pytest.mark.parametrize(
    "mutate, rule",
    [
        (_bad_grafana, ".consul name"),
        (_host_on_consul_server, "telemetry runs on a watched server"),
        (_webhook_from_vault, "Vault lookup"),
        (_webhook_on_nomad_server, "endpoint on a watched server"),
    ],
)
def test_policy_catches_a_deliberately_bad_config(mutate, rule):
    config, secrets = copy.deepcopy(sample_config()), copy.deepcopy(SAMPLE_SECRETS)
    mutate(config, secrets)
    _, violations = _violations(config, secrets)
    assert any(v.rule == rule for v in violations), [str(v) for v in violations]


def test_program_refuses_a_telemetry_host_named_in_consul_dns():
    """Defence in depth: some violations never reach the policy because the renderers refuse them."""
    config = copy.deepcopy(sample_config())
    _host_by_consul_name(config, {})
    with pytest.raises(Exception, match="resolves through Consul DNS"):
        build_graph(config)


def test_policy_catches_service_discovery_and_watched_providers():
    config = render_scrape_config(ScrapeTargets(consul=["10.0.0.1:8500"]))
    config["scrape_configs"].append({"job_name": "sneaky", "consul_sd_configs": [{"server": "10.0.0.1:8500"}]})
    records = [
        ResourceRecord("command:remote:Command", "prom-file", {"stdin": dump_yaml(config)}),
        ResourceRecord("vault:generic/secret:Secret", "pager", {"path": "secret/pager"}),
        ResourceRecord("command:remote:Command", "fetch", {"create": "vault kv get -field=url secret/pager"}),
        ResourceRecord("command:remote:Command", "tmpl", {"create": "consul-template -once"}),
    ]
    rules = {v.rule for v in find_violations(records, {"10.0.0.1"})}
    assert rules == {"service discovery", "provider of a watched system", "Vault lookup", "Consul/Nomad lookup"}


def test_scraping_a_watched_server_is_not_a_dependency():
    """Static targets pointing at Consul are what we watch; they must not trip the policy."""
    config = render_scrape_config(ScrapeTargets(consul=["10.0.0.1:8500"], blackbox_http=["http://10.0.0.1:8500/ui"]))
    records = [ResourceRecord("command:remote:Command", "prom-file", {"stdin": dump_yaml(config)})]
    assert find_violations(records, {"10.0.0.1"}) == []

"""promtool unit tests: every alert fires on a sample incident and stays quiet on healthy series."""

from __future__ import annotations

from collections import defaultdict

import yaml

from infra.telemetry.prometheus_config import dump_yaml
from infra.telemetry.rules import alert_rules
from infra.telemetry.rules_unittests import CASES, committed_tests_path, render_rules_tests, write_rules_tests
from tests.infra.promtool import run_promtool


def test_every_alert_has_a_firing_and_a_quiet_case():
    fires, quiet = defaultdict(int), defaultdict(int)
    for case in CASES:
        (fires if case.fires else quiet)[case.alert] += 1
    for alert in alert_rules():
        assert fires[alert.name], f"{alert.name} has no case where it fires"
        # The Watchdog is the one alert that must never be quiet.
        if alert.name != "Watchdog":
            assert quiet[alert.name], f"{alert.name} has no healthy case"


def test_committed_rules_test_file_is_current():
    committed = committed_tests_path().read_text()
    assert committed == dump_yaml(render_rules_tests()), (
        "infra/telemetry/rules_test.yaml is stale: python -m infra.telemetry.rules_unittests"
    )


def test_promtool_test_rules(tmp_path):
    path = write_rules_tests(tmp_path)
    result = run_promtool("test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_promtool_notices_a_broken_rule(tmp_path):
    """Guard against a harness that always passes: weaken one threshold and its cases must fail."""
    path = write_rules_tests(tmp_path)
    # Only the weakened alert's cases: the whole file is test_promtool_test_rules's (a tenth of the time).
    tests = yaml.safe_load(path.read_text())
    tests["tests"] = [group for group in tests["tests"] if group["name"].startswith("ConsulKVApplySlow: ")]
    assert len(tests["tests"]) == 3
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    rules_file = tmp_path / "rules" / "coldstart.rules.yml"
    rules = yaml.safe_load(rules_file.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "ConsulKVApplySlow":
                rule["expr"] = "coldstart:consul_kvs_apply_p50_ms > 3000"
    rules_file.write_text(yaml.safe_dump(rules, sort_keys=False))
    result = run_promtool("test", "rules", path)
    assert result.returncode != 0
    assert "ConsulKVApplySlow" in result.stdout + result.stderr

"""Generates the promtool rule unit tests: every alert fires on a sample incident and stays quiet when healthy."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from infra.telemetry.prometheus_config import dump_yaml, render_rules
from infra.telemetry.rules import DEFAULT_RUNBOOK_BASE, RULES_FILENAME, alert_rules, runbook_anchor

__all__ = ["CASES", "TESTS_FILENAME", "Case", "committed_tests_path", "render_rules_tests", "write_rules_tests"]

TESTS_FILENAME = "rules_test.yaml"


@dataclass(frozen=True)
class Case:
    """One promtool test group for one alert. fires=() means the alert must stay quiet."""

    alert: str
    name: str
    series: dict[str, str]
    eval_time: str
    # (extra labels on the alert, expected rendered summary) per expected firing alert.
    fires: tuple[tuple[dict[str, str], str], ...] = ()
    interval: str = "1m"
    # Recording-rule checks at eval_time: (expr, expected value); pins the METRICS.md contract.
    records: tuple[tuple[str, float], ...] = field(default_factory=tuple)
    # Annotations besides summary, description and runbook_url, as promtool renders them.
    annotations: dict[str, str] = field(default_factory=dict)


MIB = 1024 * 1024
_C = 'instance="10.0.1.1:8500",job="consul"'
_C2 = 'instance="10.0.1.2:8500",job="consul"'
_C3 = 'instance="10.0.1.3:8500",job="consul"'
_N = 'node_status="ready",node_scheduling_eligibility="eligible"'
_E = 'instance="10.0.5.1:9102",job="game_edge"'
_R = 'runbook="consul-cold-start",target="prod",instance="10.0.9.1:9100",job="node"'
# The notice, a scrape that timed out (stale), the notice again, then gone from 75 s on. promtool evaluates
# every group at the file's 15 s step (the hosts group runs every 5 s in Prometheus), so the scrapes are 15 s apart.
_NOTICE_WITH_A_MISSED_SCRAPE = {
    'coldstart_host_preemption_deadline_timestamp_seconds{host="cache3",instance="10.0.2.3:9103",job="cache"}':
        "1800000030.25 1800000030.25 stale 1800000030.25 1800000030.25 stale"}

CASES: tuple[Case, ...] = (
    # --- Consul
    Case("ConsulKVApplySlow", "KV apply p50 at 2 s (the outage)",
         {f'consul_kvs_apply{{quantile="0.5",{_C}}}': "2000x20", f'consul_kvs_apply{{quantile="0.5",{_C2}}}': "30x20"},
         "10m", fires=(({}, "Consul KV apply p50 is 2k ms (normal < 300 ms)"),),
         records=(("coldstart:consul_kvs_apply_p50_ms", 2000),)),
    Case("ConsulKVApplySlow", "healthy KV apply p50 (30 ms)",
         {f'consul_kvs_apply{{quantile="0.5",{_C}}}': "30x20"}, "10m"),
    Case("ConsulKVApplySlow", "a 3-minute spike is not a page",
         {f'consul_kvs_apply{{quantile="0.5",{_C}}}': "30x5 2000x3 30x10"}, "9m"),
    Case("ConsulLeaderLastContactHigh", "slow leader",
         {f'consul_raft_leader_lastContact{{quantile="0.5",{_C}}}': "450x20"}, "10m",
         fires=(({}, "Consul leader last contact is 450 ms"),)),
    Case("ConsulLeaderLastContactHigh", "leader contact 32 ms",
         {f'consul_raft_leader_lastContact{{quantile="0.5",{_C}}}': "32x20"}, "10m"),
    Case("ConsulRaftCommitSlow", "slow raft commits",
         {f'consul_raft_commitTime{{quantile="0.5",{_C}}}': "250x20"}, "10m",
         fires=(({}, "Consul Raft commit p50 is 250 ms"),)),
    Case("ConsulRaftCommitSlow", "fast raft commits",
         {f'consul_raft_commitTime{{quantile="0.5",{_C}}}': "5x20"}, "10m"),
    Case("ConsulBoltDBFreelistGrowing", "freelist grows 200 kB a minute",
         {f"consul_raft_boltdb_freelistBytes{{{_C}}}": "0+200000x60"}, "30m",
         fires=(({}, "Consul BoltDB freelist growing 11.44MiB/hour"),)),
    Case("ConsulBoltDBFreelistGrowing", "flat freelist",
         {f"consul_raft_boltdb_freelistBytes{{{_C}}}": "40960x60"}, "30m"),
    Case("ConsulBoltDBFreelistLarge", "8 MiB freelist",
         {f"consul_raft_boltdb_freelistBytes{{{_C}}}": f"{8 * MIB}x30"}, "15m",
         fires=(({}, "Consul BoltDB freelist is 8MiB"),),
         records=(("coldstart:consul_boltdb_freelist_bytes", 8 * MIB),)),
    Case("ConsulBoltDBFreelistLarge", "1 MiB freelist",
         {f"consul_raft_boltdb_freelistBytes{{{_C}}}": f"{MIB}x30"}, "15m"),
    Case("ConsulAutopilotUnhealthy", "one server behind",
         {f"consul_autopilot_healthy{{{_C}}}": "1x10", f"consul_autopilot_healthy{{{_C2}}}": "0x10"}, "5m",
         fires=(({}, "Consul autopilot reports the cluster unhealthy"),),
         records=(("coldstart:consul_autopilot_healthy", 0),)),
    Case("ConsulAutopilotUnhealthy", "all servers healthy",
         {f"consul_autopilot_healthy{{{_C}}}": "1x10", f"consul_autopilot_healthy{{{_C2}}}": "1x10"}, "5m"),
    Case("ConsulNoLeader", "no server is leader",
         {f"consul_server_isLeader{{{_C}}}": "0x10", f"consul_server_isLeader{{{_C2}}}": "0x10",
          f"consul_server_isLeader{{{_C3}}}": "0x10"}, "5m",
         fires=(({}, "No Consul server reports itself leader"),)),
    Case("ConsulNoLeader", "one leader",
         {f"consul_server_isLeader{{{_C}}}": "1x10", f"consul_server_isLeader{{{_C2}}}": "0x10",
          f"consul_server_isLeader{{{_C3}}}": "0x10"}, "5m"),
    Case("ConsulFailureToleranceZero", "no failure tolerance",
         {f"consul_autopilot_failure_tolerance{{{_C}}}": "0x20"}, "15m",
         fires=(({}, "Consul can lose no more servers without losing quorum"),)),
    Case("ConsulFailureToleranceZero", "tolerates one failure",
         {f"consul_autopilot_failure_tolerance{{{_C}}}": "1x20"}, "15m"),
    # --- Nomad
    Case("NomadEligibleNodeFailingAllocations", "eligible node failing an alloc a minute",
         {'nomad_client_allocs_failed{instance="c1:4646",alloc_id="a1",job="cache",task="redis"}': "0+1x30",
          f'nomad_client_allocations_running{{instance="c1:4646",node_id="n1",{_N}}}': "0x30"}, "20m",
         fires=(({"node_id": "n1"}, "Nomad node n1 is ready and eligible but allocations keep failing"),)),
    Case("NomadEligibleNodeFailingAllocations", "an allocation that failed three times as it first appears",
         {'nomad_client_allocs_failed{instance="c1:4646",alloc_id="a9",job="cache",task="redis"}': "_x5 3x25",
          f'nomad_client_allocations_running{{instance="c1:4646",node_id="n1",{_N}}}': "0x30"}, "12m",
         fires=(({"node_id": "n1"}, "Nomad node n1 is ready and eligible but allocations keep failing"),)),
    Case("NomadEligibleNodeFailingAllocations", "old failures, and failures on an ineligible node",
         {'nomad_client_allocs_failed{instance="c1:4646",alloc_id="a1",job="cache",task="redis"}': "5x30",
          f'nomad_client_allocations_running{{instance="c1:4646",node_id="n1",{_N}}}': "1x30",
          'nomad_client_allocs_failed{instance="c2:4646",alloc_id="a2",job="cache",task="redis"}': "0+1x30",
          'nomad_client_allocations_running{instance="c2:4646",node_id="n2",node_status="ready",'
          'node_scheduling_eligibility="ineligible"}': "0x30"}, "20m"),
    # --- Return to service (15 s samples: the contract's rates are over 1m)
    Case("CacheHitRatioLow", "cold cache (10% hits)",
         {f'game_cache_requests_total{{result="hit",{_E}}}': "0+10x80",
          f'game_cache_requests_total{{result="miss",{_E}}}': "0+90x80"}, "15m",
         fires=(({}, "Cache hit ratio is 10%"),), interval="15s",
         records=(("coldstart:cache_hit_ratio", 0.1),)),
    Case("CacheHitRatioLow", "warm cache (95% hits)",
         {f'game_cache_requests_total{{result="hit",{_E}}}': "0+95x80",
          f'game_cache_requests_total{{result="miss",{_E}}}': "0+5x80"}, "15m", interval="15s"),
    Case("DatabaseQueryRateHigh", "2000 queries/s",
         {f"game_db_queries_total{{{_E}}}": "0+30000x80"}, "15m",
         fires=(({}, "Database load is 2k queries/s"),), interval="15s",
         records=(("coldstart:db_queries_per_second", 2000),)),
    Case("DatabaseQueryRateHigh", "100 queries/s",
         {f"game_db_queries_total{{{_E}}}": "0+1500x80"}, "15m", interval="15s"),
    Case("DatabaseQueryLatencyHigh", "queries in the 100-500 ms bucket",
         {f'game_db_query_duration_seconds_bucket{{le="0.1",{_E}}}': "0+0x80",
          f'game_db_query_duration_seconds_bucket{{le="0.5",{_E}}}': "0+10x80",
          f'game_db_query_duration_seconds_bucket{{le="+Inf",{_E}}}': "0+10x80"}, "15m",
         fires=(({}, "Database p99 query latency is 496ms"),), interval="15s"),
    Case("DatabaseQueryLatencyHigh", "queries under 100 ms",
         {f'game_db_query_duration_seconds_bucket{{le="0.1",{_E}}}': "0+10x80",
          f'game_db_query_duration_seconds_bucket{{le="0.5",{_E}}}': "0+10x80",
          f'game_db_query_duration_seconds_bucket{{le="+Inf",{_E}}}': "0+10x80"}, "15m", interval="15s"),
    Case("EdgeErrorRatioHigh", "10% of requests are 503",
         {f'game_requests_total{{code="200",{_E}}}': "0+90x80", f'game_requests_total{{code="503",{_E}}}': "0+10x80"},
         "15m", fires=(({}, "Game edge 5xx ratio is 10%"),), interval="15s",
         records=(("coldstart:edge_error_ratio", 0.1),)),
    Case("EdgeErrorRatioHigh", "no 5xx",
         {f'game_requests_total{{code="200",{_E}}}': "0+90x80", f'game_requests_total{{code="503",{_E}}}': "0+0x80"},
         "15m", interval="15s"),
    Case("PlayersAdmittedOffTarget", "target 45%, admitting 25%",
         {'coldstart_players_target_percent{job="players"}': "45x30",
          'coldstart_players_admitted_fraction{job="players"}': "0.25x30"}, "15m",
         fires=(({}, "Admitted players are 20 points off the steering target"),),
         records=(("coldstart:players_admitted_error_points", 20), ("coldstart:players_admitted_fraction", 0.25))),
    Case("PlayersAdmittedOffTarget", "target 45%, admitting 44%",
         {'coldstart_players_target_percent{job="players"}': "45x30",
          'coldstart_players_admitted_fraction{job="players"}': "0.44x30"}, "15m"),
    # --- coldstart worker
    Case("ColdstartGateFailing", "gate failing for 20 minutes",
         {'coldstart_gate_last_result{runbook="return-to-service",gate="cache_hit_ratio",job="coldstart_worker"}':
              "0x30"}, "20m",
         fires=(({"runbook": "return-to-service", "gate": "cache_hit_ratio"},
                 "coldstart gate cache_hit_ratio in return-to-service has been failing"),)),
    Case("ColdstartGateFailing", "gate held for 10 minutes only",
         {'coldstart_gate_last_result{runbook="return-to-service",gate="cache_hit_ratio",job="coldstart_worker"}':
              "1x10 0x20"}, "20m"),
    Case("ColdstartStepFailed", "a step failed",
         {'coldstart_step_runs_total{runbook="consul-recovery",step="restore_snapshot",outcome="failed"}':
              "0 0 1 1 1 1"}, "4m",
         fires=(({"runbook": "consul-recovery", "step": "restore_snapshot"},
                 "coldstart step restore_snapshot in consul-recovery failed"),)),
    Case("ColdstartStepFailed", "steps succeeding",
         {'coldstart_step_runs_total{runbook="consul-recovery",step="restore_snapshot",outcome="ok"}':
              "0 1 2 3 4 5"}, "4m"),
    # --- Readiness
    Case("ColdstartRecoveryNotReady", "the newest snapshot is too old",
         {f'coldstart_readiness{{{_R},check="snapshot:/var/lib/coldstart/snapshots"}}': "1 1 0x10",
          f'coldstart_readiness{{{_R},check="workers"}}': "1x12"}, "10m",
         fires=(({"runbook": "consul-cold-start", "target": "prod", "check": "snapshot:/var/lib/coldstart/snapshots"},
                 "consul-cold-start on prod is not ready: snapshot:/var/lib/coldstart/snapshots"),)),
    Case("ColdstartRecoveryNotReady", "every check ready, one unknown",
         {f'coldstart_readiness{{{_R},check="workers"}}': "1x12",
          f'coldstart_readiness{{{_R},check="endpoint:http://10.0.0.5:8200"}}': "-1x12"}, "10m"),
    Case("ColdstartReadinessUnknown", "a check has not answered for an hour",
         {f'coldstart_readiness{{{_R},check="endpoint:http://10.0.0.5:8200"}}': "-1x70"}, "60m",
         fires=(({"runbook": "consul-cold-start", "target": "prod", "check": "endpoint:http://10.0.0.5:8200"},
                 "Readiness of consul-cold-start on prod cannot tell: endpoint:http://10.0.0.5:8200"),)),
    Case("ColdstartReadinessUnknown", "unknown for ten minutes only",
         {f'coldstart_readiness{{{_R},check="endpoint:http://10.0.0.5:8200"}}': "1x50 -1x10 1x10"}, "60m"),
    # promtool's clock starts at 0: a check timestamp before it stands for one taken 27.8 h before the test.
    Case("ColdstartReadinessStale", "the daily check last ran over a day ago",
         {f"coldstart_readiness_checked_timestamp_seconds{{{_R}}}": "-100000x20"}, "15m",
         fires=(({"runbook": "consul-cold-start", "target": "prod"},
                 "Readiness of consul-cold-start on prod last ran 1d 4h 1m 40s ago"),)),
    Case("ColdstartReadinessStale", "checked a minute ago, every minute",
         {f"coldstart_readiness_checked_timestamp_seconds{{{_R}}}": "-60+60x20"}, "15m"),
    # --- Container hosts
    Case("HostPreemptionNotice", "cache3 gets its 30 s notice",
         {'coldstart_host_preemption_deadline_timestamp_seconds{host="cache3",instance="10.0.2.3:9103",job="cache"}':
              "0 0 1800000030.25 1800000030.25",
          'coldstart_host_preemption_deadline_timestamp_seconds{host="cache2",instance="10.0.2.2:9103",job="cache"}':
              "0 0 0 0"}, "3m",
         fires=(({"host": "cache3"}, "cache3 is preempted: terminated at 2027-01-15 08:00:30.249 +0000 UTC"),),
         annotations={"deadline": "1800000030.250"}),
    # A scrape of the busy host that times out mid-drain marks the series stale for one evaluation; keep_firing_for
    # holds the alert through it, so it never fires again with a new startsAt that the trigger would take for a
    # second notice. Once the notice is gone it resolves keep_firing_for (10 s) later: by the next 15 s step here.
    Case("HostPreemptionNotice", "one missed scrape mid-notice: still the same firing",
         _NOTICE_WITH_A_MISSED_SCRAPE, "30s",
         fires=(({"host": "cache3"}, "cache3 is preempted: terminated at 2027-01-15 08:00:30.249 +0000 UTC"),),
         interval="15s", annotations={"deadline": "1800000030.250"}),
    Case("HostPreemptionNotice", "the notice just gone: still firing",
         _NOTICE_WITH_A_MISSED_SCRAPE, "75s",
         fires=(({"host": "cache3"}, "cache3 is preempted: terminated at 2027-01-15 08:00:30.249 +0000 UTC"),),
         interval="15s", annotations={"deadline": "1800000030.250"}),
    Case("HostPreemptionNotice", "the notice gone 15 s ago: resolved", _NOTICE_WITH_A_MISSED_SCRAPE, "90s",
         interval="15s"),
    Case("HostPreemptionNotice", "no notice", {
        'coldstart_host_preemption_deadline_timestamp_seconds{host="cache3",instance="10.0.2.3:9103",job="cache"}':
            "0x5"}, "3m"),
    # --- Telemetry stack
    Case("Watchdog", "always firing, with no input at all", {}, "1m",
         fires=(({}, "Always firing: proves Prometheus -> Alertmanager -> pager works"),)),
    Case("ScrapeTargetDown", "a Consul server cannot be scraped",
         {f"up{{{_C}}}": "0x10", f"up{{{_C2}}}": "1x10"}, "5m",
         fires=(({"job": "consul", "instance": "10.0.1.1:8500"},
                 "consul target 10.0.1.1:8500 is not being scraped"),)),
    Case("ScrapeTargetDown", "all targets up", {f"up{{{_C}}}": "1x10"}, "5m"),
    Case("BlackboxProbeFailed", "the edge is unreachable from outside",
         {'probe_success{job="blackbox_http",instance="http://203.0.113.10/health"}': "0x10"}, "5m",
         fires=(({"job": "blackbox_http", "instance": "http://203.0.113.10/health"},
                 "Probe blackbox_http http://203.0.113.10/health is failing"),)),
    Case("BlackboxProbeFailed", "the edge answers",
         {'probe_success{job="blackbox_http",instance="http://203.0.113.10/health"}': "1x10"}, "5m"),
)


def render_rules_tests(runbook_base_url: str = DEFAULT_RUNBOOK_BASE) -> dict:
    """The promtool test file as a dict; expected annotations come from the alert definitions."""
    alerts = {a.name: a for a in alert_rules()}
    tests = []
    for case in CASES:
        alert = alerts[case.alert]
        exp = []
        for labels, summary in case.fires:
            exp.append({
                "exp_labels": {"severity": alert.severity, "team": "platform", **alert.extra_labels, **labels},
                "exp_annotations": {
                    "summary": summary,
                    "description": alert.description,
                    "runbook_url": f"{runbook_base_url}#{runbook_anchor(alert.name)}",
                    **case.annotations,
                },
            })
        group: dict = {
            "name": f"{case.alert}: {case.name}",
            "interval": case.interval,
            "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
            "alert_rule_test": [{"eval_time": case.eval_time, "alertname": case.alert, "exp_alerts": exp}],
        }
        if case.records:
            group["promql_expr_test"] = [
                # round(): rates of 15 s samples land a few ulps off the exact ratio.
                {"expr": f"round({expr}, 0.0001)", "eval_time": case.eval_time,
                 "exp_samples": [{"labels": "{}", "value": value}]}
                for expr, value in case.records
            ]
        tests.append(group)
    return {"rule_files": [f"rules/{RULES_FILENAME}"], "evaluation_interval": "15s", "tests": tests}


def committed_tests_path() -> Path:
    return Path(__file__).with_name(TESTS_FILENAME)


def write_rules_tests(dest_dir: str | Path) -> Path:
    """Write rules/coldstart.rules.yml and the test file side by side, ready for `promtool test rules`."""
    dest = Path(dest_dir)
    (dest / "rules").mkdir(parents=True, exist_ok=True)
    (dest / "rules" / RULES_FILENAME).write_text(dump_yaml(render_rules()))
    path = dest / TESTS_FILENAME
    path.write_text(dump_yaml(render_rules_tests()))
    return path


if __name__ == "__main__":  # regenerate the committed copy: python -m infra.telemetry.rules_unittests
    committed_tests_path().write_text(dump_yaml(render_rules_tests()))
    sys.stdout.write(f"wrote {committed_tests_path()}\n")

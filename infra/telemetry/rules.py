"""Recording and alert rules for the coldstart telemetry stack (metric names per infra/METRICS.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from infra.telemetry.thresholds import AlertThresholds

__all__ = [
    "HOSTS_GROUP",
    "READINESS_MAX_AGE_SECONDS",
    "RULES_FILENAME",
    "Alert",
    "RecordingRule",
    "alert_rules",
    "recording_rules",
    "render_rules",
    "runbook_anchor",
]

RULES_FILENAME = "coldstart.rules.yml"
DEFAULT_RUNBOOK_BASE = "infra/README.md"
HOSTS_GROUP = "coldstart-hosts"
# Readiness runs daily: a day and two hours leaves room for a slow run before it counts as stopped.
READINESS_MAX_AGE_SECONDS = 26 * 3600


@dataclass(frozen=True)
class RecordingRule:
    record: str
    expr: str


@dataclass(frozen=True)
class Alert:
    name: str
    group: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    extra_labels: dict[str, str] = field(default_factory=dict)
    extra_annotations: dict[str, str] = field(default_factory=dict)
    # Prometheus's keep_firing_for: an alert whose series misses an evaluation (a scrape that timed out marks it
    # stale) stays one firing instead of resolving and firing again with a new startsAt.
    keep_firing_for: str = ""


def recording_rules() -> list[RecordingRule]:
    """The series gates query. Aggregations drop instance labels so a gate reads one number."""
    return [
        RecordingRule("coldstart:consul_kvs_apply_p50_ms", 'max(consul_kvs_apply{quantile="0.5"})'),
        RecordingRule("coldstart:consul_leader_last_contact_ms", 'max(consul_raft_leader_lastContact{quantile="0.5"})'),
        RecordingRule("coldstart:consul_raft_commit_p50_ms", 'max(consul_raft_commitTime{quantile="0.5"})'),
        RecordingRule("coldstart:consul_autopilot_healthy", "min(consul_autopilot_healthy)"),
        RecordingRule("coldstart:consul_boltdb_freelist_bytes", "max(consul_raft_boltdb_freelistBytes)"),
        # The share of CFS periods in which a server's cgroup was throttled (cAdvisor's counters):
        # a starved leader shows here before its Raft timings do.
        RecordingRule(
            "coldstart:consul_server_cpu_throttled_ratio",
            "max by (name) (rate(container_cpu_cfs_throttled_periods_total[1m])"
            " / rate(container_cpu_cfs_periods_total[1m]))",
        ),
        # deriv over 30m: snapshots make the freelist saw-tooth; a shorter window pages on noise.
        RecordingRule(
            "coldstart:consul_boltdb_freelist_growth_bytes_per_hour",
            "max(deriv(consul_raft_boltdb_freelistBytes[30m])) * 3600",
        ),
        # Nomad clients count failures per allocation (nomad_client_allocs_failed, no node labels);
        # their node gauges on the same scrape target say which node it is and whether it is ready
        # and eligible, so the failures are joined to those by instance. increase() tolerates a
        # client restart resetting the counters.
        RecordingRule(
            "coldstart:nomad_eligible_node_failed_allocs_10m",
            # A client exports an allocation's counter only once it has failed, so a series born in
            # the window counts in full (increase() would miss its first failures).
            "sum by (node_id) (sum by (instance) ("
            "(sum by (instance, alloc_id) (nomad_client_allocs_failed)"
            " unless sum by (instance, alloc_id) (nomad_client_allocs_failed offset 10m))"
            " or sum by (instance, alloc_id) (increase(nomad_client_allocs_failed[10m])))"
            " * on (instance) group_left (node_id) (max by (instance, node_id) (nomad_client_allocations_running"
            '{node_status="ready",node_scheduling_eligibility="eligible"}) * 0 + 1))',
        ),
        RecordingRule(
            "coldstart:cache_hit_ratio",
            # `or vector(0)`: no hit (or no 5xx) yet is a ratio of 0, not an empty result; with no
            # requests at all the ratio stays NaN/empty, so a gate fails closed on missing traffic.
            '(sum(rate(game_cache_requests_total{result="hit"}[1m])) or vector(0))'
            ' / sum(rate(game_cache_requests_total{result=~"hit|miss"}[1m]))',
        ),
        RecordingRule("coldstart:db_queries_per_second", "sum(rate(game_db_queries_total[1m]))"),
        RecordingRule(
            "coldstart:db_query_p99_seconds",
            "histogram_quantile(0.99, sum by (le) (rate(game_db_query_duration_seconds_bucket[1m])))",
        ),
        RecordingRule(
            "coldstart:edge_error_ratio",
            '(sum(rate(game_requests_total{code=~"5.."}[1m])) or vector(0)) / sum(rate(game_requests_total[1m]))',
        ),
        RecordingRule("coldstart:players_admitted_fraction", "max(coldstart_players_admitted_fraction)"),
        RecordingRule(
            "coldstart:players_admitted_error_points",
            "abs(max(coldstart_players_admitted_fraction) * 100 - max(coldstart_players_target_percent))",
        ),
    ]


def alert_rules(t: AlertThresholds | None = None) -> list[Alert]:
    """Alerts from the postmortem plus the telemetry stack's own health. `for:` filters flaps."""
    t = t or AlertThresholds()
    return [
        # --- Consul: the signals that were visible (or should have been) during the outage.
        Alert(
            "ConsulKVApplySlow", "coldstart-consul",
            f"coldstart:consul_kvs_apply_p50_ms > {_num(t.kv_apply_p50_ms)}", "5m", "critical",
            "Consul KV apply p50 is {{ $value | humanize }} ms (normal < " + _num(t.kv_apply_p50_ms) + " ms)",
            "KV writes are queueing on the Raft leader. In Oct 2021 this sat at ~2 s for days: "
            "check streaming, the leader's BoltDB freelist and write load before replacing hardware.",
        ),
        Alert(
            "ConsulLeaderLastContactHigh", "coldstart-consul",
            f"coldstart:consul_leader_last_contact_ms > {_num(t.leader_last_contact_ms)}", "5m", "warning",
            "Consul leader last contact is {{ $value | humanize }} ms",
            "The leader is slow to reach its followers; a slow leader that keeps being re-elected "
            "was the BoltDB freelist symptom. Consider transferring leadership off that server.",
        ),
        Alert(
            "ConsulRaftCommitSlow", "coldstart-consul",
            f"coldstart:consul_raft_commit_p50_ms > {_num(t.raft_commit_p50_ms)}", "5m", "warning",
            "Consul Raft commit p50 is {{ $value | humanize }} ms",
            "Raft commits are slow: disk, freelist maintenance or contention on the leader.",
        ),
        Alert(
            "ConsulBoltDBFreelistGrowing", "coldstart-consul",
            "coldstart:consul_boltdb_freelist_growth_bytes_per_hour"
            f" > {_num(t.boltdb_freelist_growth_bytes_per_hour)}", "15m", "warning",
            "Consul BoltDB freelist growing {{ $value | humanize1024 }}B/hour",
            "The Raft log store's freelist keeps growing; every write pays to maintain it. "
            "This is the slow-leader cause found after the Oct 2021 outage.",
        ),
        Alert(
            "ConsulBoltDBFreelistLarge", "coldstart-consul",
            f"coldstart:consul_boltdb_freelist_bytes > {_num(t.boltdb_freelist_bytes)}", "10m", "warning",
            "Consul BoltDB freelist is {{ $value | humanize1024 }}B",
            "A large freelist makes Raft log writes expensive on that server; plan a rotation "
            "of its raft.db (or a bbolt-based Consul) before it becomes leader under load.",
        ),
        Alert(
            "ConsulAutopilotUnhealthy", "coldstart-consul",
            "coldstart:consul_autopilot_healthy < 1", "2m", "critical",
            "Consul autopilot reports the cluster unhealthy",
            "At least one server is not keeping up with the leader (autopilot health).",
        ),
        Alert(
            "ConsulNoLeader", "coldstart-consul",
            "sum(consul_server_isLeader) < 1", "1m", "critical",
            "No Consul server reports itself leader",
            "Without a leader Consul accepts no writes; Nomad and Vault stall behind it.",
        ),
        Alert(
            "ConsulFailureToleranceZero", "coldstart-consul",
            "min(consul_autopilot_failure_tolerance) < 1", "10m", "warning",
            "Consul can lose no more servers without losing quorum",
            "Autopilot failure tolerance is 0: replace or recover a server before touching another.",
        ),
        # --- Nomad: the node the scheduler saw as "completely open" while every alloc on it failed.
        Alert(
            "NomadEligibleNodeFailingAllocations", "coldstart-nomad",
            f"coldstart:nomad_eligible_node_failed_allocs_10m > {_num(t.nomad_failed_allocs_10m)}", "5m", "warning",
            "Nomad node {{ $labels.node_id }} is ready and eligible but allocations keep failing",
            "The scheduler keeps placing work on this node and it keeps failing. "
            "Mark it ineligible and drain it; do not retry the deploy onto it.",
        ),
        # --- Return to service: what the team checked before every 10% ramp step.
        Alert(
            "CacheHitRatioLow", "coldstart-return-to-service",
            f"coldstart:cache_hit_ratio < {_num(t.cache_hit_ratio_min)}", "10m", "warning",
            "Cache hit ratio is {{ $value | humanizePercentage }}",
            "Cold or misdeployed caches push load onto the databases; hold the player ramp.",
        ),
        Alert(
            "DatabaseQueryRateHigh", "coldstart-return-to-service",
            f"coldstart:db_queries_per_second > {_num(t.db_queries_per_second_max)}", "5m", "warning",
            "Database load is {{ $value | humanize }} queries/s",
            "Database query rate is above the safe ceiling; hold or step back the player ramp.",
        ),
        Alert(
            "DatabaseQueryLatencyHigh", "coldstart-return-to-service",
            f"coldstart:db_query_p99_seconds > {_num(t.db_query_p99_seconds_max)}", "5m", "warning",
            "Database p99 query latency is {{ $value | humanizeDuration }}",
            "Databases are saturating; hold or step back the player ramp.",
        ),
        Alert(
            "EdgeErrorRatioHigh", "coldstart-return-to-service",
            f"coldstart:edge_error_ratio > {_num(t.edge_error_ratio_max)}", "5m", "critical",
            "Game edge 5xx ratio is {{ $value | humanizePercentage }}",
            "Admitted players are seeing errors; step the DNS steering percentage back.",
        ),
        Alert(
            "PlayersAdmittedOffTarget", "coldstart-return-to-service",
            f"coldstart:players_admitted_error_points > {_num(t.admitted_error_points_max)}", "10m", "warning",
            "Admitted players are {{ $value | humanize }} points off the steering target",
            "DNS steering is not admitting the fraction the runbook set: stale TTLs, a steering "
            "server not reloaded, or players sharing the bypass.",
        ),
        # --- coldstart itself.
        Alert(
            "ColdstartGateFailing", "coldstart-worker",
            "min by (runbook, gate) (coldstart_gate_last_result) < 1", t.gate_failing_for, "warning",
            "coldstart gate {{ $labels.gate }} in {{ $labels.runbook }} has been failing",
            "The recovery is holding at this gate. Read the gate's query on the recovery dashboard "
            "before overriding it.",
        ),
        Alert(
            "ColdstartStepFailed", "coldstart-worker",
            'sum by (runbook, step) (increase(coldstart_step_runs_total{outcome="failed"}[15m])) > 0', "0m",
            "warning",
            "coldstart step {{ $labels.step }} in {{ $labels.runbook }} failed",
            "A runbook step failed after its retries; the workflow is compensating or waiting.",
        ),
        # --- Readiness (coldstart readiness, a textfile or a Pushgateway): an unready recovery pages on an
        # ordinary day, not on the day it is needed.
        Alert(
            "ColdstartRecoveryNotReady", "coldstart-readiness",
            "min by (runbook, target, check) (coldstart_readiness) == 0", "5m", "critical",
            "{{ $labels.runbook }} on {{ $labels.target }} is not ready: {{ $labels.check }}",
            "The recovery would fail at this check today. `coldstart readiness RUNBOOK --target TARGET` prints "
            "the evidence; fix it before the outage that needs it.",
        ),
        Alert(
            "ColdstartReadinessUnknown", "coldstart-readiness",
            "min by (runbook, target, check) (coldstart_readiness) == -1", "30m", "warning",
            "Readiness of {{ $labels.runbook }} on {{ $labels.target }} cannot tell: {{ $labels.check }}",
            "The check timed out or failed itself; the recovery path is unproven until it answers.",
        ),
        Alert(
            "ColdstartReadinessStale", "coldstart-readiness",
            "time() - max by (runbook, target) (coldstart_readiness_checked_timestamp_seconds)"
            f" > {_num(READINESS_MAX_AGE_SECONDS)}", "10m", "warning",
            "Readiness of {{ $labels.runbook }} on {{ $labels.target }} last ran {{ $value | humanizeDuration }} ago",
            "The daily readiness check stopped running (its timer, schedule or metrics file): a green "
            "readiness is as old as this.",
        ),
        # --- Container hosts: a preemption notice starts the drain runbook (coldstart triggers serve).
        Alert(
            "HostPreemptionNotice", "coldstart-hosts",
            "max by (host) (coldstart_host_preemption_deadline_timestamp_seconds) > 0", "0s", "critical",
            "{{ $labels.host }} is preempted: terminated at {{ $value | humanizeTimestamp }}",
            "The provider terminates the host at the deadline (30 s of notice). coldstart's trigger starts "
            "runbooks/preempted-host-drain.yaml for it; if it did not, run it by hand at once.",
            extra_annotations={"deadline": '{{ printf "%.3f" $value }}'},
            # One notice, one firing: a scrape of a busy host that times out mid-drain would otherwise resolve
            # the alert and fire it again, and the trigger would start a second run for the same notice.
            keep_firing_for="10s",
        ),
        # --- The telemetry stack: it must say when it is blind.
        Alert(
            "Watchdog", "coldstart-telemetry",
            "vector(1)", "0m", "none",
            "Always firing: proves Prometheus -> Alertmanager -> pager works",
            "Routed to the heartbeat receiver; its absence upstream means alerting is broken.",
        ),
        Alert(
            "ScrapeTargetDown", "coldstart-telemetry",
            "up == 0", "3m", "warning",
            "{{ $labels.job }} target {{ $labels.instance }} is not being scraped",
            "Prometheus cannot scrape this target: the process is down or the network path is. "
            "Its gates and alerts are blind until it is back.",
        ),
        Alert(
            "BlackboxProbeFailed", "coldstart-telemetry",
            "probe_success == 0", "3m", "critical",
            "Probe {{ $labels.job }} {{ $labels.instance }} is failing",
            "An endpoint checked from outside (players' view) is unreachable.",
        ),
    ]


def _num(x: float) -> str:
    """Exact PromQL literal: `:g` would turn 1 MiB into 1.04858e+06."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def runbook_anchor(alert_name: str) -> str:
    """GitHub-style anchor of the alert's section in infra/README.md."""
    return alert_name.lower()


def render_rules(thresholds: AlertThresholds | None = None, runbook_base_url: str = DEFAULT_RUNBOOK_BASE,
                 recording_interval: str = "15s", group_intervals: dict[str, str] | None = None) -> dict:
    """The Prometheus rules file as a dict: one recording group, one group per alert area.

    group_intervals: evaluation interval per alert group (default: the global one); a notice that
    leaves 30 s wants `coldstart-hosts` evaluated every second or so."""
    groups: list[dict] = [
        {
            "name": "coldstart-recording",
            # Gates read these series: a drill lab with short bakes records them more often.
            "interval": recording_interval,
            "rules": [{"record": r.record, "expr": r.expr} for r in recording_rules()],
        }
    ]
    by_group: dict[str, list[dict]] = {}
    for a in alert_rules(thresholds):
        rule = {
            "alert": a.name,
            "expr": a.expr,
            **({"for": a.for_} if a.for_ not in ("0m", "0s") else {}),
            **({"keep_firing_for": a.keep_firing_for} if a.keep_firing_for else {}),
            "labels": {"severity": a.severity, "team": "platform", **a.extra_labels},
            "annotations": {
                "summary": a.summary,
                "description": a.description,
                "runbook_url": f"{runbook_base_url}#{runbook_anchor(a.name)}",
                **a.extra_annotations,
            },
        }
        by_group.setdefault(a.group, []).append(rule)
    # The preemption notice is evaluated every 5 s unless told otherwise: a notice leaves 30 s.
    intervals = {HOSTS_GROUP: "5s", **(group_intervals or {})}
    groups.extend({"name": name, **({"interval": intervals[name]} if name in intervals else {}), "rules": rules}
                  for name, rules in by_group.items())
    return {"groups": groups}

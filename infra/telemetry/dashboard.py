"""Builds the recovery dashboard JSON (plain dicts) that Grafana receives through Pulumi."""

from __future__ import annotations

from typing import Any

from infra.telemetry.thresholds import AlertThresholds

__all__ = ["RECOVERY_DASHBOARD_UID", "dashboard_queries", "recovery_dashboard"]

RECOVERY_DASHBOARD_UID = "coldstart-recovery"


def _panel(pid: int, title: str, targets: list[tuple[str, str]], *, x: int, y: int, unit: str = "short",
           threshold: float | None = None, kind: str = "timeseries", ds: dict, w: int = 12, h: int = 8,
           description: str = "") -> dict[str, Any]:
    steps: list[dict] = [{"color": "green", "value": None}]
    if threshold is not None:
        steps.append({"color": "red", "value": threshold})
    return {
        "id": pid,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": ds,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "thresholds": {"mode": "absolute", "steps": steps},
                # Draw the alert threshold on the graph so the 3 a.m. reader sees the line, not a number.
                "custom": {"thresholdsStyle": {"mode": "line" if threshold is not None else "off"}},
            },
            "overrides": [],
        },
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "datasource": ds}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def recovery_dashboard(datasource_uid: str, thresholds: AlertThresholds | None = None) -> dict[str, Any]:
    """The recovery dashboard: the postmortem's signals, top to bottom in the order of a cold start."""
    t = thresholds or AlertThresholds()
    # A variable, not a fixed uid: if one Prometheus replica is down, switch to its peer in one click.
    ds = {"type": "prometheus", "uid": "${datasource}"}
    p = lambda *a, **k: _panel(*a, ds=ds, **k)
    panels = [
        p(1, "Consul KV apply p50", [("coldstart:consul_kvs_apply_p50_ms", "max p50"),
                                     ('consul_kvs_apply{quantile="0.5"}', "{{instance}}")],
          x=0, y=0, unit="ms", threshold=t.kv_apply_p50_ms, description="Normal < 300 ms; the outage sat at ~2 s."),
        p(2, "Consul leader last contact", [("coldstart:consul_leader_last_contact_ms", "leader")],
          x=12, y=0, unit="ms", threshold=t.leader_last_contact_ms),
        p(3, "Raft commit time p50", [("coldstart:consul_raft_commit_p50_ms", "max p50"),
                                      ('consul_raft_commitTime{quantile="0.5"}', "{{instance}}")],
          x=0, y=8, unit="ms", threshold=t.raft_commit_p50_ms),
        p(4, "BoltDB freelist size", [("consul_raft_boltdb_freelistBytes", "{{instance}}")],
          x=12, y=8, unit="bytes", threshold=t.boltdb_freelist_bytes,
          description="Growing freelist = slow Raft writes on that server (the slow-leader cause)."),
        p(5, "Consul autopilot / leader", [("coldstart:consul_autopilot_healthy", "autopilot healthy"),
                                           ("sum(consul_server_isLeader)", "leaders"),
                                           ("min(consul_autopilot_failure_tolerance)", "failure tolerance")],
          x=0, y=16, kind="stat"),
        p(6, "Nomad allocation health",
          [("sum by (node_id) (nomad_client_allocations_running)", "running {{node_id}}"),
           ("coldstart:nomad_eligible_node_failed_allocs_10m", "failed/10m on eligible {{node_id}}"),
           ("sum(nomad_nomad_job_summary_queued)", "queued"),
           ("sum(nomad_nomad_job_summary_failed)", "failed (job summary)")],
          x=12, y=16),
        p(7, "Cache hit ratio", [("coldstart:cache_hit_ratio", "hit ratio")],
          x=0, y=24, unit="percentunit", threshold=t.cache_hit_ratio_min),
        p(8, "Database load", [("coldstart:db_queries_per_second", "queries/s"),
                               ("coldstart:db_query_p99_seconds * 1000", "p99 ms")],
          x=12, y=24, threshold=t.db_queries_per_second_max),
        p(9, "Admitted players vs target", [("coldstart:players_admitted_fraction * 100", "admitted %"),
                                            ("max(coldstart_players_target_percent)", "target %")],
          x=0, y=32, unit="percent"),
        p(10, "Edge 5xx ratio", [("coldstart:edge_error_ratio", "5xx ratio")],
          x=12, y=32, unit="percentunit", threshold=t.edge_error_ratio_max),
        p(11, "Runbook steps", [('sum by (runbook, step, outcome) (increase(coldstart_step_runs_total[5m]))',
                                 "{{runbook}} {{step}} {{outcome}}"),
                                ("sum by (runbook, step) (coldstart_step_in_progress)", "running {{runbook}} {{step}}")],
          x=0, y=40),
        p(12, "Gate results (1 = pass)", [("coldstart_gate_last_result", "{{runbook}} {{gate}}")],
          x=12, y=40, kind="state-timeline"),
        p(13, "What telemetry can see (up by job)", [("sum by (job) (up)", "{{job}} up"),
                                                      ("count by (job) (up)", "{{job}} total")],
          x=0, y=48, w=24),
    ]
    return {
        "uid": RECOVERY_DASHBOARD_UID,
        "title": "coldstart recovery",
        "tags": ["coldstart", "recovery", "out-of-band"],
        "timezone": "utc",
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "schemaVersion": 39,
        "editable": False,
        "panels": panels,
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus replica",
                    "type": "datasource",
                    "query": "prometheus",
                    "regex": "/^coldstart-telemetry/",
                    "current": {"text": datasource_uid, "value": datasource_uid},
                }
            ]
        },
    }


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression on a dashboard (tests check them against the metrics contract)."""
    return [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]

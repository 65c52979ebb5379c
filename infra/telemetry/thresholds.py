"""Alert thresholds, with defaults taken from the Oct 2021 postmortem; one object so the lab can tune."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MIB", "AlertThresholds"]

MIB = 1024 * 1024


@dataclass(frozen=True)
class AlertThresholds:
    """Numbers the alert rules compare against; recording rules never depend on these."""

    # "KV Apply time ... is considered normal at less than 300ms"; the outage sat at ~2 s.
    kv_apply_p50_ms: float = 300.0
    # A healthy leader contacted its followers "in the last 32ms"; Consul's guidance warns at 200.
    leader_last_contact_ms: float = 200.0
    raft_commit_p50_ms: float = 100.0
    # The pathological freelist was 7.8 MB; growth is the early signal, size the late one.
    boltdb_freelist_growth_bytes_per_hour: float = 1 * MIB
    boltdb_freelist_bytes: float = 5 * MIB
    # Failed allocations in 10 minutes on a node the scheduler still thinks is fine.
    nomad_failed_allocs_10m: float = 2.0
    cache_hit_ratio_min: float = 0.8
    db_queries_per_second_max: float = 1000.0
    db_query_p99_seconds_max: float = 0.25
    edge_error_ratio_max: float = 0.05
    # DNS steering moves in ~10-point steps; more than half a step off for long means it is stuck.
    admitted_error_points_max: float = 5.0
    # A gate that has been failing this long is holding the ramp; a human should look.
    gate_failing_for: str = "15m"

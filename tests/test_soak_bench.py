"""bench/soak.py's own figures from synthetic histories (percentiles, latencies per phase, stalls around faults, the fault schedule) and its drain runbook."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from activities.catalog import load_registry
from activities.retry import Retry
from workflows.loader import RunbookInvalid, plan_run
from workflows.spec import ActionStep, OnFailure

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

from _soak_figures import (  # pyright: ignore[reportMissingImports] - bench/ is put on sys.path above
    Fault,
    RunTrace,
    baseline_gap,
    fault_schedule,
    latencies_between,
    percentile,
    stall_around,
)


def test_percentile_is_nearest_rank_and_nan_for_nothing():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_latencies_are_split_by_when_the_activity_was_scheduled():
    trace = RunTrace("wf", "r", events=[], activities=[(10.0, 10.2), (59.9, 61.0), (60.0, 75.0)],
                     reads=[(5.0, 7.0), (80.0, 80.5)])
    assert latencies_between([trace], 0, 60) == pytest.approx([0.2, 1.1])
    assert latencies_between([trace], 60, math.inf) == pytest.approx([15.0])
    assert latencies_between([trace], 0, 60, reads=True) == pytest.approx([2.0])
    assert latencies_between([trace], 60, math.inf, reads=True) == pytest.approx([0.5])


def test_the_gap_across_a_fault_and_the_wait_after_it():
    # A run moving every second, silent from 100 to 112 while the server restarts from 101 to 106.
    moving = RunTrace("soak-a", "1", events=[97, 98, 99, 100, 112, 113])
    # A run that moved right after the restart ended.
    quick = RunTrace("soak-b", "1", events=[95, 100.5, 107, 108])
    # Runs that ended before the fault, or started after it, are not counted.
    before = RunTrace("soak-c", "1", events=[10, 20])
    after = RunTrace("soak-d", "1", events=[200, 210])
    stall = stall_around([moving, quick, before, after], Fault("temporal-restart", 101, 106))
    assert stall.runs == 2
    assert (stall.still_s, stall.still_run) == (12, "soak-a")
    assert (stall.recovery_s, stall.recovery_run) == (6, "soak-a")


def test_an_open_run_that_never_moved_again_stood_still_until_it_was_read():
    stuck = RunTrace("soak-u", "1", events=[50, 51], open_until=300)
    stall = stall_around([stuck], Fault("worker-kill", 60, 60))
    assert stall.still_s == 249
    assert stall.recovery_s == 240  # its only later "event" is the reading itself: it never recovered before it


def test_a_run_that_ended_or_held_before_the_fault_is_not_counted():
    held = RunTrace("soak-h", "1", events=[50, 51])  # no open_until: it waits for an operator from its hold
    stall = stall_around([held], Fault("worker-kill", 60, 60))
    assert (stall.runs, stall.still_s, stall.recovery_s) == (0, 0, 0)


def test_an_instant_fault_counts_the_gap_that_spans_it():
    run = RunTrace("soak-k", "1", events=[58, 59, 66, 67])
    stall = stall_around([run], Fault("worker-kill", 60, 60))
    assert (stall.still_s, stall.recovery_s, stall.runs) == (7, 6, 1)


def test_baseline_gap_looks_only_inside_the_window():
    run = RunTrace("soak-q", "1", events=[0, 2, 2.5, 5, 70, 71])
    assert baseline_gap([run], 0, 60) == 2.5


def test_schedule_kills_every_minute_and_spreads_the_one_off_faults_between_kills():
    schedule = fault_schedule(360, 60)
    kills = [at for at, name in schedule if name == "worker-kill"]
    once = [(at, name) for at, name in schedule if name != "worker-kill"]
    assert kills == [60, 120, 180, 240, 300]
    assert once == [(75, "temporal-restart"), (135, "postgres-restart"), (195, "prometheus-down"), (255, "dns-down")]
    assert schedule == sorted(schedule)
    assert not any(at < 60 for at, _ in schedule)  # the baseline stays quiet


def test_the_full_setting_spreads_the_outages_a_quarter_after_a_kill():
    schedule = fault_schedule(900, 60)
    assert [at for at, name in schedule if name == "worker-kill"] == [60 + 60 * i for i in range(14)]
    assert [(at, name) for at, name in schedule if name != "worker-kill"] == [
        (75, "temporal-restart"), (255, "postgres-restart"), (495, "prometheus-down"), (675, "dns-down")]


def test_a_30s_outage_clears_before_the_next_kill_and_its_stall_is_its_own():
    # The DNS server down from 255 to 285: a run retrying its read from 256 moves again at 287; the kill
    # at 300 is outside the outage's window, so a gap that starts after it is not the outage's.
    retrying = RunTrace("soak-r", "1", events=[250, 254, 256, 287, 288, 301, 320])
    stall = stall_around([retrying], Fault("dns-down", 255, 285))
    assert (stall.still_s, stall.recovery_s, stall.runs) == (31, 2, 1)


def test_schedule_refuses_a_soak_too_short_for_its_faults():
    with pytest.raises(ValueError, match="room for 3 of the 4"):
        fault_schedule(240, 60)
    with pytest.raises(ValueError, match="room for 2 of the 4"):
        fault_schedule(180, 60)
    with pytest.raises(ValueError, match="no time for faults"):
        fault_schedule(60, 60)


def _soak_target(**extra) -> dict:
    return {"name": "soak-000", "development": True, "telemetry": {"prometheus": "http://127.0.0.1:9090"}, **extra}


def test_the_drain_runbook_reads_the_steering_record_and_waits_out_a_30s_dns_outage():
    dns = {"zone": "play.coldstart.lab.", "name": "play", "servers": ["127.0.0.1:5353"], "game_ip": "10.20.0.10",
           "maint_ip": "10.20.0.99", "tsig_key_name": "coldstart-steer.",
           "tsig_secret": {"address": "http://vault.invalid:8200", "path": "coldstart/dns-tsig", "field": "secret"}}
    run = plan_run(BENCH / "soak-drain.yaml", registry=load_registry(), inventory=_soak_target(dns=dns), initiator="t")
    step = next(s for s in run.runbook.steps if s.id == "steering")
    assert isinstance(step, ActionStep) and step.action == "dns.steer.get"
    assert step.on_failure == OnFailure.retry  # else the action's own policy applies (about 15 s in all)
    retry = step.retry or Retry()
    waited = sum(retry.delay(attempt).total_seconds() for attempt in range(1, retry.max_attempts))
    assert 30 < waited < 60  # outlasts the soak's 30 s outage, then a read every 5 s at most
    assert retry.max_interval.total_seconds() <= 5
    assert step.timeout is not None and step.timeout.total_seconds() <= 10  # a lost attempt moves on within the goal
    with pytest.raises(RunbookInvalid, match="target has no 'dns'"):
        plan_run(BENCH / "soak-drain.yaml", registry=load_registry(), inventory=_soak_target(), initiator="t")


def test_the_control_reads_the_recovery_figure_at_quiet_instants_of_the_baseline():
    from _soak_figures import quiet_instants, quiet_recoveries  # pyright: ignore[reportMissingImports]

    assert quiet_instants(1000.0, 180.0) == [1060.0, 1070.0, 1080.0, 1090.0, 1100.0, 1110.0, 1120.0, 1130.0,
                                               1140.0, 1150.0]
    assert quiet_instants(1000.0, 60.0) == []  # no room after the warm-up: no control
    # A run reading a gate every 20 s, with nothing failing: after an instant it waits up to 20 s anyway.
    reading = RunTrace("soak-g", "1", events=[1050.0, 1070.0, 1090.0, 1110.0, 1130.0, 1150.0, 1170.0])
    controls = quiet_recoveries([reading], [1060.0, 1075.0, 1089.0])
    assert [c.recovery_s for c in controls] == [10.0, 15.0, 1.0]
    assert all(c.runs == 1 and c.recovery_run == "soak-g" for c in controls)


def _outcomes(**states: int) -> list:
    from soak import Outcome  # pyright: ignore[reportMissingImports]

    return [Outcome(f"soak-{state}-{i}", "demo", "wf", "r", state=state, reason="a reason")
            for state, n in states.items() for i in range(n)]


def test_the_soak_verdict_is_met_only_with_every_run_succeeded_and_every_recovery_quick():
    from soak import soak_verdict  # pyright: ignore[reportMissingImports]

    verdict = soak_verdict(_outcomes(succeeded=744), repeated=0, slow=[])
    assert verdict.met and verdict.line().startswith("goal met:")


def test_the_soak_verdict_counts_failed_and_held_runs():
    from soak import soak_verdict  # pyright: ignore[reportMissingImports]

    # The figure bench/README quoted as met: 718 succeeded, 5 failed, 21 held of 744.
    verdict = soak_verdict(_outcomes(succeeded=718, failed=5, held=21), repeated=0, slow=[])
    assert not verdict.met
    assert "runs failed 5" in verdict.line() and "held 21" in verdict.line()
    for states in ({"failed": 1}, {"aborted": 1}, {"rolled_back": 1}, {"held": 1}, {"unfinished": 1}):
        assert not soak_verdict(_outcomes(succeeded=10, **states), repeated=0, slow=[]).met, states
    assert not soak_verdict(_outcomes(succeeded=10), repeated=1, slow=[]).met
    assert not soak_verdict(_outcomes(succeeded=10), repeated=0, slow=["worker-kill at 60 s"]).met
    assert not soak_verdict([], repeated=0, slow=[]).met  # no run at all is not a pass


def test_a_schedule_of_kills_only_every_few_seconds():
    # The look at lost waits: 3 targets, a worker SIGKILLed every 4 s from 20 to 96 s, nothing else.
    schedule = fault_schedule(99, 20, kill_every=4, once=())
    assert [at for at, _ in schedule] == list(range(20, 97, 4))
    assert {name for _, name in schedule} == {"worker-kill"}
    from argparse import Namespace

    from soak import _schedule  # pyright: ignore[reportMissingImports]

    assert _schedule(Namespace(minutes=1.65, baseline=20, kill_every=4, kills_only=True)) == schedule
    assert _schedule(Namespace(minutes=6, baseline=60, kill_every=60, kills_only=False)) == fault_schedule(360, 60)

"""The adaptive ramp: each next step from the gates' headroom, additive increase while it holds, multiplicative
back-off near a threshold or after a failed gate; every decision kept on the step with what drove it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from tests import support
from workflows.contract import RAMP_DECISIONS_KEPT, GateReading, RampDecision, StepState
from workflows.loader import RunbookInvalid, plan_run
from workflows.ramp_policy import decide, headroom
from workflows.spec import AdaptiveSpec

_BOOK = """
    metadata: {{name: adaptive}}
    target: any
    steps:
      - id: players
        ramp:
          action: core.note
          with: {{message: "players to ${{{{ ramp.percent }}}}%"}}
          start: 10
          step: 10
          gates:
            - {{name: db-load, endpoint: "${{{{ target.telemetry.prometheus }}}}", query: 'db_load{{percent="${{{{ ramp.percent }}}}"}}',
               comparator: "<", threshold: 100, interval: 0.2s, consecutive: 2, timeout: 2s}}
          {adaptive}
"""


def _reading(value: float, comparator: str = "<", threshold: float = 100.0, offset: int = 0) -> GateReading:
    return GateReading(gate="db-load", at=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=offset), value=value,
                       passed=True, comparator=comparator, threshold=threshold)


def test_headroom_and_the_next_step():
    # Room below a `<` threshold and above a `>=` one, as a share of the threshold.
    assert headroom([_reading(40)]) == pytest.approx(0.6)
    assert headroom([_reading(0.96, ">=", 0.8)]) == pytest.approx(0.2)
    # A trend toward the threshold over the readings takes the room it would use up.
    assert headroom([_reading(20, offset=0), _reading(50, offset=10)]) == pytest.approx(0.2)
    assert headroom([GateReading(gate="g", at=datetime(2026, 1, 1, tzinfo=UTC), error="down")]) is None

    spec = AdaptiveSpec(min_step=5, max_step=30, increase=10, backoff=0.5, headroom=0.2)
    grow = decide(spec, at=10, stop=100, step=10, readings={"db-load": [_reading(10)]}, took=timedelta(seconds=30))
    assert (grow.next, grow.step) == (30, 20) and "+10" in grow.reason
    shrink = decide(spec, at=60, stop=100, step=30, readings={"db-load": [_reading(90)]}, took=timedelta(seconds=30))
    assert (shrink.next, shrink.step) == (75, 15) and "x0.5" in shrink.reason
    hold = decide(spec, at=60, stop=100, step=30, readings={"db-load": [_reading(70)]}, took=timedelta(seconds=30))
    assert (hold.next, hold.step) == (90, 30)
    capped = decide(AdaptiveSpec(max_rate=20), at=10, stop=100, step=10, readings={"db-load": [_reading(10)]},
                    took=timedelta(seconds=30))
    assert (capped.next, capped.step) == (20, 10) and "boot rate 20%/min" in capped.reason
    assert decide(spec, at=90, stop=100, step=30, readings={"db-load": [_reading(10)]}, took=timedelta(0)).next == 100


def test_a_gate_trending_past_its_threshold_holds_the_ramp():
    spec = AdaptiveSpec(min_step=5, max_step=30, increase=10, backoff=0.5, headroom=0.2)
    falling = {"hit-ratio": [_reading(0.95, ">=", 0.8, offset=0), _reading(0.85, ">=", 0.8, offset=4)]}
    # Both readings pass, but the ratio is near 0.8 and still falling: stay, read again.
    held = decide(spec, at=60, stop=100, step=30, readings=falling, took=timedelta(seconds=10), may_hold=True)
    assert (held.at, held.next, held.step) == (60, 60, 15)
    assert held.headroom["hit-ratio"] == pytest.approx(0.0625 - 2 * 0.125)  # its fall projected two bakes ahead
    assert "hit-ratio still moving toward its threshold" in held.reason and "hold at 60%" in held.reason
    # Near the threshold but steady: a smaller step, no hold; moving toward it with room to spare: no hold.
    steady = {"hit-ratio": [_reading(0.85, ">=", 0.8, offset=0), _reading(0.85, ">=", 0.8, offset=4)]}
    assert decide(spec, at=60, stop=100, step=30, readings=steady, took=timedelta(seconds=10), may_hold=True).next == 75
    roomy = {"db-load": [_reading(10, offset=0), _reading(30, offset=4)]}
    assert decide(spec, at=60, stop=100, step=30, readings=roomy, took=timedelta(seconds=10), may_hold=True).next == 90
    # Without leave to hold (a history from before holds, or holds used up): the smallest step forward.
    on = decide(spec, at=60, stop=100, step=30, readings=falling, took=timedelta(seconds=10))
    assert (on.next, on.step) == (75, 15) and "x0.5" in on.reason
    # A trend away from the threshold never holds.
    rising = {"hit-ratio": [_reading(0.85, ">=", 0.8, offset=0), _reading(0.95, ">=", 0.8, offset=4)]}
    assert decide(spec, at=60, stop=100, step=30, readings=rising, took=timedelta(seconds=10), may_hold=True).next > 60


def test_a_fall_just_begun_is_projected_past_the_next_bake():
    """What a gate reads trails what happened: a cache emptied during the bake shows only its first misses by
    the reading after it, and its hit ratio goes on falling. Projected one bake ahead (the lab's runbook, as it
    was) the ramp stepped on the full step into the fall; projected two (the default), it holds."""
    lab = AdaptiveSpec(min_step=5, max_step=30, increase=10, backoff=0.5, headroom=0.05)
    begun = {"cache-hit-ratio": [_reading(0.99, ">=", 0.8, offset=0), _reading(0.93, ">=", 0.8, offset=4)]}
    one_bake = decide(lab.model_copy(update={"lookahead": 1.0}), at=60, stop=100, step=30, readings=begun,
                      took=timedelta(seconds=9), may_hold=True)
    assert (one_bake.next, one_bake.step) == (90, 30) and "same step 30" in one_bake.reason
    held = decide(lab, at=60, stop=100, step=30, readings=begun, took=timedelta(seconds=9), may_hold=True)
    assert (held.next, held.step) == (60, 15) and "hold at 60%" in held.reason
    assert held.headroom["cache-hit-ratio"] == pytest.approx(0.1625 - 2 * 0.075)
    # A gate steady over the bake is where it was, whatever the lookahead.
    steady = {"cache-hit-ratio": [_reading(0.93, ">=", 0.8, offset=0), _reading(0.93, ">=", 0.8, offset=4)]}
    assert decide(lab.model_copy(update={"lookahead": 5.0}), at=60, stop=100, step=30, readings=steady,
                  took=timedelta(seconds=9), may_hold=True).next == 90


async def test_the_ramp_holds_while_a_gate_trends_toward_its_threshold(env, task_queue, tmp_path):
    prom = await support.ScriptedPrometheus().start()
    prom.default = 10.0
    # At 30 %: 10 as the bake starts, then the gate's two readings pass but climb fast (20, 70). Held: 75, then
    # 120 after the bake, which fails, so the gate is waited for (90, 90). Held again: flat at 90, little room:
    # the smallest step.
    prom.script('db_load{percent="30"}', 10, 20, 70, 75, 120, 90, 90, 90, 90)
    [players] = (await _ramp_run(env, task_queue, tmp_path, prom)).steps
    said = [(d.at, d.next, d.step) for d in players.ramp_decisions]
    assert said == [(10, 30, 20), (30, 30, 10), (30, 30, 5), (30, 35, 5), (35, 50, 15), (50, 75, 25),
                    (75, 100, 30)], said
    assert "hold at 30%" in players.ramp_decisions[1].reason and "hold at 30%" in players.ramp_decisions[2].reason
    assert players.ramp_decisions[2].headroom == {"db-load": pytest.approx(-0.2 - 2 * 0.45)}
    assert players.ramp_decisions[3].headroom == {"db-load": pytest.approx(0.1)}
    assert players.status == "succeeded" and players.percent == 100
    at_30 = [r.value for r in players.readings if r.percent == 30]
    assert at_30[-8:] == [20, 70, 75, 120, 90, 90, 90, 90], at_30  # the failing end of the hold was waited out


async def test_a_gate_read_once_after_the_bake_still_shows_its_move_over_the_bake(env, task_queue, tmp_path):
    """The lab's gates read once after the bake (consecutive 1): the reading as the bake starts is what shows a
    gate falling toward its threshold, as a cache emptied mid-ramp pulls its hit ratio down."""
    prom = await support.ScriptedPrometheus().start()
    prom.default = 10.0
    # At 30 %: 10 as the bake starts, 70 after it (room 0.3, but 0.6 of it gone over one bake): hold. Read
    # again: 75 and 75 after the bake, steady with room 0.25: on, at the step the hold halved.
    prom.script('db_load{percent="30"}', 10, 70, 75, 75)
    [players] = (await _ramp_run(env, task_queue, tmp_path, prom, consecutive=1)).steps
    said = [(d.at, d.next, d.step) for d in players.ramp_decisions]
    assert said[:3] == [(10, 30, 20), (30, 30, 10), (30, 40, 10)], said
    assert players.ramp_decisions[1].headroom == {"db-load": pytest.approx(0.3 - 2 * 0.6)}
    assert "hold at 30%" in players.ramp_decisions[1].reason
    # Each percentage is read as its bake starts and once after it; at 30 % twice more, for the hold.
    assert [r.value for r in players.readings if r.percent == 30] == [10, 70, 75, 75]
    assert players.status == "succeeded" and players.percent == 100


def test_a_long_ramp_keeps_its_last_decisions():
    # A ramp holding for hours decides every bake: the step keeps the recent decisions, not all of them.
    players = StepState(id="players", kind="ramp")
    for n in range(RAMP_DECISIONS_KEPT + 20):
        players.add_ramp_decision(RampDecision(at=30, next=30, step=5, reason=f"hold at 30% ({n})"))
    assert len(players.ramp_decisions) == RAMP_DECISIONS_KEPT == 50
    assert [d.reason for d in players.ramp_decisions[::RAMP_DECISIONS_KEPT - 1]] == ["hold at 30% (20)",
                                                                                    "hold at 30% (69)"]


def test_an_adaptive_ramp_is_checked(tmp_path):
    book = support.write_runbook(tmp_path, _BOOK.format(adaptive="adaptive: {min_step: 40, max_step: 20}"))
    with pytest.raises(RunbookInvalid) as refused:
        plan_run(book, registry=support.registry(), inventory={"name": "any", "telemetry": {"prometheus": "http://p"}})
    assert any("min_step is above max_step" in line for line in refused.value.errors), refused.value.errors


async def test_the_ramp_grows_while_there_is_room_and_backs_off_when_a_gate_fails(env, task_queue, tmp_path):
    prom = await support.ScriptedPrometheus().start()
    prom.default = 10.0  # plenty of room under 100 ...
    prom.script('db_load{percent="60"}', 150)  # ... but 60 % overloads the database ...
    prom.script('db_load{percent="45"}', 85)  # ... and 45 % leaves little room
    [players] = (await _ramp_run(env, task_queue, tmp_path, prom)).steps
    said = [(d.at, d.next, d.step) for d in players.ramp_decisions]
    # 10 -> 30 (+10: step 20) -> 60 (+10: step 30); 60 fails: back to 30, step 15 -> 45; little room at 45:
    # step 7 -> 52; room again: 17 -> 69, 27 -> 96, then the rest.
    assert said == [(10, 30, 20), (30, 60, 30), (60, 45, 15), (45, 52, 7), (52, 69, 17), (69, 96, 27),
                    (96, 100, 30)], said
    assert players.percent == 100 and players.last_good == 100 and players.status == "succeeded"
    assert "a gate failed at 60%: back to 30%" in players.ramp_decisions[2].reason
    assert players.ramp_decisions[3].headroom == {"db-load": pytest.approx(0.15)}
    # Eight percentages set instead of the fixed ramp's ten, one of them refused and stepped back from.
    set_to = [r.percent for r in players.readings if r.passed]
    assert sorted(set(set_to)) == [10, 30, 45, 52, 69, 96, 100], set_to


async def test_the_timeline_explains_each_step(env, task_queue, tmp_path):
    from tests.test_cli import acli

    prom = await support.ScriptedPrometheus().start()
    prom.default = 10.0
    book = support.write_runbook(tmp_path, _BOOK.format(adaptive="adaptive: {max_step: 50, increase: 40}"))
    target = f"ramp-{task_queue[-8:]}"
    try:
        async with support.worker(env.client, task_queue):
            handle = await support.start(env.client, book, task_queue,
                                         target={"name": target, "telemetry": {"prometheus": prom.url}})
            await handle.result()
    finally:
        await prom.stop()
    told = await acli({"TEMPORAL_ADDRESS": env.client.service_client.config.target_host}, "timeline", target,
                      "--format", "json")
    assert told.returncode == 0, told.stderr
    decisions = [(e["outcome"], e["detail"]) for e in json.loads(told.stdout)["entries"]
                 if e["event"] == "ramp decision"]
    assert [d[0] for d in decisions] == ["10% -> 60%", "60% -> 100%"], decisions
    assert decisions[0][1].startswith("headroom 0.90 at least 0.4: step 10 -> 50"), decisions


async def _ramp_run(env, task_queue, tmp_path, prom, consecutive: int = 2):
    """The adaptive ramp (min 5, max 30, +10, x0.5, headroom 0.2) against the scripted Prometheus, to its end."""
    book = support.write_runbook(tmp_path, _BOOK.format(
        adaptive="adaptive: {min_step: 5, max_step: 30, increase: 10, backoff: 0.5, headroom: 0.2}",
    ).replace("consecutive: 2", f"consecutive: {consecutive}"))
    inventory = {"name": f"ramp-{task_queue[-8:]}", "telemetry": {"prometheus": prom.url}}
    try:
        async with support.worker(env.client, task_queue):
            handle = await support.start(env.client, book, task_queue, target=inventory)
            await handle.result()
            return await support.status(handle)
    finally:
        await prom.stop()

"""Each bench's verdict from its records: a failing record (a failed run, a missing series, a payload warning,
a median over the goal) gives NOT met, a passing one gives met."""

from __future__ import annotations

from bench._verdict import Goal, Verdict, alternated, at_most, median, no_more_than, under
from bench.cli_start import GOAL_MS, start_verdict
from bench.fanout import Round, fanout_verdict
from bench.ramp import Result, cold_verdict, herd_verdict
from bench.runbook_cases import GOAL_RUNBOOK, cases_verdict


# ---- the shared helper ---------------------------------------------------------------------------
def test_a_verdict_is_met_only_with_every_goal_met_and_no_failure():
    assert Verdict([Goal("fast", True)], {"runs failed": 0}).met
    assert not Verdict([Goal("fast", True)], {"runs failed": 1}).met
    assert not Verdict([Goal("fast", True), Goal("small", False)]).met
    assert not Verdict([]).met  # nothing judged is not a pass


def test_the_line_says_met_or_not_and_carries_the_counts():
    assert Verdict([Goal("fast", True, "1 s")], {"runs failed": 0}).line() == "goal met: fast: yes (1 s); runs failed 0"
    line = Verdict([Goal("fast", True)], {"runs failed": 2}).line()
    assert line.startswith("goal NOT met:") and "runs failed 2" in line


def test_a_missing_figure_is_no_data_and_not_met():
    assert median([]) is None and median([None, None]) is None
    assert median([3.0, None, 1.0, 2.0]) == 2.0
    for goal in (under("t", None, 10), at_most("t", None, 10), no_more_than("t", None, 5.0),
                 no_more_than("t", 5.0, None)):
        assert not goal.met and "no data" in goal.figure
    assert under("t", 9.9, 10).met and not under("t", 10.0, 10).met
    assert at_most("t", 10.0, 10).met and not at_most("t", 10.1, 10).met
    assert no_more_than("t", 5.0, 5.0).met and not no_more_than("t", 5.1, 5.0).met


def test_the_order_is_reversed_every_other_round():
    assert [alternated(["fixed", "adaptive"], r) for r in range(3)] == [
        ["fixed", "adaptive"], ["adaptive", "fixed"], ["fixed", "adaptive"]]


# ---- bench/ramp.py ---------------------------------------------------------------------------------
def _ramp(name: str, seconds: float | None, peak: float | None, outcome: str = "succeeded", **kw) -> Result:
    return Result(name=name, outcome=outcome, seconds=seconds, peak_db_qps=peak, **kw)


def _pair(fixed: tuple, adaptive: tuple) -> tuple[list[Result], list[Result]]:
    return ([_ramp("fixed", s, p) for s, p in fixed], [_ramp("adaptive", s, p) for s, p in adaptive])


def test_ramp_met_on_medians_half_the_time_and_no_higher_load():
    fixed, adaptive = _pair(((100, 50), (120, 55), (110, 52)), ((50, 40), (70, 60), (45, 41)))
    assert cold_verdict(fixed, adaptive).met  # medians 45 <= 110/2 and 41 <= 52, though one round is slower


def test_ramp_a_median_over_the_goal_is_not_met():
    fixed, adaptive = _pair(((100, 50), (100, 50), (100, 50)), ((40, 40), (60, 40), (60, 40)))
    assert not cold_verdict(fixed, adaptive).met


def test_ramp_a_missing_series_is_not_no_higher():
    # No database series for the adaptive ramp: it used to read as 0 q/s, lower than anything.
    fixed, adaptive = _pair(((100, 50),), ((40, None),))
    verdict = cold_verdict(fixed, adaptive)
    assert not verdict.met and "no data" in verdict.line()
    fixed, adaptive = _pair(((100, None),), ((40, 30),))
    assert not cold_verdict(fixed, adaptive).met
    # one round of three without its series: the median of the other two would pass, the verdict does not
    fixed, adaptive = _pair(((100, 50), (100, 50), (100, 50)), ((40, 40), (40, None), (40, 40)))
    assert not cold_verdict(fixed, adaptive).met


def test_ramp_a_failed_ramp_or_a_failed_health_reading_is_not_met():
    fixed, adaptive = _pair(((100, 50), (100, 50), (100, 50)), ((40, 40), (40, 40), (40, 40)))
    assert cold_verdict(fixed, adaptive).met
    assert not cold_verdict([*fixed, _ramp("fixed", None, None, outcome="aborted")], adaptive).met
    adaptive[1].health_failed.append(("error-rate", 60))
    assert not cold_verdict(fixed, adaptive).met
    assert not cold_verdict(fixed, []).met  # only one side ran: no comparison


def _herd(name: str, stepped: list[int], peak: float | None = 50, flushed: int | None = 60,
          outcome: str = "succeeded") -> Result:
    return _ramp(name, 100, peak, outcome=outcome, stepped_into=stepped, flushed_at=flushed)


def test_herd_met_when_fixed_steps_into_a_failing_gate_and_adaptive_never():
    fixed = [_herd("fixed +flush", [70]), _herd("fixed +flush", [70, 80]), _herd("fixed +flush", [])]
    adaptive = [_herd("adaptive +flush", [], peak=40) for _ in range(3)]
    assert herd_verdict(fixed, adaptive).met


def test_herd_not_met_on_a_failing_record():
    fixed = [_herd("fixed +flush", [70]) for _ in range(3)]
    adaptive = [_herd("adaptive +flush", [], peak=40) for _ in range(3)]
    assert herd_verdict(fixed, adaptive).met
    # adaptive stepped into a failing gate once
    assert not herd_verdict(fixed, [*adaptive[:2], _herd("adaptive +flush", [80], peak=40)]).met
    # a missing series, in one round or in all
    assert not herd_verdict(fixed, [*adaptive[:2], _herd("adaptive +flush", [], peak=None)]).met
    assert not herd_verdict(fixed, [_herd("adaptive +flush", [], peak=None) for _ in range(3)]).met
    # flushed at different percentages: not comparable
    assert not herd_verdict(fixed, [_herd("adaptive +flush", [], peak=40, flushed=70) for _ in range(3)]).met
    # an adaptive ramp that did not succeed
    assert not herd_verdict(fixed, [*adaptive[:2], _herd("adaptive +flush", [], peak=40, outcome="aborted")]).met
    # fixed did not step into a failing gate: the herd was not provoked
    assert not herd_verdict([_herd("fixed +flush", []) for _ in range(3)], adaptive).met


# ---- bench/fanout.py -------------------------------------------------------------------------------
def test_fanout_met_on_the_median_with_no_warning_and_no_failed_run():
    assert fanout_verdict([Round(12.0), Round(25.0), Round(15.0)], 1000).met  # median 15 s < 20 s
    assert fanout_verdict([Round(150.0)], 10_000).met  # 10,000 within 10x of 20 s


def test_fanout_not_met_on_a_payload_warning_a_failed_run_or_a_slow_median():
    assert not fanout_verdict([Round(12.0), Round(12.0, payload_warnings=1), Round(12.0)], 1000).met
    assert not fanout_verdict([Round(12.0), Round(None, failed="WorkflowFailureError: x"), Round(12.0)], 1000).met
    assert not fanout_verdict([Round(12.0), Round(21.0), Round(22.0)], 1000).met
    assert not fanout_verdict([Round(None, failed="x")], 1000).met
    assert not fanout_verdict([], 1000).met


# ---- bench/runbook_cases.py and bench/cli_start.py -------------------------------------------------
def test_runbook_cases_judged_on_the_median_not_one_fast_run():
    assert cases_verdict({GOAL_RUNBOOK: [9.0, 9.5, 12.0], "runbooks/demo.yaml": [6.0]}).met
    assert not cases_verdict({GOAL_RUNBOOK: [4.7, 10.9, 12.0]}).met  # one fast run does not meet it
    assert not cases_verdict({GOAL_RUNBOOK: [9.0, 9.0, 9.0], "runbooks/demo.yaml": [6.0, None]}).met
    assert not cases_verdict({"runbooks/demo.yaml": [6.0]}).met  # the goal runbook never ran


def test_cli_start_judged_on_medians_with_failed_runs_counted():
    ok = {"python -c pass": [30.0], "coldstart --help": [200.0, 250.0], "coldstart validate x": [280.0, 290.0]}
    assert start_verdict(ok).met
    assert not start_verdict({**ok, "coldstart --help": [200.0, None, 250.0]}).met
    assert not start_verdict({**ok, "coldstart validate x": [280.0, GOAL_MS, 400.0]}).met
    assert not start_verdict({**ok, "coldstart --help": [None, None]}).met


def test_ramp_verdicts_group_the_rounds_by_variant():
    from bench.ramp import _verdict  # pyright: ignore[reportPrivateUsage]

    rounds = [_ramp("fixed", 100, 50), _ramp("adaptive", 40, 40), _ramp("adaptive", 45, 41), _ramp("fixed", 110, 52),
              _herd("fixed +flush", [70]), _herd("adaptive +flush", [], peak=40)]
    verdicts = dict(_verdict(rounds))
    assert [v.met for v in verdicts.values()] == [True, True]
    assert "medians over 2 rounds" in next(iter(verdicts))
    # the adaptive ramp never ran: NOT met, not left out
    verdicts = dict(_verdict([_ramp("fixed", 100, 50)]))
    assert [v.met for v in verdicts.values()] == [False]


def test_the_samples_table_counts_failed_runs_beside_the_figures():
    from bench._verdict import samples_table

    header, ok, failed = samples_table({"a": [1.0, 3.0, 2.0], "b": [None]}, "what", "s", 2)
    assert header.split() == ["what", "median", "s", "min", "max", "failed"]
    assert ok.split() == ["a", "2.00", "1.00", "3.00", "0"]
    assert failed.split() == ["b", "-", "-", "-", "1"]

"""The action journal's checker tells repeats from retries; writing it never fails an action."""

from __future__ import annotations

import os

from activities.journal import ActionJournal, check_journal, read_journal, repeated_steps


def _attempt(activity_id, outcome="ok", attempt=1, kind="dns.steer.set", mutating=True, run="r1", worker="1@h",
             chain=None, after=None, at=None):
    base = {"workflow_id": "coldstart-lab", "run_id": run, "activity_id": activity_id, "activity_type": kind,
            "attempt": attempt, "mutating": mutating, "worker": worker, "started_at": at or f"t{attempt}"}
    base |= {k: v for k, v in (("chain", chain), ("after", after)) if v}
    lines = [{"event": "started", **base}]
    if outcome is not None:
        lines.append({"event": "ended", **base, "ended_at": "t", "outcome": outcome})
    return lines


def test_clean_run_has_no_repeats():
    entries = [*_attempt("open#1", kind="core.note"), *_attempt("players@20#2"),
               *_attempt("players/gate/g#3", kind="telemetry.read", mutating=False),
               *_attempt("players/gate/g#4", kind="telemetry.read", mutating=False), *_attempt("players@40#5")]
    assert repeated_steps(entries) == []


def test_interrupted_attempt_then_retry_is_not_a_repeat():
    entries = [*_attempt("flags[3]#1", outcome=None, worker="1@h"),
               *_attempt("flags[3]#1", attempt=2, worker="2@h")]
    check = check_journal(entries)
    assert check.repeated == [] and check.interrupted_retried == [("flags[3]#1", 1, 2, "ok")]


def test_completed_twice_is_a_repeat():
    entries = [*_attempt("close#9"), *_attempt("close#9", attempt=2)]
    assert [r.why for r in repeated_steps(entries)] == ["completed ok 2 times (attempts 1, 2)"]


def test_label_scheduled_again_after_success_is_a_repeat_unless_explained():
    # A step re-run after it had completed, with nothing in the workflow's record to explain it.
    assert [r.label for r in repeated_steps([*_attempt("open#1"), *_attempt("open#7")])] == ["open"]
    # Retried after the first one failed (activity RetryPolicy exhausted, then an operator retry): fine.
    failed = [*_attempt("players@40#5", outcome="failed"), *_attempt("players@40#6")]
    assert repeated_steps(failed) == []
    # A ramp stepping back after a failed gate (the workflow records it: `after: gate-failed`), then going
    # forward again after the retry: fine.
    ramp = [*_attempt("players@20#2"), *_attempt("players@40#3"), *_attempt("players@20#9", after="gate-failed"),
            *_attempt("players@40#12")]
    check = check_journal(ramp)
    assert check.repeated == []
    assert {why for _, _, why in check.rescheduled} == {"ramp step-back after a failed gate",
                                                        "ramp forward again after a step-back"}
    # The same lower percentage with no failed gate on record is a repeat, however it looks.
    unexplained = [*_attempt("players@20#2"), *_attempt("players@40#3"), *_attempt("players@20#9")]
    assert [r.activity_ids for r in repeated_steps(unexplained)] == [["players@20#2", "players@20#9"]]


def test_a_step_repeated_across_continue_as_new_is_a_repeat_but_another_execution_is_not():
    # Two runs of one chain (continue-as-new: each run numbers its activities from 1 again).
    chained = [*_attempt("open#1", run="r1", chain="r1", at="t1"), *_attempt("open#1", run="r2", chain="r1", at="t2")]
    [repeat] = repeated_steps(chained)
    assert repeat.label == "open" and repeat.why == "scheduled again after open#1 completed ok in an earlier run of its chain"
    # Another execution on the target (a chain of its own), or lines without a chain: not repeats.
    assert repeated_steps([*_attempt("open#1", run="r1", chain="r1"), *_attempt("open#1", run="r2", chain="r2")]) == []
    assert repeated_steps([*_attempt("open#1"), *_attempt("open#1", run="r2")]) == []


def test_journal_write_never_raises_and_counts_drops(tmp_path):
    path = tmp_path / "j.jsonl"
    journal = ActionJournal(path, mutating={"a": True})
    assert journal.write({"event": "started", "activity_id": "x#1"})
    assert read_journal(path)[0]["activity_id"] == "x#1"
    journal.close()
    counted: list[str] = []
    blocked = ActionJournal(tmp_path / "missing" / "dir-is-a-file" / "j.jsonl", on_drop=lambda: counted.append("x"))
    (tmp_path / "missing").write_text("a file where a directory should be")
    assert not blocked.write({"event": "started", "activity_id": "x#1"})
    assert not blocked.write({"event": "ended", "activity_id": "x#1"})
    assert blocked.dropped == 2 and blocked.written == 0
    assert counted == ["x", "x"]  # what the worker exports as coldstart_journal_lines_dropped_total
    if os.geteuid() != 0:  # root ignores file modes
        path.chmod(0o400)
        assert not ActionJournal(path).write({"activity_id": "y#1"})


async def test_a_real_runs_lines_carry_its_chain(env, task_queue, tmp_path):
    """What the checker groups by comes from the workflow itself: every line names the first run id of its chain."""
    from tests import support

    journal, out = tmp_path / "journal.jsonl", tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: chained}}
        target: t
        steps:
          - id: a
            action: test.append
            with: {{path: "{out}", label: a}}
          - id: b
            action: test.append
            with: {{path: "{out}", label: b}}
    """)
    async with support.worker(env.client, task_queue, journal=str(journal)):
        handle = await support.start(env.client, book, task_queue)
        await handle.result()
    described = await handle.describe()
    lines = [e for e in read_journal(journal) if e["activity_type"] == "test.append"]
    assert len(lines) == 4 and {e["chain"] for e in lines} == {described.run_id}
    assert check_journal(lines).repeated == []

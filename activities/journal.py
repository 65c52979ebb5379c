"""The action journal: one JSON line when an activity attempt starts and one when it ends, written by
a worker interceptor, so "did anything run twice?" can be answered from what the workers did.

Temporal's history records the attempt that completed an activity, not every attempt a worker ran:
an attempt on a worker that was SIGKILLed, or a completion the server never received (so the
activity timed out and ran again), leaves no trace there. The journal is the worker-side record.

    python worker.py --journal /var/log/coldstart/actions.jsonl    # or COLDSTART_ACTION_JOURNAL

Lines (`event` "started" or "ended"; an attempt is the pair with the same workflow_id, run_id,
activity_id and attempt):

    {"event": "started", "workflow_id": ..., "run_id": ..., "activity_id": "players@40#12",
     "activity_type": "dns.steer.set", "attempt": 1, "mutating": true, "worker": "4242@host",
     "task_queue": ..., "started_at": "2025-...Z"}
    {"event": "ended", ... the same keys ..., "ended_at": ..., "outcome": "ok" | "failed" | "cancelled",
     "error": "first 300 characters of the message"}

The start line is written before the action runs: a worker killed mid-action leaves a start without
an end. Each line is a single write() on an O_APPEND descriptor (several workers may share a file).
The journal never blocks or fails an activity: a line that cannot be written is counted
(`ActionJournal.dropped`) and logged, and the action goes on. Arguments and results are not
written (they may be large; secrets never travel in them, but the journal need not be trusted
with them either).

`check_journal` reads a journal back and tells repeats (a step that ran twice) from retries.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import re
import socket
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

__all__ = [
    "ActionJournal",
    "Attempt",
    "JournalCheck",
    "JournalInterceptor",
    "Repeat",
    "check_journal",
    "read_journal",
    "repeated_steps",
]

log = logging.getLogger("coldstart.journal")

# Activity ids as RunbookWorkflow builds them: `<label>#<seq>` (seq counts every activity of the run:
# actions `step#7`, ramp sets `step@40#9`, gate reads `step/gate/name#8`, undo `undo:step#12`) and
# fan-out items `<step>[<index>]#<step attempt>`.
_FAN_OUT_ID = re.compile(r"^(?P<label>.+\[\d+\])#(?P<n>\d+)$")
_SEQ_ID = re.compile(r"^(?P<label>.+)#(?P<n>\d+)$")
_RAMP_LABEL = re.compile(r"^(?P<step>[^/@\[]+)@(?P<percent>\d+)$")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class ActionJournal:
    """An append-only JSON-lines file; `write` never raises."""

    def __init__(self, path: str | os.PathLike[str], *, mutating: Mapping[str, bool] | None = None,
                 on_drop: Callable[[], None] | None = None):
        """on_drop: called once per dropped line (the worker counts them on its metrics endpoint)."""
        self.path = Path(path)
        self.mutating = dict(mutating or {})
        self.worker = f"{os.getpid()}@{socket.gethostname()}"
        self.written = 0
        self.dropped = 0
        self._on_drop = on_drop
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._warned = 0

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        return self._fd

    def write(self, record: dict[str, Any]) -> bool:
        try:
            line = (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode()
            with self._lock:
                fd = self._open()
                written = os.write(fd, line)
                if written != len(line):
                    raise OSError(f"short write ({written} of {len(line)} bytes)")
                self.written += 1
            return True
        except Exception as exc:  # noqa: BLE001 - the journal must never fail an action
            dropped = self.count_drop()
            with self._lock:
                if self._fd is not None:  # a broken descriptor (file removed, disk gone): reopen next time
                    try:
                        os.close(self._fd)
                    except OSError:
                        pass
                    self._fd = None
            # 1, 2, 4, 8, ... : a full disk must not flood the log either.
            if dropped & (dropped - 1) == 0:
                log.warning("action journal %s: line dropped (%s: %s); %d dropped so far",
                            self.path, type(exc).__name__, exc, dropped)
            return False

    def count_drop(self) -> int:
        """One line lost; returns how many so far."""
        with self._lock:
            self.dropped += 1
            dropped = self.dropped
        if self._on_drop is not None:
            with contextlib.suppress(Exception):  # counting must not fail an action either
                self._on_drop()
        return dropped

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                try:
                    os.close(self._fd)
                except OSError:
                    pass
                self._fd = None


class JournalInterceptor(Interceptor):
    """Worker interceptor: `Worker(..., interceptors=[JournalInterceptor(journal)])`."""

    def __init__(self, journal: ActionJournal):
        self.journal = journal

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _JournalInbound(next, self.journal)


class _JournalInbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, journal: ActionJournal):
        super().__init__(next)
        self.journal = journal

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        if activity.info().activity_type not in self.journal.mutating:
            # Not an action (the run's resolution against the catalog): its history is its record.
            return await super().execute_activity(input)
        base: dict[str, Any] = {}
        try:
            info = activity.info()
            base = {
                "workflow_id": info.workflow_id,
                "run_id": info.workflow_run_id,
                "activity_id": info.activity_id,
                "activity_type": info.activity_type,
                "attempt": info.attempt,
                "mutating": self.journal.mutating.get(info.activity_type),
                "worker": self.journal.worker,
                "task_queue": info.task_queue,
                "started_at": _now(),
                **_from_headers(input.headers),
            }
            self.journal.write({"event": "started", **base})
        except Exception:  # noqa: BLE001 - never in the action's way
            self.journal.count_drop()
        outcome, error = "ok", None
        try:
            return await super().execute_activity(input)
        except BaseException as exc:
            outcome = "cancelled" if _is_cancel(exc) else "failed"
            error = str(exc)[:300]
            raise
        finally:
            if base:
                self.journal.write({"event": "ended", **base, "ended_at": _now(), "outcome": outcome,
                                    **({"error": error} if error else {})})


# The workflow's headers on each activity (workflows/history_tags.py), read here by name: the chain's first
# run id, and the step tag with the reason the workflow scheduled it again, if it records one.
_CHAIN_HEADER, _TAG_HEADER = "coldstart-chain", "coldstart-step"


def _from_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    from temporalio.converter import PayloadConverter

    found: dict[str, Any] = {}
    with contextlib.suppress(Exception):  # a header it cannot read leaves the line without it
        if _CHAIN_HEADER in headers:
            found["chain"] = PayloadConverter.default.from_payload(headers[_CHAIN_HEADER])
        if _TAG_HEADER in headers:
            tag = PayloadConverter.default.from_payload(headers[_TAG_HEADER])
            if isinstance(tag, dict) and tag.get("after"):
                found["after"] = str(tag["after"])
    return found


def _is_cancel(exc: BaseException) -> bool:
    import asyncio

    from temporalio.exceptions import CancelledError

    return isinstance(exc, (asyncio.CancelledError, CancelledError))


# ---- reading it back -------------------------------------------------------------------------------


def read_journal(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every line that parses (a line torn by a crash mid-write is skipped)."""
    entries = []
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("activity_id"):
            entries.append(entry)
    return entries


@dataclass
class Attempt:
    workflow_id: str
    run_id: str
    activity_id: str
    activity_type: str
    attempt: int
    mutating: bool | None
    worker: str
    started_at: str | None = None
    ended_at: str | None = None
    outcome: str | None = None  # None: started, never ended (the worker died, or it is still running)
    error: str | None = None
    chain: str | None = None  # the first run id of the run's continue-as-new chain
    after: str | None = None  # why the workflow scheduled it again ("gate-failed": a ramp's step-back)


@dataclass
class Repeat:
    """A step that ran twice: the activity ids involved and why it counts as a repeat."""

    workflow_id: str
    run_id: str
    label: str
    activity_ids: list[str]
    why: str

    def __str__(self) -> str:
        return f"{self.label} ({', '.join(self.activity_ids)}): {self.why}"


@dataclass
class JournalCheck:
    attempts: list[Attempt]
    repeated: list[Repeat] = field(default_factory=list)
    # Same activity id, an attempt that never ended (killed worker), then another attempt: allowed,
    # actions are idempotent. (activity_id, interrupted attempt, the attempt that finished it, its outcome)
    interrupted_retried: list[tuple[str, int, int, str | None]] = field(default_factory=list)
    # Same activity id run again after a failed attempt (the activity RetryPolicy): allowed.
    retried_after_failure: list[tuple[str, int]] = field(default_factory=list)  # (activity_id, attempts)
    # A step label scheduled again for a reason the workflow records: allowed.
    rescheduled: list[tuple[str, str, str]] = field(default_factory=list)  # (label, activity_id, why)
    unfinished: list[Attempt] = field(default_factory=list)  # started, no end, no later attempt

    def summary(self) -> str:
        parts = [f"{len(self.attempts)} attempts", f"{len(self.repeated)} repeated"]
        if self.interrupted_retried:
            parts.append(f"{len(self.interrupted_retried)} interrupted and retried")
        if self.retried_after_failure:
            parts.append(f"{len(self.retried_after_failure)} retried after failure")
        if self.rescheduled:
            parts.append(f"{len(self.rescheduled)} rescheduled by the workflow (" +
                         ", ".join(sorted({why for _, _, why in self.rescheduled})) + ")")
        if self.unfinished:
            parts.append(f"{len(self.unfinished)} unfinished")
        return "; ".join(parts)


def _split_id(activity_id: str) -> tuple[str, int, bool]:
    """(label, number, is_fan_out): the number is the run's sequence, or the step attempt for fan-out items."""
    match = _FAN_OUT_ID.match(activity_id)
    if match:
        return match["label"], int(match["n"]), True
    match = _SEQ_ID.match(activity_id)
    if match:
        return match["label"], int(match["n"]), False
    return activity_id, 0, False


def _attempts(entries: Iterable[Mapping[str, Any]]) -> list[Attempt]:
    by_key: dict[tuple[str, str, str, int, str], Attempt] = {}
    for entry in entries:
        key = (entry.get("workflow_id", ""), entry.get("run_id", ""), entry["activity_id"],
               int(entry.get("attempt") or 0), entry.get("worker", ""))
        attempt = by_key.get(key)
        if attempt is None:
            attempt = by_key[key] = Attempt(
                workflow_id=key[0], run_id=key[1], activity_id=key[2], activity_type=entry.get("activity_type", ""),
                attempt=key[3], mutating=entry.get("mutating"), worker=key[4], chain=entry.get("chain"),
                after=entry.get("after"))
        attempt.started_at = attempt.started_at or entry.get("started_at")
        if entry.get("event") == "ended":
            attempt.ended_at = entry.get("ended_at")
            attempt.outcome = entry.get("outcome")
            attempt.error = entry.get("error")
    return sorted(by_key.values(), key=lambda a: (a.started_at or "", a.attempt))


def check_journal(entries: Iterable[Mapping[str, Any]]) -> JournalCheck:
    """Tell repeats from retries, per workflow run.

    Repeated (a step ran twice):
    - one activity id completed ok more than once (at-least-once delivery bit: the completion was
      lost and the server ran it again);
    - a mutating step label (the activity id without its `#n`) scheduled again after an activity of
      that label completed ok, unless the workflow had a reason it records: the earlier activity
      failed (an operator retry or the step's retry re-runs it), a ramp stepping back to its last
      good percentage after a failed gate (a set to a lower percentage than the ramp's previous
      set), the ramp going forward again after such a step-back, or a fan-out item re-run in a new
      attempt of a fan-out step whose earlier attempt had failed items.

    Allowed and reported: an attempt that started and never ended (worker killed) followed by another
    attempt of the same activity id; attempts after a failed attempt (the activity RetryPolicy).
    Read-only actions (gate readings, reads) repeat by design and are not checked by label.
    A step-back counts only where the workflow recorded one (its `after: gate-failed` header, journaled
    as `after`), never from the percentages alone. Labels are checked across a continue-as-new chain
    (its first run id, journaled as `chain`), its runs in order; lines without a chain, per run.
    """
    attempts = _attempts(entries)
    result = JournalCheck(attempts=attempts)
    by_id: dict[tuple[str, str, str], list[Attempt]] = defaultdict(list)
    for a in attempts:
        by_id[(a.workflow_id, a.run_id, a.activity_id)].append(a)

    for (wf, run, activity_id), tries in by_id.items():
        tries.sort(key=lambda a: (a.attempt, a.started_at or ""))
        oks = [a for a in tries if a.outcome == "ok"]
        if len(oks) > 1:
            result.repeated.append(Repeat(wf, run, _split_id(activity_id)[0], [activity_id],
                                          f"completed ok {len(oks)} times (attempts {', '.join(str(a.attempt) for a in oks)})"))
        for i, a in enumerate(tries):
            if a.outcome is None:
                later = tries[i + 1:]
                if later:
                    result.interrupted_retried.append((activity_id, a.attempt, later[-1].attempt, later[-1].outcome))
                else:
                    result.unfinished.append(a)
        if any(a.outcome == "failed" for a in tries[:-1]):
            result.retried_after_failure.append((activity_id, len(tries)))

    # Label level: group the distinct activity ids of each continue-as-new chain (else each run) by label, in
    # the chain's order: its runs by their first attempt, then each run's own sequence.
    chains: dict[tuple[str, str], dict[tuple[int, str], list[Attempt]]] = defaultdict(dict)
    first_seen: dict[tuple[str, str], str] = {}
    for (wf, run, _), tries in by_id.items():
        start = min((a.started_at or "" for a in tries), default="")
        first_seen[(wf, run)] = min(first_seen.get((wf, run), start), start)
    for (wf, run, activity_id), tries in by_id.items():
        chain = next((a.chain for a in tries if a.chain), None) or run
        chains[(wf, chain)][(0, f"{first_seen[(wf, run)]}\x00{run}\x00{activity_id}")] = tries
    for (wf, _), keyed in chains.items():
        # Runs in order of their first attempt; within a run, the workflow's own sequence number.
        runs_in_order = sorted({(first_seen[(wf, tries[0].run_id)], tries[0].run_id) for tries in keyed.values()})
        run_index = {run: i for i, (_, run) in enumerate(runs_in_order)}
        ids = {(run_index[tries[0].run_id], tries[0].activity_id): tries for tries in keyed.values()}
        outcome = {key: ("ok" if any(a.outcome == "ok" for a in tries) else "not ok") for key, tries in ids.items()}
        mutating = {key: tries[0].mutating is not False for key, tries in ids.items()}
        stepped_back = {key for key, tries in ids.items() if any(a.after == "gate-failed" for a in tries)}
        # Ramp sets in the chain's order, per ramp step: which of them the workflow recorded as a step-back.
        ramp_sets: dict[str, list[tuple[tuple[int, int], int, tuple[int, str]]]] = defaultdict(list)
        fan_out_failed: set[tuple[str, int, int]] = set()  # (step, run index, step attempt) with a failed item
        labels: dict[str, list[tuple[tuple[int, int], tuple[int, str], bool]]] = defaultdict(list)
        for key in ids:
            label, n, fan_out = _split_id(key[1])
            order = (key[0], n)
            if fan_out and outcome[key] != "ok":
                fan_out_failed.add((label.split("[", 1)[0], key[0], n))
            ramp = _RAMP_LABEL.match(label)
            if ramp and not fan_out:
                ramp_sets[ramp["step"]].append((order, int(ramp["percent"]), key))
            if mutating[key]:
                labels[label].append((order, key, fan_out))
        step_backs: dict[str, list[tuple[int, int]]] = {}  # ramp step -> orders of its recorded step-backs
        for step, sets in ramp_sets.items():
            sets.sort()
            step_backs[step] = [sets[i][0] for i in range(1, len(sets))
                                if sets[i][1] < sets[i - 1][1] and sets[i][2] in stepped_back]
        for label, scheduled in labels.items():
            scheduled.sort()
            for (o_prev, prev, _), (o, key, fan_out) in itertools.pairwise(scheduled):
                why = None
                if outcome[prev] != "ok":
                    why = "retried after failure"
                elif fan_out and (label.split("[", 1)[0], o_prev[0], o_prev[1]) in fan_out_failed:
                    why = "fan-out step retried after failed items"
                else:
                    ramp = _RAMP_LABEL.match(label)
                    backs = step_backs.get(ramp["step"], []) if ramp else []
                    if o in backs:
                        why = "ramp step-back after a failed gate"
                    elif any(o_prev < b < o for b in backs):
                        why = "ramp forward again after a step-back"
                if why is None:
                    result.repeated.append(Repeat(wf, ids[key][0].run_id, label, [prev[1], key[1]],
                                                  f"scheduled again after {prev[1]} completed ok"
                                                  + (" in an earlier run of its chain" if prev[0] != key[0] else "")))
                else:
                    result.rescheduled.append((label, key[1], why))
    return result


def repeated_steps(entries: Iterable[Mapping[str, Any]] | str | os.PathLike[str]) -> list[Repeat]:
    """The steps that ran twice (empty is the goal). Takes journal entries or a journal's path."""
    if isinstance(entries, (str, os.PathLike)):
        entries = read_journal(entries)
    return check_journal(entries).repeated

"""The tags RunbookWorkflow writes into its history: activity headers and timer summaries, read back as written."""

from __future__ import annotations

from dataclasses import asdict

import temporalio.converter
from temporalio.api.common.v1 import Header

from workflows.history_tags import (
    ACTIVITY_HEADER,
    ActivityTag,
    activity_tag,
    approval_note,
    is_approval_note,
    timer_step,
    timer_summary,
)


def test_an_activity_tag_round_trips_through_a_header() -> None:
    tag = ActivityTag("ramp", "players", percent=40)
    header = Header(fields={ACTIVITY_HEADER: temporalio.converter.PayloadConverter.default.to_payload(asdict(tag))})
    assert activity_tag(header) == tag


def test_untagged_and_foreign_headers_read_as_no_tag() -> None:
    assert activity_tag(Header()) is None and activity_tag(None) is None
    other = temporalio.converter.PayloadConverter.default.to_payload({"role": "gate", "step": "s", "new_field": 1})
    assert activity_tag(Header(fields={ACTIVITY_HEADER: other})) == ActivityTag("gate", "s")
    junk = temporalio.converter.PayloadConverter.default.to_payload("not a tag")
    assert activity_tag(Header(fields={ACTIVITY_HEADER: junk})) is None


def test_timer_summaries_lead_with_their_step() -> None:
    summary = timer_summary("ramp-players", "gate cache-hit: next reading")
    assert summary == "ramp-players: gate cache-hit: next reading"
    assert timer_step(summary) == "ramp-players"
    assert timer_step("timer") is None


def test_approval_notes_name_their_step_and_are_told_from_waits() -> None:
    """The timers that show how to approve lead with their step like any timer, and the timeline can tell them
    from a step's own waits."""
    first = approval_note("go", "may approve: bob", first=True)
    command = approval_note("go", "coldstart approve local go")
    assert first == "go: awaits approval; may approve: bob"
    assert command == "go: approve with: coldstart approve local go"
    assert timer_step(first) == timer_step(command) == "go"
    assert is_approval_note(first) and is_approval_note(command)
    assert not is_approval_note(timer_summary("go", "approval deadline"))
    assert not is_approval_note(timer_summary("settle", "wait 2s"))

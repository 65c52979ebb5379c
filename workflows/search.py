"""Custom search attributes that make runs findable in the Temporal Web UI and `coldstart list`."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

__all__ = ["ALL", "AWAITING_APPROVAL", "CURRENT_STEP", "DRILL", "RUNBOOK", "TARGET", "for_new_run"]

RUNBOOK = SearchAttributeKey.for_keyword("ColdstartRunbook")
TARGET = SearchAttributeKey.for_keyword("ColdstartTarget")
CURRENT_STEP = SearchAttributeKey.for_keyword("ColdstartStep")
AWAITING_APPROVAL = SearchAttributeKey.for_bool("ColdstartAwaitingApproval")
DRILL = SearchAttributeKey.for_bool("ColdstartDrill")

ALL = (RUNBOOK, TARGET, CURRENT_STEP, AWAITING_APPROVAL, DRILL)


def for_new_run(runbook: str, target: str, drill: bool) -> TypedSearchAttributes:
    """What a run carries from its start, however it is started (CLI, trigger, fleet)."""
    return TypedSearchAttributes([
        SearchAttributePair(RUNBOOK, runbook),
        SearchAttributePair(TARGET, target),
        SearchAttributePair(CURRENT_STEP, "starting"),
        SearchAttributePair(AWAITING_APPROVAL, False),
        SearchAttributePair(DRILL, drill),
    ])

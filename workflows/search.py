"""Custom search attributes that make runs findable in the Temporal Web UI and `coldstart list`."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

__all__ = ["ALL", "AWAITING_APPROVAL", "CURRENT_STEP", "DRILL", "RUNBOOK", "TARGET", "SERVER_FLAGS", "dev_server_flags", "for_new_run"]

RUNBOOK = SearchAttributeKey.for_keyword("ColdstartRunbook")
TARGET = SearchAttributeKey.for_keyword("ColdstartTarget")
CURRENT_STEP = SearchAttributeKey.for_keyword("ColdstartStep")
AWAITING_APPROVAL = SearchAttributeKey.for_bool("ColdstartAwaitingApproval")
DRILL = SearchAttributeKey.for_bool("ColdstartDrill")

ALL = (RUNBOOK, TARGET, CURRENT_STEP, AWAITING_APPROVAL, DRILL)


# Gate readings carry their run as fairness key (workflows/calls.py); a server honours keys only
# with fairness on (a cluster sets it in its dynamic config, cli/cluster.py).
SERVER_FLAGS = ["--dynamic-config-value", "matching.enableFairness=true"]


def dev_server_flags() -> list[str]:
    """`temporal server start-dev` flags that register the attributes and turn fairness on."""
    kinds = {"KEYWORD": "Keyword", "BOOL": "Bool"}
    flags: list[str] = []
    for key in ALL:
        flags += ["--search-attribute", f"{key.name}={kinds[key.indexed_value_type.name]}"]
    return flags + SERVER_FLAGS


def for_new_run(runbook: str, target: str, drill: bool) -> TypedSearchAttributes:
    """What a run carries from its start, however it is started (CLI, trigger, fleet)."""
    return TypedSearchAttributes([
        SearchAttributePair(RUNBOOK, runbook),
        SearchAttributePair(TARGET, target),
        SearchAttributePair(CURRENT_STEP, "starting"),
        SearchAttributePair(AWAITING_APPROVAL, False),
        SearchAttributePair(DRILL, drill),
    ])

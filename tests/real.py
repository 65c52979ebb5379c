"""Missing real components (binaries, packages, root, netns, cgroups): a skip on a laptop, a failure under CI.

Every test that cannot run because this machine lacks a real component says so through `unavailable` (or `require`,
or the `needs` mark), never through `pytest.skip` itself: with COLDSTART_REQUIRE_REAL=1 (`.ci/run`) the test
fails with the reason, so CI cannot pass without the platform it claims to test. Without the variable the test
skips, and the run's summary ends with one line naming what was not tested. A skip for any other reason (a check
that has no meaning on a stand-in) stays a plain `pytest.skip`.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, NoReturn

import pytest

__all__ = [
    "MISSING",
    "REQUIRE_REAL",
    "needs",
    "pytest_configure",
    "pytest_runtest_setup",
    "pytest_terminal_summary",
    "require",
    "required",
    "unavailable",
]

REQUIRE_REAL = "COLDSTART_REQUIRE_REAL"
# Every missing-component skip reason starts with this: the summary finds them by it, across xdist workers.
MISSING = "missing component: "


def required() -> bool:
    """Whether a missing component fails the test (COLDSTART_REQUIRE_REAL set and not 0)."""
    return os.environ.get(REQUIRE_REAL, "") not in ("", "0")


def unavailable(reason: str) -> NoReturn:
    """This test cannot run here because `reason`: fail under COLDSTART_REQUIRE_REAL, else skip."""
    if required():
        pytest.fail(f"{REQUIRE_REAL}=1: {reason}", pytrace=False)
    pytest.skip(MISSING + reason)


def require(present: object, reason: str) -> None:
    """`unavailable(reason)` unless `present` (a path, a flag) is truthy."""
    if not present:
        unavailable(reason)


def needs(present: object, reason: str) -> pytest.MarkDecorator:
    """`require` as a mark, for a module's `pytestmark` or a parameter's `marks`: checked before the fixtures."""
    return pytest.mark.needs(bool(present), reason)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs(present, reason): a real component the test needs (tests/real.py)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs"):
        require(*mark.args)


def _reason(report: Any) -> str | None:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        text = str(longrepr[2]).removeprefix("Skipped: ")
        if text.startswith(MISSING):
            return text.removeprefix(MISSING)
    return None


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line: what this run did not test for want of a real component, and how many tests each cost."""
    reasons = Counter(r for report in terminalreporter.stats.get("skipped", []) if (r := _reason(report)))
    if reasons:
        listed = "; ".join(f"{reason} ({count})" for reason, count in sorted(reasons.items()))
        terminalreporter.write_line(f"not tested here, {REQUIRE_REAL}=1 fails these: {listed}", yellow=True)

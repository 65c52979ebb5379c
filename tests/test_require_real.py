"""A missing real component fails the test under COLDSTART_REQUIRE_REAL, and is skipped and named without it."""

from __future__ import annotations

import pytest

from tests.real import REQUIRE_REAL

pytest_plugins = ("pytester",)

# A suite in miniature: the hooks as tests/conftest.py has them, one missing component reached each way (a
# fixture's `unavailable`, a module's `needs` mark), a component that is there, and a skip of another kind.
CONFTEST = "from tests.real import pytest_configure, pytest_runtest_setup, pytest_terminal_summary  # noqa: F401\n"
SUITE = """
import pytest

from tests.real import needs, require, unavailable


@pytest.fixture
def agent():
    unavailable("no frobd binary on PATH")


def test_needs_frobd(agent):
    pass


@needs(False, "the widget package is not installed")
def test_needs_widget():
    pass


@needs(True, "python is there")
def test_present():
    require(True, "never said")


def test_not_a_component():
    pytest.skip("stand-in only: a fake clock")
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def _run(suite: pytest.Pytester) -> pytest.RunResult:
    return suite.runpytest("-p", "no:cacheprovider", "-p", "no:asyncio", "-p", "no:xdist", "-rs")


def test_under_require_real_a_missing_component_fails_with_its_reason(suite, monkeypatch):
    monkeypatch.setenv(REQUIRE_REAL, "1")
    result = _run(suite)
    # The fixture's failure is a setup error; the mark's too (both fail the run). The other skip stays a skip.
    result.assert_outcomes(passed=1, errors=2, skipped=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*ERROR at setup of test_needs_frobd*", f"{REQUIRE_REAL}=1: no frobd binary on PATH",
        "*ERROR at setup of test_needs_widget*", f"{REQUIRE_REAL}=1: the widget package is not installed",
    ])
    result.stdout.no_fnmatch_line("*not tested here*")


def test_without_it_a_missing_component_skips_and_the_summary_names_it(suite, monkeypatch):
    monkeypatch.delenv(REQUIRE_REAL, raising=False)
    result = _run(suite)
    result.assert_outcomes(passed=1, skipped=3)
    assert result.ret == pytest.ExitCode.OK
    # One line, the components only: the stand-in skip is not a missing component.
    line = f"not tested here, {REQUIRE_REAL}=1 fails these: "
    result.stdout.fnmatch_lines([line + "no frobd binary on PATH (1); the widget package is not installed (1)"])
    result.stdout.no_fnmatch_line("*not tested here*fake clock*")


def test_zero_is_not_set(suite, monkeypatch):
    monkeypatch.setenv(REQUIRE_REAL, "0")
    _run(suite).assert_outcomes(passed=1, skipped=3)

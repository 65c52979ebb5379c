"""Readiness metrics: the textfile node_exporter reads, and a push that replaces the runbook and target's group."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from runtime.readiness import Report, Result, push_report, write_textfile
from tests.readiness.servers import pushgateway


def _report(*states: tuple[str, str]) -> Report:
    return Report("consul-cold-start", "prod", 1795800000.0,
                  [Result(check, "endpoint", state, "evidence", 0.1) for check, state in states])  # pyright: ignore[reportArgumentType]


def _series(text: str) -> dict[tuple[str, str], float]:
    return {(family.name, sample.labels.get("check", "")): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if family.name.startswith("coldstart_readiness") and sample.labels.get("runbook") == "consul-cold-start"}


def test_the_textfile_holds_one_series_per_check_and_when_it_ran(tmp_path: Path) -> None:
    path = tmp_path / "readiness.prom"
    write_textfile(_report(("workers", "ready"), ("vault", "not_ready"), ("dns", "unknown")), path)
    assert _series(path.read_text()) == {
        ("coldstart_readiness", "workers"): 1.0, ("coldstart_readiness", "vault"): 0.0,
        ("coldstart_readiness", "dns"): -1.0, ("coldstart_readiness_checked_timestamp_seconds", ""): 1795800000.0}
    assert list(tmp_path.iterdir()) == [path]  # written through a temporary file, renamed


def test_a_push_replaces_the_group_so_a_check_that_went_away_leaves_no_series(tmp_path: Path) -> None:
    with pushgateway(tmp_path) as url:
        push_report(_report(("workers", "ready"), ("vault", "not_ready")), url)
        first = _series(httpx.get(f"{url}/metrics", timeout=5).text)
        push_report(_report(("workers", "ready")), url)
        second = _series(httpx.get(f"{url}/metrics", timeout=5).text)
    assert first[("coldstart_readiness", "vault")] == 0.0 and first[("coldstart_readiness", "workers")] == 1.0
    assert ("coldstart_readiness", "vault") not in second and second[("coldstart_readiness", "workers")] == 1.0

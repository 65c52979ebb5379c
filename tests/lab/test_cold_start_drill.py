"""The cold-start drill end to end: the seed outage injected on a lab of its own, recovered by one runbook."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rich.console import Console

from lab.hashistack.local import missing_binaries
from tests.lab.conftest import _skip_reason
from tests.real import required, unavailable

pytestmark = pytest.mark.timeout(1200)  # a drill takes about 6 minutes, and its first test brings it up

# Apart from the shared lab (cst/10.214), a developer's lab (cs/10.213) and each other.
DRILL_LAB = {"prefix": "csd", "bridge": "csdbr0", "veth_prefix": "csdv", "subnet": "10.215.0.0/24"}
STANDIN_DRILL_LAB = {"prefix": "csw", "bridge": "cswbr0", "veth_prefix": "cswv", "subnet": "10.220.0.0/24"}


BACKENDS_ENV = "COLDSTART_DRILL_BACKENDS"


def _drill_backends() -> list[str]:
    """One backend per machine: the real Consul, Nomad and Vault when their binaries are on PATH (the reference),
    else the stand-ins (the fallback), so every machine drills once. COLDSTART_DRILL_BACKENDS=real,standin asks for
    both (the stand-ins' own suites, tests/standins and tests/actions, run on every machine either way). Under
    COLDSTART_REQUIRE_REAL the drill is on the real agents, and fails where they are missing."""
    if wanted := os.environ.get(BACKENDS_ENV):
        return [name.strip() for name in wanted.split(",") if name.strip()]
    return ["standin"] if missing_binaries() and not required() else ["real"]


@pytest.fixture(scope="module", params=_drill_backends())
def drill_report(request, tmp_path_factory):
    """The drill on this machine's backend: real Consul, Nomad and Vault (the reference) or the stand-ins."""
    if reason := _skip_reason():
        unavailable(reason)
    if request.param not in ("real", "standin"):
        raise ValueError(f"{BACKENDS_ENV}: unknown backend {request.param!r} (real, standin)")
    if request.param == "real" and (missing := missing_binaries()):
        unavailable(f"real backend: no {', '.join(missing)} binary on PATH (CI unpacks ../shared/hashistack)")
    import asyncio

    from lab.drills.outage import run_lab_drill

    state = tmp_path_factory.mktemp(f"drill-{request.param}")
    console = Console(file=(state / "console.txt").open("w"), width=120)
    before = os.environ.get("COLDSTART_STANDINS")
    os.environ["COLDSTART_STANDINS"] = "all" if request.param == "standin" else ""
    credentials: dict[str, str] = {}

    def read_credentials(cfg) -> None:
        from lab.services import Secrets

        for path in sorted(Secrets(cfg).dir.iterdir()):
            # The OIDC client id is public (the tokens' audience); everything else there is a credential.
            if path.is_file() and path.name != "vault-oidc-client-id" and len(value := path.read_text().strip()) >= 8:
                credentials[path.name] = value
    try:
        report = asyncio.run(run_lab_drill("consul-cold-start", state, console,
                                           lab=DRILL_LAB if request.param == "real" else STANDIN_DRILL_LAB,
                                           on_lab_up=read_credentials))
        # The worker's own Vault token, logged in with the lab's AppRole for the drill.
        credentials["worker VAULT_TOKEN"] = os.environ.get("VAULT_TOKEN", "")
    finally:
        if before is None:
            os.environ.pop("COLDSTART_STANDINS", None)
        else:
            os.environ["COLDSTART_STANDINS"] = before
    want = "stand-in" if request.param == "standin" else "real"
    # Vault has no stand-in: it is real on both.
    assert all(how.startswith(want if name != "vault" else "real") for name, how in report.backends.items()), \
        report.backends
    return report, state, credentials


def test_drill_recovers_to_full_service(drill_report):
    report, state, _ = drill_report
    console = (state / "console.txt").read_text()
    assert report.outcome == "succeeded", console[-3000:]
    steps = dict(report.phases)
    for step in ("block-consul", "restore", "streaming-off", "move-leader", "disable-users", "unblock",
                 "redeploy-cache", "warm-cache", "players", "enable-users", "close"):
        assert step in steps, f"{step} never ran"
    # The players reached 100 % and were admitted there (measured by the players generator).
    assert report.ramp and report.ramp[-1][0] == 100 and report.ramp[-1][1] > 95
    gates = {(step, gate) for step, gate, readings, passed, _ in report.gates if passed}
    for gate in ("cache-hit-ratio", "db-load", "edge-errors", "consul-kv-apply", "admitted-on-target"):
        assert ("players", gate) in gates
    assert ("consul-healthy", "kv-apply-p50") in gates or ("kv-apply", "kv-apply-p50") in gates


def test_drill_report_files(drill_report):
    report, state, _ = drill_report
    markdown = report.report_path.read_text()
    assert "restore" in markdown and "players" in markdown
    assert report.plot_path is not None and report.plot_path.read_bytes()[:4] == b"\x89PNG"
    # The scorecard against the runbook's objectives: every phase reached, each in its objective, and kept.
    card = report.scorecard
    assert card is not None and [p.name for p in card.phases] == ["consul-stable", "cache-healthy", "players-100",
                                                                  "users-back"]
    assert all(p.measured_s is not None and p.met for p in card.phases), card.phases
    assert report.scorecard_path is not None and card.workflow_id in report.scorecard_path.read_text()
    # The lab was taken down: no namespace of the drill's prefix is left.
    import subprocess

    own = (DRILL_LAB if report.backends["consul"].startswith("real") else STANDIN_DRILL_LAB)["prefix"]
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not [line for line in names.splitlines() if line.startswith(own + "-")]
    assert Path(state / "lab").exists()


def test_the_drill_writes_no_credential(drill_report):
    """Every file the drill leaves (its report, console, timeline, the Temporal server's database with every
    history, its log, the lab's logs) is scanned for each credential the lab holds: none may appear."""
    _, state, credentials = drill_report
    assert {"vault-root-token", "consul-token", "nomad-token", "worker-secret-id", "trigger-token",
            "vault-password-drill-bot", "worker VAULT_TOKEN"} <= set(credentials), sorted(credentials)
    scanned, found = 0, []
    for path in sorted(p for p in state.rglob("*") if p.is_file()):
        data = path.read_bytes()
        scanned += 1
        found += [f"{path.relative_to(state)}: {name}" for name, value in credentials.items()
                  if value and value.encode() in data]
    assert scanned >= 10 and (state / "temporal.db").exists()
    assert not found, found

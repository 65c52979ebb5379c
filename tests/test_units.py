"""`coldstart install-units`: the units written once, left alone when unchanged, updated when only an install wrote
them, and never over a local edit without --force."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.units import UnitsRefused, install_units

REPO = Path(__file__).resolve().parents[1]
COLDSTART = Path(sys.executable).parent / "coldstart"
UNITS = ["coldstart-readiness@.service", "coldstart-readiness@.timer", "coldstart-triggers.service",
         "coldstart-worker.service"]


def _outcomes(directory: Path, **options) -> dict[str, str]:
    return {unit.path.name: unit.outcome for unit in install_units(directory, COLDSTART, "coldstart", **options)}


def test_a_second_install_changes_nothing(tmp_path: Path) -> None:
    assert _outcomes(tmp_path) == dict.fromkeys(UNITS, "wrote")
    before = {name: (tmp_path / name).stat().st_mtime_ns for name in UNITS}
    assert _outcomes(tmp_path) == dict.fromkeys(UNITS, "unchanged")
    assert {name: (tmp_path / name).stat().st_mtime_ns for name in UNITS} == before
    worker = (tmp_path / "coldstart-worker.service").read_text()
    assert f"ExecStart={COLDSTART} worker\n" in worker and "User=coldstart\n" in worker
    assert "ProtectSystem=strict\n" in worker and "@" not in worker.replace("@system-service", "")


def test_what_an_install_wrote_is_updated_and_an_edit_is_refused_until_forced(tmp_path: Path) -> None:
    install_units(tmp_path, Path("/opt/old/bin/coldstart"), "coldstart")
    # A new --exec: every service an install wrote is updated (the timer names no executable).
    assert _outcomes(tmp_path) == {**dict.fromkeys(UNITS, "updated"), "coldstart-readiness@.timer": "unchanged"}

    edited = tmp_path / "coldstart-worker.service"
    edited.write_text(edited.read_text().replace("CPUWeight=1000", "CPUWeight=500"))
    timer = tmp_path / "coldstart-readiness@.timer"
    timer.unlink()
    with pytest.raises(UnitsRefused, match="edited since installed: .*coldstart-worker.service"):
        install_units(tmp_path, Path("/opt/new/bin/coldstart"), "coldstart")
    assert "CPUWeight=500" in edited.read_text() and not timer.exists()  # nothing written
    outcomes = _outcomes(tmp_path, force=True)
    assert outcomes["coldstart-worker.service"] == "replaced" and outcomes["coldstart-readiness@.timer"] == "wrote"
    assert "CPUWeight=1000" in edited.read_text()


def test_the_command_prints_what_it_wrote_and_refuses_an_edit(tmp_path: Path) -> None:
    def command(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cli.main", "install-units", "--dir", str(tmp_path), *args],
                              cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
                              env={**os.environ, "COLUMNS": "200"})

    first = command("--user", "recovery")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[:4] == [f"wrote     {tmp_path / name}" for name in UNITS]
    assert "User=recovery\n" in (tmp_path / "coldstart-worker.service").read_text()
    (tmp_path / "coldstart-triggers.service").write_text("[Service]\nExecStart=/bin/true\n")
    refused = command("--user", "recovery")
    assert refused.returncode == 1 and "edited since installed" in refused.stderr, refused
    assert command("--user", "no such user").returncode == 1
    assert command("--exec", str(tmp_path / "missing")).returncode == 2

"""The trial restore: the newest snapshot restored into a scratch real Consul agent, key counts compared."""

from __future__ import annotations

import shutil
from pathlib import Path

from runtime.readiness.trial import trial_restore_verdict
from tests.readiness.archives import with_state
from tests.real import unavailable


def _consul() -> str:
    binary = shutil.which("consul")
    if binary is None:
        unavailable("no consul binary on PATH (CI unpacks ../shared/hashistack)")
    return binary


async def test_the_newest_snapshot_restores_with_the_archives_key_count(snapshot: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / snapshot.name).write_bytes(snapshot.read_bytes())
    verdict = await trial_restore_verdict(str(store), consul=_consul())
    assert verdict.state == "ready", verdict.evidence
    assert "3 keys, as the archive holds" in verdict.evidence


async def test_a_snapshot_cut_short_is_not_restored(snapshot: Path, tmp_path: Path) -> None:
    """meta.json and SHA256SUMS as the agent wrote them, state.bin cut short: refused before any agent starts."""
    store = tmp_path / "store"
    store.mkdir()
    with_state(snapshot, store / snapshot.name, lambda state: state[: len(state) // 2])
    verdict = await trial_restore_verdict(str(store), consul=_consul())
    assert verdict.state == "not_ready"
    assert "does not verify or decode" in verdict.evidence


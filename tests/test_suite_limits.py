"""The suite's time limits are enforced: a hung test fails by itself, not the whole CI run at its 90 minutes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_timeout_plugin_is_active_with_a_default_limit(pytestconfig):
    # Without pytest-timeout the `timeout` marks of the lab modules are inert (an unknown mark).
    assert pytestconfig.pluginmanager.hasplugin("timeout")
    assert float(pytestconfig.getini("timeout")) > 0


def test_a_test_past_its_mark_fails_and_the_next_one_still_runs(tmp_path):
    (tmp_path / "test_hung.py").write_text(
        "import asyncio, pytest\n"
        "@pytest.mark.timeout(1)\n"
        "async def test_hung():\n"
        "    await asyncio.sleep(60)\n"
        "async def test_next():\n"
        "    await asyncio.sleep(0)\n"
    )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(REPO),
         "-c", str(REPO / "pyproject.toml"), str(tmp_path / "test_hung.py")],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Timeout (>1.0s) from pytest-timeout" in result.stdout
    assert "1 failed, 1 passed" in result.stdout
    assert time.monotonic() - started < 30

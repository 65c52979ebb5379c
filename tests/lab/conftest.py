"""The lab tests' shared lab on its own prefix/bridge/subnet, always torn down."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.hosts import netns_usable
from lab.settings import LabConfig
from tests.real import unavailable

__all__ = ["lab", "loop", "opened"]

# Not the default names: a developer's running lab (cs/csbr0/10.213.0.0/24) is left alone.
TEST_LAB = {"prefix": "cst", "bridge": "cstbr0", "veth_prefix": "cstv", "subnet": "10.214.0.0/24"}


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the drill lab needs root"
    for tool in ("redis-server", "prometheus", "prometheus-alertmanager", "pdns_server", "setpriv", "unshare"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} not installed"
    if not Path("/usr/lib/postgresql/15/bin/initdb").exists():
        return "postgresql-15 not installed"
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return "asyncpg not installed"
    return netns_usable()


@pytest.fixture(scope="module")
def loop():
    """One event loop for a module's drill harness (its Temporal client lives on it)."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def opened(loop: asyncio.AbstractEventLoop, make: Callable[[], Any]) -> Iterator[Any]:
    """A drill harness (lab/drills/harness.py) opened on `loop` for a module's tests, closed after them."""
    if reason := _skip_reason():
        unavailable(reason)
    from lab.hashistack.local import missing_binaries

    if missing := missing_binaries():
        unavailable(f"no {', '.join(missing)} binary on PATH (CI unpacks ../shared/hashistack)")
    harness = make()
    try:
        loop.run_until_complete(harness.open())
        yield harness
    finally:
        loop.run_until_complete(harness.close())


def _real_agents_reason() -> str | None:
    """Why the real Consul, Nomad and Vault cannot run here, or None: the lab's tests mean them."""
    from lab.hashistack.local import missing_binaries

    if missing := missing_binaries():
        return f"the lab's tests run on the real agents: no {', '.join(missing)} binary on PATH (CI unpacks ../shared/hashistack)"
    return None


@pytest.fixture(scope="package")
def lab(tmp_path_factory):
    """The shared lab on the real Consul, Nomad and Vault (the reference), or skipped saying which is missing.
    Package-scoped: it goes down once the worker leaves tests/lab, not at the session's end (tests/conftest.py
    runs its three modules together)."""
    if reason := _skip_reason() or _real_agents_reason():
        unavailable(reason)
    from lab.lifecycle import down, up

    root = tmp_path_factory.mktemp("lab")
    cfg = LabConfig(state_dir=root / "state", inventory_path=root / "targets" / "lab.yaml",
                    players_rps=40, internal_rps=30, preempt_notice_s=2.0, **TEST_LAB)
    try:
        info = up(cfg)
        assert all(how.startswith("real") for how in info["backends"].values()), info["backends"]
        yield cfg, info
    finally:
        down(cfg)

"""Paths an action writes or enters: secret files owner-only from their first byte, namespaces by name only."""

from __future__ import annotations

import os
import stat

from activities._files import open_private, private_directory


def test_a_private_file_is_0600_even_over_an_existing_readable_one(tmp_path):
    path = tmp_path / "snap"
    path.write_bytes(b"old")
    path.chmod(0o644)
    old = os.umask(0)  # the worker's umask does not widen it either
    try:
        with open_private(path) as out:
            out.write(b"secret")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes() == b"secret"


def test_a_private_directory_is_created_and_tightened_0700(tmp_path):
    fresh = tmp_path / "a" / "b"
    private_directory(fresh)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    private_directory(shared)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o700


def test_a_network_namespace_is_a_name_never_a_path():
    import pytest
    from pydantic import ValidationError

    from activities.executors import ExecutorError, HostTarget, NetnsExecutor

    for bad in ("../../proc/1/ns/net", "/proc/1/ns/net", "a/b", ".hidden", ""):
        with pytest.raises(ValidationError):
            HostTarget(name="h", kind="netns", netns=bad)
        with pytest.raises(ExecutorError, match="is not a name under /run/netns"):
            NetnsExecutor(bad, name="h")
    assert NetnsExecutor("cs-c1.lab_2", name="h").netns == "cs-c1.lab_2"

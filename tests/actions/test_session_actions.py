"""Container and session-store actions on real PID namespaces, cgroups and Consul: kill inits, cordon, release."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from activities.containers import _python, kill_inits, list_containers
from activities.contracts.containers import KillInitsInput, ListInput
from activities.contracts.sessions import CordonInput, ReleaseInput
from activities.executors import HostTarget, executor_for
from activities.sessions import cordon, release
from lab.containers import cgroup_root, remove_sessions_cgroup, sessions_cgroup
from tests.real import needs

pytestmark = [pytest.mark.lab, needs(os.geteuid() == 0, "PID namespaces, cgroups and netns need root")]


class Host:
    """A netns 'host' running containers: `unshare --pid --fork --mount-proc` each, in a child cgroup of `parent`."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.netns = f"cstc-{tag}"
        self._prefix = f"test-{tag}"
        self.parent = sessions_cgroup(self._prefix)
        self.base = cgroup_root() / self.parent
        self.procs: dict[str, subprocess.Popen] = {}
        subprocess.run(["ip", "netns", "add", self.netns], check=True)
        self.base.mkdir()

    @property
    def targets(self) -> list[HostTarget]:
        return [HostTarget(name="box", kind="netns", netns=self.netns), HostTarget(name="other", kind="netns",
                                                                                   netns=self.netns)]

    def start(self, name: str, script: str = "sleep 600 & sleep 600 & wait") -> subprocess.Popen:
        group = self.base / name
        group.mkdir()
        procs_file = str(group / "cgroup.procs")

        def join() -> None:
            with open(procs_file, "w") as f:
                f.write(str(os.getpid()))

        proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script],
                                preexec_fn=join, stdin=subprocess.DEVNULL)  # noqa: PLW1509 - joins the cgroup
        self.procs[name] = proc
        deadline = time.monotonic() + 5
        while len((group / "cgroup.procs").read_text().split()) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        return proc

    def processes(self, name: str) -> list[int]:
        return [int(p) for p in (self.base / name / "cgroup.procs").read_text().split()]

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()
        for proc in self.procs.values():
            proc.wait(timeout=10)
        remove_sessions_cgroup(self._prefix)  # the lab's teardown: kills what is left, then removes the cgroups
        subprocess.run(["ip", "netns", "del", self.netns], check=False)
        assert not self.base.exists(), f"{self.base} was left behind"


@pytest.fixture
def host():
    box = Host()
    try:
        yield box
    finally:
        box.close()


def _on(host: Host, model, **kw):
    return model(host="box", hosts=host.targets, cgroup_parent=host.parent, **kw)


async def test_kill_inits_kills_each_namespace_with_one_signal_and_is_idempotent(host):
    for i in range(6):
        host.start(f"box-r{i:04d}")
    listed = await list_containers(_on(host, ListInput))
    assert sorted(listed.alive) == [f"box-r{i:04d}" for i in range(6)]
    for c in listed.containers:
        # Three processes inside (sh and two sleeps) plus unshare outside; one of them is the namespace's PID 1.
        assert c.processes == 4 and len(c.inits) == 1
        status = Path(f"/proc/{c.inits[0]}/status").read_text()
        assert next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[-1] == "1"

    out = await kill_inits(_on(host, KillInitsInput))
    assert out.killed == sorted(listed.alive) and out.already_gone == []
    # The kill's speed is bench/drain.py's to measure; here only that it is reported, and far from a hang.
    assert 0 <= out.seconds < 10, out.seconds
    # Every init was pinned and checked before the first signal: the burst is inside the whole kill.
    assert 0 <= out.signalled_seconds <= out.seconds
    assert out.realtime  # root here: the burst ran at real-time priority
    assert out.reapers == 6 and out.reapers_kept_realtime == []  # each init's unshare, raised until it reaped
    assert all(host.processes(n) == [] for n in listed.alive)
    for proc in host.procs.values():
        assert proc.wait(timeout=5) != 0  # unshare reports its child killed

    again = await kill_inits(_on(host, KillInitsInput))
    assert again.killed == [] and again.already_gone == sorted(listed.alive)


# A shim that outlives its container, as a runtime's does: it makes a PID namespace, forks its init into
# the container's cgroup, waits for the init to exit, records its own scheduling policy before it reaps
# it (the cgroup still holds the zombie, so the kill is still waiting), reaps it and stays.
_SHIM = """
import ctypes, os, sys, time
if ctypes.CDLL(None, use_errno=True).unshare(0x20000000) != 0:  # CLONE_NEWPID
    raise OSError(ctypes.get_errno(), "unshare")
init = os.fork()
if init == 0:
    with open(sys.argv[1], "w") as f:
        f.write("0")
    os.execvp("sleep", ["sleep", "600"])
os.waitid(os.P_PID, init, os.WEXITED | os.WNOWAIT)
with open(sys.argv[2], "w") as f:
    f.write(str(os.sched_getscheduler(0)))
os.waitpid(init, 0)
time.sleep(600)
"""


def _start_shimmed(host: Host, name: str, seen: Path) -> subprocess.Popen:
    group = host.base / name
    group.mkdir()
    shim = subprocess.Popen([sys.executable, "-c", _SHIM, str(group / "cgroup.procs"), str(seen)])
    host.procs[name] = shim
    deadline = time.monotonic() + 5
    while not host.processes(name) and time.monotonic() < deadline:
        time.sleep(0.01)
    return shim


async def test_kill_inits_reaps_at_real_time_priority_and_puts_a_surviving_shim_back(host, tmp_path):
    seen = tmp_path / "policy-when-reaping"
    shim = _start_shimmed(host, "box-shimmed", seen)
    assert len(host.processes("box-shimmed")) == 1
    assert os.sched_getscheduler(shim.pid) == os.SCHED_OTHER

    out = await kill_inits(_on(host, KillInitsInput))
    assert out.killed == ["box-shimmed"] and out.reapers == 1 and out.reapers_kept_realtime == []
    assert int(seen.read_text()) == os.SCHED_FIFO  # it reaped its init at real-time priority
    assert shim.poll() is None  # the shim itself is not killed
    assert os.sched_getscheduler(shim.pid) == os.SCHED_OTHER  # and is back to its own policy
    assert os.sched_getparam(shim.pid).sched_priority == 0


async def test_kill_inits_leaves_processes_that_are_no_namespace_init_and_says_so(host):
    group = host.base / "box-plain"
    group.mkdir()
    # The child joins the cgroup itself, before exec: only preexec_fn runs there.
    plain = subprocess.Popen(["sleep", "600"],
                             preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))  # noqa: PLW1509
    host.procs["box-plain"] = plain
    host.start("box-r0001")
    with pytest.raises(ApplicationError) as caught:
        await kill_inits(_on(host, KillInitsInput, verify_within_seconds=0.5))
    message = str(caught.value)
    assert "killed the inits of 1 containers, but 1 still have processes" in message, message
    assert "no PID-namespace init found in: box-plain" in message, message
    assert plain.poll() is None  # not ours to kill: not a container init
    assert host.processes("box-r0001") == []


async def test_the_drains_host_scripts_start_at_real_time_priority(host):
    target = host.targets[0]
    async with executor_for(target) as ex:
        rc, out, err = await ex.run(_python(target), input="import os; print(os.sched_getscheduler(0))", timeout=10)
    assert (rc, err) == (0, "") and int(out) == os.SCHED_FIFO


def test_unknown_host_is_refused_before_anything_runs(host):
    with pytest.raises(ValueError, match="host 'nope' is not one of"):
        KillInitsInput(host="nope", hosts=host.targets, cgroup_parent=host.parent)


def _entry(stack, repl: str, container: str, where: str = "box") -> None:
    value = json.dumps({"repl": repl, "container": container, "host": where, "socket": "/dev/null"})
    assert stack.admin().kv.put(f"{stack.prefix}repls/{repl}", value, cas=0)


@pytest.fixture
def store(stack):
    stack.prefix = f"sessions-{uuid.uuid4().hex[:6]}/"
    return stack


async def test_release_deletes_only_entries_of_dead_containers_on_the_host(store, host):
    host.start("box-r0001")
    host.start("box-r0002")
    _entry(store, "r0001", "box-r0001")
    _entry(store, "r0002", "box-r0002")
    _entry(store, "r0003", "box-r0003")  # its container is already gone
    _entry(store, "r0004", "other-r0004", where="other")
    target = store.consul_target()
    await kill_inits(_on(host, KillInitsInput))
    host.start("box-r0002b")  # a live container whose entry must stay
    _entry(store, "r0005", "box-r0002b")

    with pytest.raises(ApplicationError, match="1 still point at live containers: r0005"):
        await release(ReleaseInput(consul=target, store_prefix=store.prefix, host="box", hosts=host.targets,
                                   cgroup_parent=host.parent))
    keys = sorted(k.rsplit("/", 1)[1] for k in store.admin().kv.get(store.prefix, keys=True)[1])
    assert keys == ["r0004", "r0005"]  # the dead three released even though the action failed

    out = await release(ReleaseInput(consul=target, store_prefix=store.prefix, host="box", hosts=host.targets,
                                     cgroup_parent=host.parent, require_all=False))
    assert out.released == [] and out.kept_live == ["r0005"]


async def test_release_never_deletes_an_entry_repointed_meanwhile(store, host):
    _entry(store, "r0001", "box-r0001")
    target = store.consul_target()
    admin = store.admin()
    key = f"{store.prefix}repls/r0001"
    from activities import sessions

    def repoint_after_read(client, prefix, name):
        found = sessions._entries(client, prefix, name)
        if key in found:  # the platform places the repl on another host between our read and our delete
            admin.kv.put(key, json.dumps({"repl": "r0001", "container": "other-r0001", "host": "other"}))
        return found

    out = await sessions._release(ReleaseInput(consul=target, store_prefix=store.prefix, host="box",
                                               assume_host_dead=True), read_entries=repoint_after_read)
    assert out.released == [] and out.moved == ["r0001"]
    assert json.loads(admin.kv.get(key)[1]["Value"])["host"] == "other"


async def test_release_of_many_entries_spans_transactions(store):
    target = store.consul_target()
    for i in range(150):
        _entry(store, f"r{i:04d}", f"box-r{i:04d}")
    out = await release(ReleaseInput(consul=target, store_prefix=store.prefix, host="box", assume_host_dead=True))
    assert len(out.released) == 150
    assert store.admin().kv.get(f"{store.prefix}repls/", recurse=True)[1] is None


def test_cordon_is_idempotent_and_undoable(store):
    target = store.consul_target()
    first = cordon(CordonInput(consul=target, store_prefix=store.prefix, host="box", reason="preempted"))
    again = cordon(CordonInput(consul=target, store_prefix=store.prefix, host="box", reason="preempted"))
    assert first.changed and not again.changed
    value = json.loads(store.admin().kv.get(first.key)[1]["Value"])
    assert value == {"schedulable": False, "reason": "preempted"}
    assert first.undo.delete and first.undo.key == first.key

"""Container host actions: confirm a host's preemption notice, list its containers and kill each one's PID-namespace init."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import BaseModel, Field, model_validator
from temporalio.exceptions import ApplicationError

from activities._clients import unavailable
from activities._fields import unique_names
from activities.executors import ExecutorError, HostTarget, executor_for
from activities.registry import action
from activities.retry import Retry

__all__ = [
    "ContainerState",
    "HostContainers",
    "KillInitsInput",
    "KillInitsOutput",
    "ListInput",
    "NoticeInput",
    "NoticeOutput",
    "kill_inits",
    "list_containers",
    "live_containers",
    "preemption_notice",
]

# Runs on the host with its own python3 (stdin, no file left behind). A container is a child cgroup of
# the parent group; its init is the process whose last NSpid is 1 (PID 1 of a namespace below the
# host's). SIGKILL to that init makes the kernel kill everything in its namespace: one signal per
# container, all sent before any wait, instead of a runtime's stop per container. pidfd pins the
# process between the check and the kill, so a recycled PID is never signalled.
_HOST_SCRIPT = r"""
import json, os, signal, sys, time
mode, parent, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
base = os.path.join("/sys/fs/cgroup" if v2 else "/sys/fs/cgroup/pids", parent)

def procs(name):
    try:
        with open(os.path.join(base, name, "cgroup.procs")) as f:
            return [int(p) for p in f.read().split()]
    except OSError:  # gone, or being removed by the runtime (ENODEV): no process left in it
        return []

def is_init(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    return len(ids) > 1 and ids[-1] == "1"
    except OSError:
        pass
    return False

names = sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d))) if os.path.isdir(base) else []
found = {n: procs(n) for n in names}
report = {"cgroup": base, "containers": {n: {"pids": len(p), "inits": [x for x in p if is_init(x)]} for n, p in found.items()}}
if mode == "kill":
    started = time.monotonic()
    signalled = {}
    for name, info in report["containers"].items():
        for pid in info["inits"]:
            try:
                fd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
            except ProcessLookupError:
                continue
            try:
                if not is_init(pid):
                    continue
                if fd is not None:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
                signalled.setdefault(name, []).append(pid)
            except ProcessLookupError:
                pass
            finally:
                if fd is not None:
                    os.close(fd)
    deadline = started + timeout
    while True:
        left = {n: len(procs(n)) for n in names if procs(n)}
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.005)
    report.update(signalled=signalled, left=left, seconds=time.monotonic() - started)
print(json.dumps(report))
"""


class _Named(BaseModel):
    """One host of a group (`${{ target.groups.container_hosts }}`) chosen by name."""

    host: str = Field(min_length=1, max_length=64)
    hosts: Annotated[list[HostTarget], unique_names("host")] = Field(min_length=1)

    @model_validator(mode="after")
    def _known_host(self) -> _Named:
        if self.host not in {h.name for h in self.hosts}:
            raise ValueError(f"host {self.host!r} is not one of {sorted(h.name for h in self.hosts)}")
        return self

    def target(self) -> HostTarget:
        return next(h for h in self.hosts if h.name == self.host)


class _OnHost(_Named):
    """A host and its containers' cgroup."""

    cgroup_parent: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)*$", max_length=200,
                               description="the cgroup holding one child group per container, below the hierarchy root")


class ListInput(_OnHost):
    pass


class ContainerState(BaseModel):
    name: str
    processes: int
    inits: list[int] = Field(description="host PIDs of the container's PID-namespace init")


class HostContainers(BaseModel):
    host: str
    cgroup: str
    containers: list[ContainerState]

    @property
    def alive(self) -> list[str]:
        return [c.name for c in self.containers if c.processes]


class KillInitsInput(_OnHost):
    verify_within_seconds: float = Field(default=5.0, gt=0, le=60,
                                         description="how long the killed containers may take to be empty")


class KillInitsOutput(BaseModel):
    host: str
    cgroup: str = Field(description="where the containers were looked for (none there: nothing to kill)")
    killed: list[str] = Field(description="containers whose init got SIGKILL in this attempt")
    killed_count: int = 0
    already_gone: list[str] = Field(description="containers with no process left before this attempt")
    seconds: float = Field(description="from the first signal until every container was empty")


# Asks the provider's metadata service from the host itself (it answers only there): the notice, or none.
_NOTICE_SCRIPT = r"""
import json, sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=3) as r:
        print(json.dumps({"status": r.status, "body": r.read(4096).decode("utf-8", "replace")}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": ""}))
"""


class NoticeInput(_Named):
    metadata_urls: dict[str, Annotated[str, Field(pattern=r"^https?://[^\s]+$", max_length=300)]] = Field(
        description="per host, the provider's spot/instance-action metadata URL as the host itself reaches it")
    deadline: str = Field(max_length=40, description="the deadline the run was started with: unix seconds or RFC 3339")
    tolerance_seconds: float = Field(default=5.0, ge=0, le=600,
                                     description="how far the host's own notice may be from that deadline")


class NoticeOutput(BaseModel):
    host: str
    action: str
    terminates_at: datetime
    off_by_seconds: float = Field(description="the host's notice less the deadline the run was given")


def _instant(text: str) -> datetime:
    try:
        return datetime.fromtimestamp(float(text), tz=UTC)
    except ValueError:
        moment = datetime.fromisoformat(text)
        if moment.tzinfo is None:
            raise ValueError(f"{text!r} has no time zone") from None
        return moment


@action("containers.preemption_notice", timeout=30,
        retry=Retry(max_attempts=3, initial_interval=timedelta(seconds=0.5)))
async def preemption_notice(inp: NoticeInput) -> NoticeOutput:
    """Confirm from the host itself that the provider will terminate it, at about the deadline the run was
    given: a run started by an alert drains nothing on the alert's word alone."""
    target = inp.target()
    url = inp.metadata_urls.get(target.name)
    if url is None:
        raise ApplicationError(f"{target.name}: the inventory names no metadata URL for it", type="BadInput",
                               non_retryable=True)
    try:
        given = _instant(inp.deadline)
    except ValueError as exc:
        raise ApplicationError(f"deadline {inp.deadline!r}: {exc}", type="BadInput", non_retryable=True) from None
    try:
        async with executor_for(target) as ex:
            rc, out, err = await ex.run(["python3", "-", url], input=_NOTICE_SCRIPT, timeout=15)
    except ExecutorError as exc:
        raise unavailable(f"{target.name}: {exc}", retryable=exc.retryable) from None
    try:
        answer = json.loads(out) if rc == 0 else None
    except ValueError:
        answer = None
    if answer is None:
        raise unavailable(f"{target.name}: its metadata service did not answer (rc {rc}): {err.strip()[-200:]}")
    notice: Any = None
    if answer["status"] == 200:
        try:
            notice = json.loads(answer["body"])
        except ValueError:
            notice = None
    if not isinstance(notice, dict) or notice.get("action") not in ("terminate", "stop"):
        raise ApplicationError(
            f"{target.name} reports no preemption notice (its metadata answered {answer['status']}): nothing is drained",
            type="NoPreemptionNotice", non_retryable=True)
    try:
        when = _instant(str(notice.get("time")))
    except ValueError:
        raise ApplicationError(f"{target.name}: its notice has no readable time: {str(notice)[:200]}",
                               type="NoPreemptionNotice", non_retryable=True) from None
    off = (when - given).total_seconds()
    if abs(off) > inp.tolerance_seconds:
        raise ApplicationError(
            f"{target.name}'s own notice terminates it at {when:%Y-%m-%dT%H:%M:%SZ}, {off:+.0f} s from the deadline the "
            f"run was given ({given:%Y-%m-%dT%H:%M:%SZ}): nothing is drained", type="NoticeMismatch", non_retryable=True)
    return NoticeOutput(host=target.name, action=notice["action"], terminates_at=when, off_by_seconds=round(off, 3))


async def _run_script(inp: _OnHost, mode: str, timeout: float) -> dict[str, Any]:
    target = inp.target()
    try:
        async with executor_for(target) as ex:
            rc, out, err = await ex.run(["python3", "-", mode, inp.cgroup_parent, str(timeout)],
                                        input=_HOST_SCRIPT, timeout=timeout + 15)
    except ExecutorError as exc:
        raise unavailable(f"{target.name}: {exc}", retryable=exc.retryable) from None
    if rc != 0:
        raise unavailable(f"{target.name}: container {mode} failed (rc {rc}): {err.strip()[-300:]}")
    try:
        return json.loads(out)
    except ValueError:
        raise unavailable(f"{target.name}: container {mode} printed no report: {out[-200:]!r}") from None


def _states(report: dict[str, Any]) -> list[ContainerState]:
    return [ContainerState(name=n, processes=c["pids"], inits=c["inits"]) for n, c in report["containers"].items()]


async def live_containers(inp: _OnHost) -> HostContainers:
    """The host's containers now (a container with no process left is gone)."""
    report = await _run_script(inp, "list", 1.0)
    return HostContainers(host=inp.host, cgroup=report["cgroup"], containers=_states(report))


@action("containers.list", timeout=30, retry=Retry(max_attempts=3, initial_interval=timedelta(seconds=0.2)))
async def list_containers(inp: ListInput) -> HostContainers:
    """Every container on a host (a child cgroup of the parent), its process count and its namespace init."""
    return await live_containers(inp)


@action("containers.kill_inits", timeout=30, mutating=True,
        retry=Retry(max_attempts=3, initial_interval=timedelta(seconds=0.2)))
async def kill_inits(inp: KillInitsInput) -> KillInitsOutput:
    """SIGKILL every container's PID-namespace init on a host at once, then verify every container is empty.

    Idempotent: containers already empty are reported as already gone. Fails (retryable) naming
    the containers that still have processes, after saying which inits it killed.
    """
    report = await _run_script(inp, "kill", inp.verify_within_seconds)
    states = _states(report)
    killed = sorted(report.get("signalled", {}))
    gone_before = sorted(s.name for s in states if not s.processes)
    no_init = sorted(s.name for s in states if s.processes and not s.inits)
    left = report.get("left", {})
    if left:
        detail = ", ".join(f"{n} ({k} processes)" for n, k in sorted(left.items())[:10])
        hint = f"; no PID-namespace init found in: {', '.join(no_init[:10])}" if no_init else ""
        raise ApplicationError(
            f"{inp.host}: killed the inits of {len(killed)} containers, but {len(left)} still have processes "
            f"after {inp.verify_within_seconds:g}s: {detail}{hint}",
            {"killed": killed, "left": left}, type="ContainersLeft")
    return KillInitsOutput(host=inp.host, cgroup=report["cgroup"], killed=killed, killed_count=len(killed),
                           already_gone=gone_before,
                           seconds=round(report["seconds"], 4))

"""Container host actions: confirm a host's preemption notice, list its containers and kill each one's PID-namespace init."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from temporalio.exceptions import ApplicationError

from activities._clients import unavailable
from activities.binding import implements
from activities.contracts.containers import (
    KILL_INITS,
    LIST_CONTAINERS,
    PREEMPTION_NOTICE,
    ContainerState,
    HostCgroup,
    HostContainers,
    KillInitsInput,
    KillInitsOutput,
    ListInput,
    NoticeInput,
    NoticeOutput,
)
from activities.executors import ExecutorError, HostTarget, executor_for
from activities.heartbeats import heartbeating

__all__ = ["kill_inits", "list_containers", "live_containers", "preemption_notice"]

# A host being drained is busy by definition (its containers), and the drain's scripts are short: each
# starts at real-time priority where the host allows it (chrt on the shell, which exec keeps for
# Python), so its start and its reads do not queue behind the work it is there to end; where chrt is
# refused or missing, the script runs at normal priority.
_AHEAD = 'chrt -f -p 1 $$ >/dev/null 2>&1; exec "$@"'


def _python(target: HostTarget) -> list[str]:
    """The host's Python for a script on stdin, ahead of the host's other work: the standard library only,
    no site-packages, no PYTHON* variables (and a start in tens of milliseconds, not a hundred)."""
    return ["sh", "-c", _AHEAD, "sh", target.python, "-I", "-S", "-"]

# Runs on the host with its own python3 (stdin, no file left behind). A container is a child cgroup of
# the parent group; its init is the process whose last NSpid is 1 (PID 1 of a namespace below the
# host's). SIGKILL to that init makes the kernel kill everything in its namespace: one signal per
# container, instead of a runtime's stop per container. Every init is pinned by a pidfd and checked
# before the first signal, so a recycled PID is never signalled and the burst itself is only the
# signals. The burst runs at real-time priority where allowed: at normal priority each killed init
# wakes on the other core and preempts the sender, stretching 200 signals over 0.1 to 0.2 s on 2 cores.
# A container's cgroup empties only once its init has exited and its parent (the runtime's shim) has
# reaped it, so each init is raised to real-time priority just before its signal (it runs no user code
# after it) and each parent for the kill, back to its own policy once the cgroups are empty: the rest
# of the host no longer takes the cores from the exits and the reaping. The script stays real-time while
# it waits (a read a millisecond), so it sees them empty when they are, not when the host next has a core.
_HOST_SCRIPT = r"""
import json, os, resource, select, signal, sys, time
mode, parent, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
base = os.path.join("/sys/fs/cgroup" if v2 else "/sys/fs/cgroup/pids", parent)

def procs(name):
    try:
        with open(os.path.join(base, name, "cgroup.procs")) as f:
            return [int(p) for p in f.read().split()]
    except OSError:  # gone, or being removed by the runtime (ENODEV): no process left in it
        return []

def status(pid):
    # (is a PID-namespace init, parent PID); (False, 0) once it is gone.
    init, parent = False, 0
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("PPid:"):
                    parent = int(line.split()[1])
                elif line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    init = len(ids) > 1 and ids[-1] == "1"
    except (OSError, ValueError):
        return False, 0
    return init, parent

def is_init(pid):
    return status(pid)[0]

def own_tasks():
    # Tasks in the parent itself, not in a container (v1 allows them; pids.current counts them too).
    try:
        with open(os.path.join(base, "tasks")) as f:
            return len(f.read().split())
    except OSError:
        return 0

def empty():
    # True: no container process left below the parent; False: some; None: cannot tell (each is read).
    try:
        if v2:
            with open(os.path.join(base, "cgroup.events")) as f:
                return "populated 0" in f.read()
        with open(os.path.join(base, "pids.current")) as f:
            return int(f.read()) <= own
    except (OSError, ValueError):
        return None

def pin(pid):
    # (pidfd, pid, parent) for the init, or None once it is gone or no longer an init; pidfd None without
    # pidfd support.
    if not hasattr(os, "pidfd_open"):
        init, parent = status(pid)
        return (None, pid, parent) if init else None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    init, parent = status(pid)
    if init:
        return (fd, pid, parent)
    os.close(fd)
    return None

def realtime(pid, on):
    try:
        if on:
            os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(1))
        else:
            os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
        return True
    except (AttributeError, OSError):
        return False

def raise_reaper(pid, reapers):
    # Raise an init's parent to real-time priority for the kill, once, pinned by a pidfd so that it is
    # put back only while it is still that process. Never the host's init, nor without a pidfd.
    if pid <= 1 or pid in reapers or not hasattr(os, "pidfd_open"):
        return
    try:
        fd = os.pidfd_open(pid)
        own = (os.sched_getscheduler(pid), os.sched_getparam(pid))
    except OSError:
        return
    if own[0] == os.SCHED_OTHER and realtime(pid, True):
        reapers[pid] = (fd, own)
    else:  # already real-time (or batch, idle): left as it is
        os.close(fd)

def lower_reapers(reapers):
    # Every raised parent still alive goes back to its own policy; returns those that could not.
    kept = []
    for pid, (fd, (policy, param)) in reapers.items():
        try:
            if not select.select([fd], [], [], 0)[0]:  # a pidfd is readable once its process has exited
                os.sched_setscheduler(pid, policy, param)
        except ProcessLookupError:
            pass
        except OSError:
            kept.append(pid)
        finally:
            os.close(fd)
    return kept

names = sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d))) if os.path.isdir(base) else []
found = {n: procs(n) for n in names}
report = {"cgroup": base, "containers": {n: {"pids": len(p), "inits": [x for x in p if is_init(x)]} for n, p in found.items()}}
if mode == "kill":
    own = 0 if v2 else own_tasks()
    try:  # a pidfd per container, all open at once
        resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    except (ValueError, OSError):
        pass
    pinned = [(name, p) for name, info in report["containers"].items() for pid in info["inits"] if (p := pin(pid))]
    reapers = {}
    rt = realtime(0, True)
    started = time.monotonic()
    signalled = {}
    try:
        for name, (fd, pid, parent) in pinned:
            if rt:
                raise_reaper(parent, reapers)
                realtime(pid, True)
            try:
                if fd is not None:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
                signalled.setdefault(name, []).append(pid)
            except ProcessLookupError:
                pass
            except BaseException:
                realtime(pid, False)  # still alive: back to normal priority
                raise
    finally:
        sent = time.monotonic()
        for _, (fd, _, _) in pinned:
            if fd is not None:
                os.close(fd)
    deadline = started + timeout
    try:
        # One read a round while the kernel tears the namespaces down (reading every container's cgroup.procs
        # each round took a core from it): v2's cgroup.events says whether any process is left below the
        # parent, v1's pids.current counts them; each container is read only once that says none or at the end.
        while time.monotonic() < deadline:
            state = empty()
            if state is True or (state is None and not any(procs(n) for n in names)):
                break
            time.sleep(0.001 if state is False else 0.005)
        emptied = time.monotonic()
    finally:
        kept = lower_reapers(reapers)
        if rt:
            realtime(0, False)
    left = {n: len(procs(n)) for n in names if procs(n)}
    report.update(signalled=signalled, left=left, seconds=emptied - started, signalled_seconds=sent - started,
                  realtime=rt, reapers=len(reapers), reapers_kept_realtime=kept)
print(json.dumps(report))
"""


# Asks the provider's metadata service from the host itself (it answers only there): the notice, or none.
# http.client, not urllib.request: importing the latter (email, ssl, ...) took longer than the request.
_NOTICE_SCRIPT = r"""
import http.client, json, sys, urllib.parse
url = urllib.parse.urlsplit(sys.argv[1])
conn = (http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection)(url.netloc, timeout=3)
conn.request("GET", (url.path or "/") + ("?" + url.query if url.query else ""))
r = conn.getresponse()
print(json.dumps({"status": r.status, "body": r.read(4096).decode("utf-8", "replace")}))
"""


def _instant(text: str) -> datetime:
    try:
        return datetime.fromtimestamp(float(text), tz=UTC)
    except ValueError:
        moment = datetime.fromisoformat(text)
        if moment.tzinfo is None:
            raise ValueError(f"{text!r} has no time zone") from None
        return moment


@implements(PREEMPTION_NOTICE)
@heartbeating
async def preemption_notice(inp: NoticeInput) -> NoticeOutput:
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
            rc, out, err = await ex.run([*_python(target), url], input=_NOTICE_SCRIPT, timeout=15)
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


async def _run_script(inp: HostCgroup, mode: str, timeout: float) -> dict[str, Any]:
    target = inp.target()
    try:
        async with executor_for(target) as ex:
            rc, out, err = await ex.run([*_python(target), mode, inp.cgroup_parent, str(timeout)],
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


async def live_containers(inp: HostCgroup) -> HostContainers:
    """The host's containers now (a container with no process left is gone)."""
    report = await _run_script(inp, "list", 1.0)
    return HostContainers(host=inp.host, cgroup=report["cgroup"], containers=_states(report))


@implements(LIST_CONTAINERS)
@heartbeating
async def list_containers(inp: ListInput) -> HostContainers:
    return await live_containers(inp)


@implements(KILL_INITS)
@heartbeating
async def kill_inits(inp: KillInitsInput) -> KillInitsOutput:
    report = await _run_script(inp, "kill", inp.verify_within_seconds)
    states = _states(report)
    killed = sorted(report.get("signalled", {}))
    gone_before = sorted(s.name for s in states if not s.processes)
    no_init = sorted(s.name for s in states if s.processes and not s.inits)
    left = report.get("left", {})
    if left:
        detail = ", ".join(f"{n} ({k} processes)" for n, k in sorted(left.items())[:10])
        hint = f"; no PID-namespace init found in: {', '.join(no_init[:10])}" if no_init else ""
        if report["reapers_kept_realtime"]:
            hint += f"; parents left at real-time priority: {report['reapers_kept_realtime'][:10]}"
        raise ApplicationError(
            f"{inp.host}: killed the inits of {len(killed)} containers, but {len(left)} still have processes "
            f"after {inp.verify_within_seconds:g}s: {detail}{hint}",
            {"killed": killed, "left": left}, type="ContainersLeft")
    return KillInitsOutput(host=inp.host, cgroup=report["cgroup"], killed=killed, killed_count=len(killed),
                           already_gone=gone_before,
                           seconds=round(report["seconds"], 4),
                           signalled_seconds=round(report["signalled_seconds"], 4), realtime=report["realtime"],
                           reapers=report["reapers"], reapers_kept_realtime=report["reapers_kept_realtime"])

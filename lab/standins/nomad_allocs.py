"""Nomad stand-in client side: allocations started, failed and stopped as driver processes, and their API views."""

from __future__ import annotations

import re
from typing import Any

from .nomad_model import ALLOC_OMIT_EMPTY, NS_PER_S, alloc_index, by_id, omit_empty, public, task_state

__all__ = ["AllocsMixin"]

# Fields of GET /v1/job/:id/allocations entries (AllocListStub); the full allocation is GET /v1/allocation/:id.
ALLOC_STUB_FIELDS = (
    "ClientDescription", "ClientStatus", "CreateIndex", "CreateTime", "DeploymentStatus", "DesiredDescription",
    "DesiredStatus", "DesiredTransition", "EvalID", "FollowupEvalID", "ID", "JobID", "JobType", "JobVersion",
    "ModifyIndex", "ModifyTime", "Name", "Namespace", "NextAllocation", "NodeID", "NodeName",
    "PreemptedAllocations", "PreemptedByAllocation", "RescheduleTracker", "TaskGroup", "TaskStates",
)
TRANSITION_FIELDS = ("ForceReschedule", "Migrate", "MigrateDisablePlacement", "NoShutdownDelay", "Reschedule")


class AllocsMixin:
    """The client's allocation lifecycle, mixed into NomadState (whose store and driver it uses)."""

    async def _start_alloc(self, alloc_id: str) -> None:
        alloc = self.allocs.get(alloc_id)
        if alloc is None or alloc["DesiredStatus"] != "run":
            return
        if alloc["NodeID"] in self.unhealthy:
            await self._fail_alloc(alloc_id, "failed to start task: node unhealthy", kill=False)
            return
        job = self._job_for_alloc(alloc)
        tg = next((g for g in (job or {}).get("TaskGroups", []) if g["Name"] == alloc["TaskGroup"]), None)
        if tg is None:
            return
        node = self.nodes.get(alloc["NodeID"], {})
        netns = (node.get("Meta") or {}).get("netns")
        now = self.now_ns()
        for task in tg["Tasks"]:
            if task.get("Driver") == "raw_exec" and (task.get("Config") or {}).get("command"):
                env = {str(k): str(v) for k, v in (task.get("Env") or {}).items()}
                env.update({
                    "NOMAD_ALLOC_ID": alloc_id, "NOMAD_ALLOC_NAME": alloc["Name"],
                    "NOMAD_ALLOC_INDEX": str(alloc_index(alloc)), "NOMAD_JOB_NAME": alloc["JobID"],
                    "NOMAD_JOB_ID": alloc["JobID"], "NOMAD_GROUP_NAME": alloc["TaskGroup"],
                    "NOMAD_TASK_NAME": task["Name"], "NOMAD_NAMESPACE": alloc["Namespace"],
                    "NOMAD_DC": node.get("Datacenter", ""), "NOMAD_REGION": self.region,
                    "node_name": node.get("Name", ""),
                })
                try:
                    await self.driver.start(alloc_id, _interpolated(task, node, env), env, netns, self._on_exit)
                except OSError as exc:
                    await self._fail_alloc(alloc_id, f"failed to launch command with args: {exc}", kill=True)
                    return
            alloc["TaskStates"][task["Name"]] = task_state("running", now, "Started", "Task started by client",
                                                           started=now)
        if alloc["DesiredStatus"] != "run" or alloc["ClientStatus"] != "pending":
            # Stopped or failed while starting: make sure nothing is left running.
            await self.driver.kill(alloc_id)
            return
        alloc["ClientStatus"] = "running"
        alloc["ClientDescription"] = "Tasks are running"
        alloc["ModifyIndex"] = self._next()
        alloc["ModifyTime"] = self.now_ns()

    def _on_exit(self, alloc_id: str, task_name: str, code: int) -> None:
        alloc = self.allocs.get(alloc_id)
        if self.stopping or alloc is None or alloc["ClientStatus"] in ("complete", "failed"):
            return
        if alloc["DesiredStatus"] != "run":
            return  # a stop we asked for; _stop_alloc finishes the bookkeeping
        self._spawn(self._fail_alloc(alloc_id, f"Exit Code: {code}", kill=True, task=task_name, code=code))

    async def _fail_alloc(self, alloc_id: str, message: str, kill: bool, task: str | None = None,
                          code: int | None = None) -> None:
        alloc = self.allocs.get(alloc_id)
        if alloc is None or alloc["ClientStatus"] in ("complete", "failed"):
            return
        now = self.now_ns()
        alloc["ClientStatus"] = "failed"
        alloc["ClientDescription"] = "Failed tasks"
        alloc["_failed_at"] = self.clock.time()
        for name, st in alloc["TaskStates"].items():
            event = "Terminated" if code is not None and name == task else "Driver Failure"
            alloc["TaskStates"][name] = task_state("dead", now, event, message, failed=True,
                                                   started=st.get("StartedAt"), finished=now, exit_code=code)
        alloc["ModifyIndex"] = self._next()
        alloc["ModifyTime"] = now
        if kill:
            await self.driver.kill(alloc_id)
        job = self.jobs.get(self.key(alloc["Namespace"], alloc["JobID"]))
        if job is not None and not job["Stop"]:
            tg = next((g for g in job["TaskGroups"] if g["Name"] == alloc["TaskGroup"]), None)
            if tg is not None:
                attempts = len((alloc.get("RescheduleTracker") or {}).get("Events") or [])
                self._followup(alloc, alloc["_failed_at"] + self._reschedule_delay(tg, attempts))

    def _stop_alloc(self, alloc: dict[str, Any], why: str) -> None:
        alloc["DesiredStatus"] = "stop"
        alloc["DesiredDescription"] = why
        alloc["ModifyIndex"] = alloc["AllocModifyIndex"] = self._next()
        alloc["ModifyTime"] = self.now_ns()
        if alloc["ClientStatus"] in ("pending", "running"):
            # Taken now: a purge drops the job and the allocation from the state while the kill goes on.
            self._spawn(self._finish_stop(alloc, self._kill_timeout(alloc)))

    def _kill_timeout(self, alloc: dict[str, Any]) -> float:
        job = self._job_for_alloc(alloc)
        tg = next((g for g in (job or {}).get("TaskGroups", []) if g["Name"] == alloc["TaskGroup"]), None)
        return max(t["KillTimeout"] for t in tg["Tasks"]) / NS_PER_S if tg else 5.0

    async def _finish_stop(self, alloc: dict[str, Any], timeout: float) -> None:
        await self.driver.kill(alloc["ID"], timeout)
        if alloc["ClientStatus"] in ("pending", "running"):
            now = self.now_ns()
            alloc["ClientStatus"] = "complete"
            alloc["ClientDescription"] = "All tasks have completed"
            for name, st in alloc["TaskStates"].items():
                alloc["TaskStates"][name] = task_state("dead", now, "Killed", "Task successfully killed",
                                                       started=st.get("StartedAt"), finished=now)
            alloc["ModifyIndex"] = self._next()
            alloc["ModifyTime"] = now

    def stop_alloc(self, alloc_id: str) -> dict[str, Any]:
        alloc = self.alloc(alloc_id)
        self._stop_alloc(alloc, "alloc is being migrated")
        alloc["DesiredTransition"] = {"Migrate": True}
        ev = self.evaluate(alloc["Namespace"], alloc["JobID"], "alloc-stop")
        return {"EvalID": ev["ID"], "Index": self.index}

    def alloc(self, alloc_id: str) -> dict[str, Any]:
        return by_id(self.allocs, alloc_id, "alloc")

    def alloc_stub(self, alloc: dict[str, Any]) -> dict[str, Any]:
        """A list entry as Nomad's AllocListStub: no AllocatedResources, Job or DeploymentID (read the allocation)."""
        stub = {k: alloc.get(k) for k in ALLOC_STUB_FIELDS}
        stub["DesiredTransition"] = {k: (alloc.get("DesiredTransition") or {}).get(k) for k in TRANSITION_FIELDS}
        stub["DesiredDescription"] = stub["DesiredDescription"] or ""
        stub["FollowupEvalID"] = stub["FollowupEvalID"] or ""
        stub["NextAllocation"] = stub["NextAllocation"] or ""
        stub["PreemptedByAllocation"] = stub["PreemptedByAllocation"] or ""
        return stub

    def alloc_full(self, alloc: dict[str, Any]) -> dict[str, Any]:
        out = public(alloc)
        out.setdefault("DeploymentID", "")
        out["DesiredTransition"] = {k: (alloc.get("DesiredTransition") or {}).get(k) for k in TRANSITION_FIELDS}
        out["Job"] = self._job_for_alloc(alloc)
        # A full allocation has no JobType/JobVersion (list stubs do), and omits its empty links.
        return omit_empty({k: v for k, v in out.items() if k not in ("JobType", "JobVersion")}, ALLOC_OMIT_EMPTY)


def _interpolated(task: dict[str, Any], node: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """The task with ${node.*}, ${attr.*}, ${meta.*} and ${NOMAD_*} replaced in its command and args, as the
    client does (https://developer.hashicorp.com/nomad/docs/runtime/interpolation); unknown ones stay as written."""
    values = {
        "node.unique.id": node.get("ID", ""), "node.unique.name": node.get("Name", ""),
        "node.datacenter": node.get("Datacenter", ""), "node.class": node.get("NodeClass", ""),
        "node.pool": node.get("NodePool", ""), "node.region": env.get("NOMAD_REGION", ""),
        **{f"attr.{k}": str(v) for k, v in (node.get("Attributes") or {}).items()},
        **{f"meta.{k}": str(v) for k, v in (node.get("Meta") or {}).items()},
        **{k: v for k, v in env.items() if k.startswith("NOMAD_")},
    }

    def sub(text: Any) -> Any:
        return re.sub(r"\$\{([^}]+)\}", lambda m: values.get(m.group(1).strip(), m.group(0)), text) \
            if isinstance(text, str) else text

    config = dict(task.get("Config") or {})
    config["command"] = sub(config.get("command"))
    config["args"] = [sub(a) for a in config.get("args") or []]
    return {**task, "Config": config}


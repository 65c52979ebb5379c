"""Nomad stand-in deployments: rolling updates, allocation health and progress deadlines."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from .nomad_model import ACTIVE_DEPLOYMENT, DEFAULT_UPDATE, DEPLOYMENT_TYPES, NS_PER_S, NomadError, by_id, rfc3339

__all__ = ["DeploymentsMixin"]

# https://developer.hashicorp.com/nomad/docs/job-specification/update and the scheduler's reconciler:
# a service or system job with an update block gets a deployment when a new version (or a fresh job)
# places or updates allocations; it succeeds once every group has DesiredTotal healthy allocations
# (a task running for min_healthy_time) and fails on an unhealthy one or at the progress deadline.

# How often the client side re-checks a deployment's allocations for health (seconds of real time).
HEALTH_POLL_S = 0.1


class DeploymentsMixin:
    """Deployments and their watchers, mixed into NomadState (whose store it reads and writes)."""

    def _deployments_of(self, namespace: str, job_id: str) -> list[dict[str, Any]]:
        deps = self.deployments.of(namespace, job_id)
        return sorted(deps, key=lambda d: d["CreateIndex"], reverse=True)

    def latest_deployment(self, namespace: str, job_id: str) -> dict[str, Any] | None:
        deps = self._deployments_of(namespace, job_id)
        return deps[0] if deps else None

    def deployment(self, dep_id: str) -> dict[str, Any]:
        return by_id(self.deployments, dep_id, "deployment")

    def fail_deployment(self, dep_id: str) -> dict[str, Any]:
        """POST /v1/deployment/fail/:id, as an operator would."""
        dep = self.deployment(dep_id)
        if dep["Status"] not in ACTIVE_DEPLOYMENT:
            raise NomadError(500, "can't fail terminal deployment")
        self._end_deployment(dep, "failed", "Deployment marked as failed")
        ev = self.evaluate(dep["Namespace"], dep["JobID"], "deployment-watcher")
        return {"EvalID": ev["ID"], "EvalCreateIndex": ev["CreateIndex"],
                "DeploymentModifyIndex": dep["ModifyIndex"], "RevertedJobVersion": None, "Index": self.index}

    def pause_deployment(self, dep_id: str, pause: bool) -> dict[str, Any]:
        """POST /v1/deployment/pause/:id {"Pause"}: a paused deployment stays active (and blocks scaling)."""
        dep = self.deployment(dep_id)
        if dep["Status"] not in ACTIVE_DEPLOYMENT:
            raise NomadError(500, f"can't {'pause' if pause else 'resume'} terminal deployment")
        if pause:
            self._set_status(dep, "paused", "Deployment is paused")
            return {"EvalID": "", "EvalCreateIndex": 0, "DeploymentModifyIndex": dep["ModifyIndex"],
                    "RevertedJobVersion": None, "Index": self.index}
        self._set_status(dep, "running", "Deployment is running")
        self._arm_progress(dep)
        self._maybe_complete(dep)
        ev = self.evaluate(dep["Namespace"], dep["JobID"], "deployment-watcher")
        return {"EvalID": ev["ID"], "EvalCreateIndex": ev["CreateIndex"], "DeploymentModifyIndex": dep["ModifyIndex"],
                "RevertedJobVersion": None, "Index": self.index}

    def _current_deployment(self, namespace: str, job_id: str, job: dict[str, Any] | None) -> dict[str, Any] | None:
        """The reconciler's cancelUnneededDeployments: the latest deployment if it is for this job version
        and not yet successful; an active one for a stopped job or an older version is cancelled."""
        dep = self.latest_deployment(namespace, job_id)
        if dep is None:
            return None
        active = dep["Status"] in ACTIVE_DEPLOYMENT
        if job is None or job["Stop"]:
            if active:
                self._end_deployment(dep, "cancelled", "Cancelled because job is stopped")
            return None
        if dep["JobCreateIndex"] != job["CreateIndex"] or dep["JobVersion"] != job["Version"]:
            if active:
                self._end_deployment(dep, "cancelled", "Cancelled due to newer version of job")
            return None
        return None if dep["Status"] == "successful" else dep

    def _deploy_group(self, job: dict[str, Any], tg: dict[str, Any], dep: dict[str, Any] | None, desired: int,
                      had_running: bool, updating: bool) -> dict[str, Any] | None:
        """The reconciler's createDeployment for one group; returns the job's deployment (maybe new)."""
        strategy = tg.get("Update") or {}
        if dep is not None and tg["Name"] in dep["TaskGroups"]:
            return dep
        if job["Type"] not in DEPLOYMENT_TYPES or int(strategy.get("MaxParallel") or 0) <= 0 or desired <= 0:
            return dep
        if had_running and not updating:
            return dep
        if dep is None:
            dep = self._new_deployment(job)
        deadline = int(strategy.get("ProgressDeadline") or 0)
        dep["TaskGroups"][tg["Name"]] = {
            "AutoPromote": bool(strategy.get("AutoPromote")), "AutoRevert": bool(strategy.get("AutoRevert")),
            "DesiredCanaries": 0, "DesiredTotal": desired, "HealthyAllocs": 0, "PlacedAllocs": 0,
            "PlacedCanaries": None, "ProgressDeadline": deadline, "Promoted": False,
            "RequireProgressBy": rfc3339(self.clock.time() + deadline / NS_PER_S) if deadline else None,
            "UnhealthyAllocs": 0,
        }
        self._arm_progress(dep)
        return dep

    def _new_deployment(self, job: dict[str, Any]) -> dict[str, Any]:
        idx = self._next()
        now = self.now_ns()
        dep = {
            "ID": str(uuid.uuid4()), "Namespace": job["Namespace"], "JobID": job["ID"], "JobVersion": job["Version"],
            "JobModifyIndex": job["JobModifyIndex"], "JobSpecModifyIndex": job["JobModifyIndex"],
            "JobCreateIndex": job["CreateIndex"], "IsMultiregion": False, "EvalPriority": job["Priority"],
            "Status": "running", "StatusDescription": "Deployment is running", "TaskGroups": {},
            "CreateIndex": idx, "ModifyIndex": idx, "CreateTime": now, "ModifyTime": now,
        }
        self.deployments[dep["ID"]] = dep
        self._watch_deployment(dep)
        return dep

    def _set_status(self, dep: dict[str, Any], status: str, description: str) -> None:
        dep["Status"], dep["StatusDescription"] = status, description
        dep["ModifyIndex"] = self._next()
        dep["ModifyTime"] = self.now_ns()

    def _maybe_complete(self, dep: dict[str, Any]) -> bool:
        """A running deployment whose groups all have DesiredTotal healthy allocations is successful."""
        if dep["Status"] != "running" or any(g["HealthyAllocs"] < g["DesiredTotal"] for g in dep["TaskGroups"].values()):
            return False
        self._end_deployment(dep, "successful", "Deployment completed successfully")
        return True

    def _end_deployment(self, dep: dict[str, Any], status: str, description: str) -> None:
        self._set_status(dep, status, description)
        if status != "successful":
            return
        # A successful deployment marks its job version stable.
        key = self.key(dep["Namespace"], dep["JobID"])
        for job in [self.jobs.get(key), *self.versions.get(key, [])]:
            if job is not None and job["Version"] == dep["JobVersion"] and job["CreateIndex"] == dep["JobCreateIndex"]:
                job["Stable"] = True

    def _join_deployment(self, alloc: dict[str, Any], dep: dict[str, Any] | None) -> None:
        """A placed or in-place updated allocation becomes part of an active deployment: health unknown."""
        if dep is None or dep["Status"] not in ACTIVE_DEPLOYMENT or alloc["TaskGroup"] not in dep["TaskGroups"]:
            return
        if alloc.get("DeploymentID") == dep["ID"]:
            return
        alloc["DeploymentID"] = dep["ID"]
        alloc["DeploymentStatus"] = None
        dep["TaskGroups"][alloc["TaskGroup"]]["PlacedAllocs"] += 1
        self._spawn(self._watch_health(alloc["ID"], dep["ID"]))

    def _destructive_limit(self, tg: dict[str, Any], dep: dict[str, Any] | None, live: list[dict[str, Any]],
                           wanted: int) -> int:
        """How many old-spec allocations may be replaced now: max_parallel less those of the deployment
        not yet healthy (none once one is unhealthy or the deployment is not running); all without an update block."""
        strategy = tg.get("Update") or {}
        if not wanted or int(strategy.get("MaxParallel") or 0) <= 0 or dep is None:
            return wanted
        if dep["Status"] != "running":  # failed, paused, ...
            return 0
        part = [a for a in live if a.get("DeploymentID") == dep["ID"]]
        if any((a.get("DeploymentStatus") or {}).get("Healthy") is False for a in part):
            return 0
        pending = sum(1 for a in part if not (a.get("DeploymentStatus") or {}).get("Healthy"))
        return max(0, min(wanted, int(strategy["MaxParallel"]) - pending))

    def _strategy(self, alloc: dict[str, Any]) -> dict[str, Any]:
        job = self._job_for_alloc(alloc) or {}
        tg = next((g for g in job.get("TaskGroups", []) if g["Name"] == alloc["TaskGroup"]), {})
        return tg.get("Update") or DEFAULT_UPDATE

    async def _watch_health(self, alloc_id: str, dep_id: str) -> None:
        """The client's allocation health tracker without service checks: healthy once its tasks have run
        for min_healthy_time, unhealthy if one stops first or healthy_deadline passes (real time, as the
        task processes are real)."""
        loop = asyncio.get_running_loop()
        alloc = self.allocs.get(alloc_id)
        if alloc is None:
            return
        strategy = self._strategy(alloc)
        if strategy.get("HealthCheck") == "manual":
            return
        min_healthy = int(strategy.get("MinHealthyTime") or 0) / NS_PER_S
        healthy_by = loop.time() + (int(strategy.get("HealthyDeadline") or 0) / NS_PER_S or float("inf"))
        running_since: float | None = None
        while True:
            alloc, dep = self.allocs.get(alloc_id), self.deployments.get(dep_id)
            if (alloc is None or dep is None or dep["Status"] not in ACTIVE_DEPLOYMENT
                    or alloc.get("DeploymentID") != dep_id or alloc.get("DeploymentStatus") is not None
                    or alloc["DesiredStatus"] != "run"):
                return
            now = loop.time()
            if alloc["ClientStatus"] in ("failed", "complete", "lost"):
                self._set_health(alloc, dep, False)
                return
            if alloc["ClientStatus"] == "running":
                running_since = now if running_since is None else running_since
                if now - running_since >= min_healthy:
                    self._set_health(alloc, dep, True)
                    return
            if now >= healthy_by:
                self._set_health(alloc, dep, False)
                return
            await asyncio.sleep(HEALTH_POLL_S)

    def _set_health(self, alloc: dict[str, Any], dep: dict[str, Any], healthy: bool) -> None:
        idx = self._next()
        alloc["DeploymentStatus"] = {"Canary": False, "Healthy": healthy, "ModifyIndex": idx,
                                     "Timestamp": rfc3339(self.clock.time())}
        alloc["ModifyIndex"] = idx
        state = dep["TaskGroups"][alloc["TaskGroup"]]
        state["HealthyAllocs" if healthy else "UnhealthyAllocs"] += 1
        if not healthy:
            # With a progress deadline the failed allocation may still be rescheduled within the deployment,
            # which then fails at the deadline; without one the first unhealthy allocation fails it.
            if not state["ProgressDeadline"]:
                self._end_deployment(dep, "failed", "Failed due to unhealthy allocations")
            return
        if state["ProgressDeadline"]:
            state["RequireProgressBy"] = rfc3339(self.clock.time() + state["ProgressDeadline"] / NS_PER_S)
            self._arm_progress(dep)
        if not self._maybe_complete(dep) and self.key(dep["Namespace"], dep["JobID"]) in self.jobs:
            self.evaluate(dep["Namespace"], dep["JobID"], "deployment-watcher")  # the next batch of a rolling update

    def _arm_progress(self, dep: dict[str, Any]) -> None:
        """(Re)start the progress deadline: the longest of the groups' (0 in all of them: none)."""
        deadlines = [g["ProgressDeadline"] for g in dep["TaskGroups"].values() if g["ProgressDeadline"]]
        deadline = max(deadlines) / NS_PER_S if deadlines else float("inf")
        self._progress_by[dep["ID"]] = asyncio.get_running_loop().time() + deadline

    def _watch_deployment(self, dep: dict[str, Any]) -> None:
        """Arm the progress deadline and the health trackers of allocations whose health is still unknown."""
        self._arm_progress(dep)
        self._spawn(self._watch_progress(dep["ID"]))
        for alloc in self.allocs.of(dep["Namespace"], dep["JobID"]):
            if alloc.get("DeploymentID") == dep["ID"] and alloc.get("DeploymentStatus") is None:
                self._spawn(self._watch_health(alloc["ID"], dep["ID"]))

    async def _watch_progress(self, dep_id: str) -> None:
        loop = asyncio.get_running_loop()
        while True:
            dep = self.deployments.get(dep_id)
            if dep is None or dep["Status"] not in ACTIVE_DEPLOYMENT:
                self._progress_by.pop(dep_id, None)
                return
            if dep["Status"] == "running" and loop.time() >= self._progress_by.get(dep_id, float("inf")):
                self._end_deployment(dep, "failed", "Failed due to progress deadline")
                return
            await asyncio.sleep(0.5)

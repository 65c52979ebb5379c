"""Nomad cluster state: nodes, jobs and versions, evaluations, a spread scheduler and alloc lifecycle."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import hashlib
import json
import re
import uuid
from pathlib import Path
from typing import Any

from .clock import Clock, RealClock
from .nomad_driver import ProcessDriver
from .persist import load_json, save_json

__all__ = ["NomadState", "NomadError", "node_id_for", "public"]

NS_PER_S = 1_000_000_000
NOMAD_VERSION = "1.1.6"
ENFORCE_PREFIX = "Enforcing job modify index"
DEFAULT_RESCHEDULE = {
    "Attempts": 0,
    "Interval": 0,
    "Delay": 30 * NS_PER_S,
    "DelayFunction": "exponential",
    "MaxDelay": 3600 * NS_PER_S,
    "Unlimited": True,
}
# Server-managed job fields: excluded when deciding whether a resubmission changed the spec.
SERVER_JOB_FIELDS = {
    "Status", "StatusDescription", "Version", "JobModifyIndex", "ModifyIndex", "CreateIndex",
    "SubmitTime", "Stable",
}
_NS = uuid.UUID("6ba7b812-9dad-11d1-80b4-00c04fd430c9")
# The update block Nomad gives every group of a service or system job that names none (or only some fields):
# https://developer.hashicorp.com/nomad/docs/job-specification/update
DEFAULT_UPDATE = {
    "AutoPromote": False, "AutoRevert": False, "Canary": 0, "HealthCheck": "checks",
    "HealthyDeadline": 300 * NS_PER_S, "MaxParallel": 1, "MinHealthyTime": 10 * NS_PER_S,
    "ProgressDeadline": 600 * NS_PER_S, "Stagger": 30 * NS_PER_S,
}
DEPLOYMENT_TYPES = ("service", "system")
ACTIVE_DEPLOYMENT = ("initializing", "pending", "running", "paused", "blocked", "unblocking")
SCALE_BLOCKED = "job scaling blocked due to active deployment"
# How often the client side re-checks a deployment's allocations for health (seconds of real time).
HEALTH_POLL_S = 0.1
# Fields of GET /v1/job/:id/allocations entries (AllocListStub); the full allocation is GET /v1/allocation/:id.
ALLOC_STUB_FIELDS = (
    "ClientDescription", "ClientStatus", "CreateIndex", "CreateTime", "DeploymentStatus", "DesiredDescription",
    "DesiredStatus", "DesiredTransition", "EvalID", "FollowupEvalID", "ID", "JobID", "JobType", "JobVersion",
    "ModifyIndex", "ModifyTime", "Name", "Namespace", "NextAllocation", "NodeID", "NodeName",
    "PreemptedAllocations", "PreemptedByAllocation", "RescheduleTracker", "TaskGroup", "TaskStates",
)
TRANSITION_FIELDS = ("ForceReschedule", "Migrate", "MigrateDisablePlacement", "NoShutdownDelay", "Reschedule")


class NomadError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def node_id_for(name: str) -> str:
    return str(uuid.uuid5(_NS, f"nomad-node:{name}"))


def public(obj: dict[str, Any]) -> dict[str, Any]:
    """Drop the stand-in's bookkeeping keys (prefixed _) from an API object."""
    return {k: v for k, v in obj.items() if not k.startswith("_")}


def _rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _given(block: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (block or {}).items() if v is not None}


def _spec(job: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in job.items() if k not in SERVER_JOB_FIELDS}


class NomadState:
    def __init__(
        self,
        nodes: list[dict[str, Any]],
        datacenter: str = "dc1",
        region: str = "global",
        clock: Clock | None = None,
        state_dir: Path | None = None,
        driver: ProcessDriver | None = None,
        http_addr: str = "127.0.0.1:4646",
    ) -> None:
        self.clock = clock or RealClock()
        self.datacenter = datacenter
        self.region = region
        self.state_dir = Path(state_dir) if state_dir else None
        self.driver = driver or ProcessDriver(self.state_dir / "allocs" if self.state_dir else None)
        self.index = 10
        self.nodes: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, dict[str, Any]] = {}  # "namespace/id" -> current job
        self.versions: dict[str, list[dict[str, Any]]] = {}  # newest first
        self.queued: dict[str, dict[str, int]] = {}
        self.allocs: dict[str, dict[str, Any]] = {}
        self.evals: dict[str, dict[str, Any]] = {}
        self.deployments: dict[str, dict[str, Any]] = {}
        self._progress_by: dict[str, float] = {}  # deployment ID -> event-loop time of its progress deadline
        self.unhealthy: set[str] = set()  # node IDs whose allocs fail (lab fault)
        self.dirty = False
        self.stopping = False  # stand-in shutdown: task exits then are not failures
        self._tasks: set[asyncio.Task] = set()
        for spec in nodes:
            self._add_node(spec, http_addr)
        self._load_state()

    # ---- bookkeeping ---------------------------------------------------------------
    def _next(self) -> int:
        self.index += 1
        self.dirty = True
        return self.index

    def now_ns(self) -> int:
        return int(self.clock.time() * NS_PER_S)

    @staticmethod
    def key(namespace: str, job_id: str) -> str:
        return f"{namespace}/{job_id}"

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- persistence ------------------------------------------------------------------
    @property
    def state_file(self) -> Path | None:
        return self.state_dir / "nomad-state.json" if self.state_dir else None

    def _load_state(self) -> None:
        if self.state_file is None:
            return
        data = load_json(self.state_file)
        if not data:
            return
        self.index = data["index"]
        self.jobs = data["jobs"]
        self.versions = data["versions"]
        self.queued = data["queued"]
        self.allocs = data["allocs"]
        self.evals = data["evals"]
        self.deployments = data.get("deployments", {})
        for nid, saved in data.get("nodes", {}).items():
            if nid in self.nodes:
                for f in ("SchedulingEligibility", "Drain", "DrainStrategy", "LastDrain", "ModifyIndex"):
                    self.nodes[nid][f] = saved.get(f, self.nodes[nid][f])
        # Processes died with the previous stand-in; the client re-launches them on restore.
        for alloc in self.allocs.values():
            if alloc["DesiredStatus"] == "run" and alloc["ClientStatus"] in ("pending", "running"):
                alloc["ClientStatus"] = "pending"
                alloc["_restore"] = True

    def restore_tasks(self) -> None:
        """Call on the server loop after startup to restart restored allocs and watch active deployments."""
        for alloc in self.allocs.values():
            if alloc.pop("_restore", False):
                self._spawn(self._start_alloc(alloc["ID"]))
        for dep in self.deployments.values():
            if dep["Status"] in ACTIVE_DEPLOYMENT:
                self._watch_deployment(dep)

    def save_state(self) -> None:
        if self.state_file is None or not self.dirty:
            return
        self.dirty = False
        save_json(
            self.state_file,
            {
                "index": self.index,
                "jobs": self.jobs,
                "versions": self.versions,
                "queued": self.queued,
                "allocs": self.allocs,
                "evals": self.evals,
                "deployments": self.deployments,
                "nodes": self.nodes,
            },
        )

    # ---- nodes ---------------------------------------------------------------------------
    def _add_node(self, spec: dict[str, Any], http_addr: str) -> None:
        name = spec["name"]
        nid = node_id_for(name)
        now = self.clock.time()
        self.nodes[nid] = {
            "ID": nid,
            "SecretID": "",
            "Datacenter": spec.get("dc") or self.datacenter,
            "Name": name,
            "HTTPAddr": spec.get("http_addr") or http_addr,
            "TLSEnabled": False,
            "Attributes": {
                "driver.raw_exec": "1",
                "kernel.name": "linux",
                "os.name": "linux",
                "cpu.arch": "amd64",
                "unique.hostname": name,
                "nomad.version": NOMAD_VERSION,
                "unique.network.ip-address": spec.get("address", "127.0.0.1"),
            },
            "Meta": dict(spec.get("meta") or {}),
            "NodeClass": spec.get("class", ""),
            "NodePool": spec.get("pool", "default"),
            "ComputedClass": "v1:" + _hash([spec.get("class", ""), spec.get("meta")])[:19],
            "Drain": False,
            "DrainStrategy": None,
            "SchedulingEligibility": "eligible",
            "Status": "ready",
            "StatusDescription": "",
            "StatusUpdatedAt": int(now),
            "Events": [
                {"Message": "Node registered", "Subsystem": "Cluster", "Details": None,
                 "Timestamp": _rfc3339(now), "CreateIndex": 0}
            ],
            "Drivers": {
                "raw_exec": {"Attributes": {"driver.raw_exec": "true"}, "Detected": True, "Healthy": True,
                             "HealthDescription": "Healthy", "UpdateTime": _rfc3339(now)}
            },
            "NodeResources": {"Cpu": {"CpuShares": 4000}, "Memory": {"MemoryMB": 8192}, "Disk": {"DiskMB": 100000}},
            "ReservedResources": {"Cpu": {"CpuShares": 0}, "Memory": {"MemoryMB": 0}, "Disk": {"DiskMB": 0}},
            "LastDrain": None,
            "CreateIndex": 5,
            "ModifyIndex": 5,
        }

    def node(self, node_id: str) -> dict[str, Any]:
        node = self.nodes.get(node_id)
        if node is None:
            # Nomad also resolves unique ID prefixes; the lab accepts names too for convenience.
            matches = [n for n in self.nodes.values() if n["ID"].startswith(node_id) or n["Name"] == node_id]
            if len(matches) == 1:
                return matches[0]
            raise NomadError(404, "node not found")
        return node

    def node_stub(self, node: dict[str, Any]) -> dict[str, Any]:
        return {
            "Address": node["Attributes"]["unique.network.ip-address"],
            "ID": node["ID"],
            "Datacenter": node["Datacenter"],
            "Name": node["Name"],
            "NodeClass": node["NodeClass"],
            "NodePool": node["NodePool"],
            "Version": NOMAD_VERSION,
            "Drain": node["Drain"],
            "SchedulingEligibility": node["SchedulingEligibility"],
            "Status": node["Status"],
            "StatusDescription": node["StatusDescription"],
            "Drivers": node["Drivers"],
            "LastDrain": node["LastDrain"],
            "CreateIndex": node["CreateIndex"],
            "ModifyIndex": node["ModifyIndex"],
        }

    def set_eligibility(self, node_id: str, eligibility: str) -> dict[str, Any]:
        node = self.node(node_id)
        if eligibility not in ("eligible", "ineligible"):
            raise NomadError(400, f'invalid scheduling eligibility "{eligibility}"')
        if node["Drain"] and eligibility == "eligible":
            raise NomadError(400, "can not set node's scheduling eligibility to eligible while it is draining")
        node["SchedulingEligibility"] = eligibility
        node["ModifyIndex"] = self._next()
        evals = self.unblock() if eligibility == "eligible" else []
        if eligibility == "eligible":  # system jobs get a node-update evaluation, as in Nomad
            evals += [self.evaluate(j["Namespace"], j["ID"], "node-update", node_id=node["ID"])["ID"]
                      for j in list(self.jobs.values()) if j["Type"] == "system" and not j["Stop"]]
        return {"EvalIDs": evals, "EvalCreateIndex": self.index if evals else 0, "NodeModifyIndex": node["ModifyIndex"]}

    def drain(self, node_id: str, spec: dict[str, Any] | None, mark_eligible: bool, meta: dict | None) -> dict[str, Any]:
        node = self.node(node_id)
        now = self.clock.time()
        evals: list[str] = []
        if spec:
            node["Drain"] = True
            node["SchedulingEligibility"] = "ineligible"
            deadline = int(spec.get("Deadline") or 0)
            node["DrainStrategy"] = {
                "DrainSpec": {"Deadline": deadline, "IgnoreSystemJobs": bool(spec.get("IgnoreSystemJobs"))},
                "ForceDeadline": _rfc3339(now + deadline / NS_PER_S) if deadline > 0 else "0001-01-01T00:00:00Z",
                "StartedAt": _rfc3339(now),
            }
            node["ModifyIndex"] = self._next()
            evals = self._migrate_off(node)
            # Migrations here are immediate, so the drain completes at once, as Nomad
            # reports it: drain strategy cleared, node left ineligible.
            node["Drain"] = False
            node["DrainStrategy"] = None
            node["LastDrain"] = {"Status": "complete", "StartedAt": _rfc3339(now), "UpdatedAt": _rfc3339(now),
                                 "AccessorID": "", "Meta": meta or {}}
        else:
            node["Drain"] = False
            node["DrainStrategy"] = None
            if mark_eligible:
                node["SchedulingEligibility"] = "eligible"
                evals = self.unblock()
            if node["LastDrain"] and node["LastDrain"]["Status"] == "draining":
                node["LastDrain"]["Status"] = "canceled"
        node["ModifyIndex"] = self._next()
        return {"EvalIDs": evals, "EvalCreateIndex": self.index if evals else 0, "NodeModifyIndex": node["ModifyIndex"]}

    def _migrate_off(self, node: dict[str, Any]) -> list[str]:
        jobs = set()
        for alloc in list(self.allocs.values()):
            if alloc["NodeID"] == node["ID"] and self._live(alloc):
                self._stop_alloc(alloc, "alloc is being migrated")
                alloc["DesiredTransition"] = {"Migrate": True}
                jobs.add((alloc["Namespace"], alloc["JobID"]))
        return [self.evaluate(ns, jid, "node-drain", node_id=node["ID"])["ID"] for ns, jid in sorted(jobs)]

    # ---- lab faults ----------------------------------------------------------------------
    def fault_unhealthy(self, node_ref: str) -> dict[str, Any]:
        node = self.node(node_ref)
        self.unhealthy.add(node["ID"])
        for alloc in list(self.allocs.values()):
            if alloc["NodeID"] == node["ID"] and self._live(alloc):
                self._spawn(self._fail_alloc(alloc["ID"], "Task failed: node unhealthy", kill=True))
        return node

    def clear_faults(self) -> None:
        self.unhealthy.clear()

    # ---- jobs ------------------------------------------------------------------------------
    def _normalize(self, job: dict[str, Any]) -> dict[str, Any]:
        job = copy.deepcopy(job)
        if not job.get("ID"):
            raise NomadError(400, "Job ID hasn't been provided")
        job.setdefault("Name", job["ID"])
        job["Namespace"] = job.get("Namespace") or "default"
        job["Region"] = job.get("Region") or self.region
        job["Type"] = job.get("Type") or "service"
        job["Priority"] = job.get("Priority") or 50
        job["Datacenters"] = job.get("Datacenters") or ["*"]
        job.setdefault("Meta", None)
        job.setdefault("ParentID", "")
        job["Stop"] = bool(job.get("Stop", False))
        job_update = _given(job.get("Update"))
        if job["Type"] in DEPLOYMENT_TYPES:
            job["Update"] = {**{k: type(v)() for k, v in DEFAULT_UPDATE.items()}, "MaxParallel": 1,
                             "Stagger": DEFAULT_UPDATE["Stagger"], **job_update}
        else:
            job["Update"] = None
        groups = job.get("TaskGroups") or []
        if not groups:
            raise NomadError(500, "1 error occurred:\n\t* Missing job task groups\n\n")
        for tg in groups:
            if not tg.get("Name"):
                raise NomadError(500, "1 error occurred:\n\t* Missing task group name\n\n")
            tg["Count"] = 1 if tg.get("Count") is None else int(tg["Count"])
            tg["ReschedulePolicy"] = {**DEFAULT_RESCHEDULE, **(tg.get("ReschedulePolicy") or {})}
            # Group update = defaults, then the job's update block, then the group's (fields given win).
            tg["Update"] = ({**DEFAULT_UPDATE, **job_update, **_given(tg.get("Update"))}
                            if job["Type"] in DEPLOYMENT_TYPES else None)
            if not tg.get("Tasks"):
                raise NomadError(500, f"1 error occurred:\n\t* Missing tasks for task group {tg['Name']}\n\n")
            for task in tg["Tasks"]:
                task.setdefault("Config", {})
                task.setdefault("Env", None)
                task["KillTimeout"] = task.get("KillTimeout") or 5 * NS_PER_S
        return job

    def get_job(self, namespace: str, job_id: str) -> dict[str, Any]:
        job = self.jobs.get(self.key(namespace, job_id))
        if job is None:
            raise NomadError(404, "job not found")
        return self.job_view(job)

    def job_view(self, job: dict[str, Any]) -> dict[str, Any]:
        view = copy.deepcopy(job)
        view["Status"] = self._job_status(job)
        return view

    def _job_status(self, job: dict[str, Any]) -> str:
        if any(self._live(a) for a in self._job_allocs(job["Namespace"], job["ID"])):
            return "running"
        return "dead" if job["Stop"] else "pending"

    def register(self, job: dict[str, Any], enforce: bool = False, modify_index: int = 0,
                 trigger: str = "job-register") -> dict[str, Any]:
        job = self._normalize(job)
        key = self.key(job["Namespace"], job["ID"])
        existing = self.jobs.get(key)
        if enforce:
            if existing is not None:
                if modify_index == 0:
                    raise NomadError(500, f"{ENFORCE_PREFIX} 0: job already exists")
                if modify_index != existing["JobModifyIndex"]:
                    raise NomadError(
                        500,
                        f"{ENFORCE_PREFIX} {modify_index}: job exists with conflicting job modify index: "
                        f"{existing['JobModifyIndex']}",
                    )
            elif modify_index != 0:
                raise NomadError(500, f"{ENFORCE_PREFIX} {modify_index}: job does not exist")
        idx = self._next()
        if existing is None:
            job.update(Version=0, CreateIndex=idx, JobModifyIndex=idx)
        elif _spec(existing) != _spec(job):
            job.update(Version=existing["Version"] + 1, CreateIndex=existing["CreateIndex"], JobModifyIndex=idx)
        else:
            job.update(Version=existing["Version"], CreateIndex=existing["CreateIndex"],
                       JobModifyIndex=existing["JobModifyIndex"])
        job.update(ModifyIndex=idx, SubmitTime=self.now_ns(), Stable=False, StatusDescription="")
        job["Status"] = "pending"
        self.jobs[key] = job
        versions = self.versions.setdefault(key, [])
        if not versions or versions[0]["Version"] != job["Version"]:
            versions.insert(0, copy.deepcopy(job))
        else:
            versions[0] = copy.deepcopy(job)
        ev = self.evaluate(job["Namespace"], job["ID"], trigger)
        return {"EvalID": ev["ID"], "EvalCreateIndex": ev["CreateIndex"], "JobModifyIndex": job["JobModifyIndex"],
                "Warnings": "", "Index": self.index}

    def deregister(self, namespace: str, job_id: str, purge: bool) -> dict[str, Any]:
        key = self.key(namespace, job_id)
        job = self.jobs.get(key)
        if job is None:
            raise NomadError(404, "job not found")
        if not purge:
            stopped = copy.deepcopy(job)
            stopped["Stop"] = True
            resp = self.register(stopped, trigger="job-deregister")
            resp.update(VolumeEvalID="", VolumeEvalIndex=0)
            resp.pop("Warnings", None)
            return resp
        del self.jobs[key]
        self.versions.pop(key, None)
        self.queued.pop(key, None)
        ev = self.evaluate(namespace, job_id, "job-deregister")
        # As in Nomad, a purge drops the job's allocations and deployments from the state store at once;
        # their tasks are still being killed (kill_timeout) on the client.
        for alloc in self._job_allocs(namespace, job_id):
            del self.allocs[alloc["ID"]]
        for dep in self._deployments_of(namespace, job_id):
            del self.deployments[dep["ID"]]
        return {"EvalID": ev["ID"], "EvalCreateIndex": ev["CreateIndex"], "JobModifyIndex": ev["CreateIndex"],
                "VolumeEvalID": "", "VolumeEvalIndex": 0, "Index": self.index}

    def scale(self, namespace: str, job_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Nomad's Job.Scale, checks in its order: arguments, job, group, active deployment, modify index."""
        group = (body.get("Target") or {}).get("Group")
        if not group:
            raise NomadError(400, "missing task group name for scaling action")
        count = body.get("Count")
        if count is not None and int(count) < 0:
            raise NomadError(400, "scaling action count can't be negative")
        job = self.jobs.get(self.key(namespace, job_id))
        if job is None:
            raise NomadError(404, f'job "{job_id}" not found')
        if job["Type"] == "system" and count is not None and int(count) > 1:
            raise NomadError(400, 'jobs of type "system" can only be scaled to 1 or 0')
        tg = next((g for g in job["TaskGroups"] if g["Name"] == group), None)
        if tg is None:
            raise NomadError(400, f'task group "{group}" specified for scaling does not exist in job')
        if count is None:
            # A scaling event without a count only records a message; no new version.
            return {"EvalID": "", "EvalCreateIndex": 0, "JobModifyIndex": job["ModifyIndex"],
                    "Warnings": "", "Index": self.index}
        latest = self.latest_deployment(namespace, job_id)
        if latest is not None and latest["Status"] in ACTIVE_DEPLOYMENT and latest["JobCreateIndex"] == job["CreateIndex"]:
            raise NomadError(400, SCALE_BLOCKED)
        # Scale enforces JobModifyIndex whenever it is given, whatever EnforceIndex says.
        modify_index = int(body.get("JobModifyIndex") or 0)
        if modify_index and modify_index != job["JobModifyIndex"]:
            raise NomadError(500, f"{ENFORCE_PREFIX} {modify_index}: job exists with conflicting job modify "
                                  f"index: {job['JobModifyIndex']}")
        new = copy.deepcopy(job)
        next(g for g in new["TaskGroups"] if g["Name"] == group)["Count"] = int(count)
        return self.register(new, trigger="job-scaling")

    def scale_status(self, namespace: str, job_id: str) -> dict[str, Any]:
        job = self.jobs.get(self.key(namespace, job_id))
        if job is None:
            raise NomadError(404, "job not found")
        groups = {}
        for tg in job["TaskGroups"]:
            allocs = [a for a in self._job_allocs(namespace, job_id) if a["TaskGroup"] == tg["Name"]]
            groups[tg["Name"]] = {
                "Desired": tg["Count"],
                "Placed": sum(1 for a in allocs if self._live(a)),
                "Running": sum(1 for a in allocs if a["ClientStatus"] == "running"),
                "Healthy": sum(1 for a in allocs if a["ClientStatus"] == "running"),
                "Unhealthy": 0,
                "Events": None,
            }
        return {"JobID": job_id, "Namespace": namespace, "JobCreateIndex": job["CreateIndex"],
                "JobModifyIndex": job["JobModifyIndex"], "JobStopped": job["Stop"], "TaskGroups": groups}

    def summary(self, namespace: str, job_id: str) -> dict[str, Any]:
        key = self.key(namespace, job_id)
        job = self.jobs.get(key)
        if job is None:
            raise NomadError(404, "job not found")
        out = {}
        for tg in job["TaskGroups"]:
            allocs = [a for a in self._job_allocs(namespace, job_id) if a["TaskGroup"] == tg["Name"]]
            out[tg["Name"]] = {
                "Queued": self.queued.get(key, {}).get(tg["Name"], 0),
                "Complete": sum(1 for a in allocs if a["ClientStatus"] == "complete"),
                "Failed": sum(1 for a in allocs if a["ClientStatus"] == "failed"),
                "Running": sum(1 for a in allocs if a["ClientStatus"] == "running"),
                "Starting": sum(1 for a in allocs if a["ClientStatus"] == "pending"),
                "Lost": sum(1 for a in allocs if a["ClientStatus"] == "lost"),
                "Unknown": 0,
            }
        return {"JobID": job_id, "Namespace": namespace, "Summary": out,
                "Children": {"Pending": 0, "Running": 0, "Dead": 0},
                "CreateIndex": job["CreateIndex"], "ModifyIndex": job["ModifyIndex"]}

    def job_stub(self, job: dict[str, Any]) -> dict[str, Any]:
        return {
            "ID": job["ID"], "ParentID": job["ParentID"], "Name": job["Name"], "Namespace": job["Namespace"],
            "Datacenters": job["Datacenters"], "Type": job["Type"], "Priority": job["Priority"],
            "Periodic": False, "ParameterizedJob": False, "Stop": job["Stop"], "Status": self._job_status(job),
            "StatusDescription": "", "JobSummary": self.summary(job["Namespace"], job["ID"]),
            "CreateIndex": job["CreateIndex"], "ModifyIndex": job["ModifyIndex"],
            "JobModifyIndex": job["JobModifyIndex"], "SubmitTime": job["SubmitTime"],
        }

    # ---- deployments -----------------------------------------------------------------------
    # https://developer.hashicorp.com/nomad/docs/job-specification/update and the scheduler's reconciler:
    # a service or system job with an update block gets a deployment when a new version (or a fresh job)
    # places or updates allocations; it succeeds once every group has DesiredTotal healthy allocations
    # (a task running for min_healthy_time) and fails on an unhealthy one or at the progress deadline.
    def _deployments_of(self, namespace: str, job_id: str) -> list[dict[str, Any]]:
        deps = [d for d in self.deployments.values() if d["JobID"] == job_id and d["Namespace"] == namespace]
        return sorted(deps, key=lambda d: d["CreateIndex"], reverse=True)

    def latest_deployment(self, namespace: str, job_id: str) -> dict[str, Any] | None:
        deps = self._deployments_of(namespace, job_id)
        return deps[0] if deps else None

    def deployment(self, dep_id: str) -> dict[str, Any]:
        dep = self.deployments.get(dep_id)
        if dep is None:
            matches = [d for d in self.deployments.values() if d["ID"].startswith(dep_id)] if len(dep_id) >= 2 else []
            if len(matches) != 1:
                raise NomadError(404, "deployment not found")
            dep = matches[0]
        return dep

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
            "RequireProgressBy": _rfc3339(self.clock.time() + deadline / NS_PER_S) if deadline else None,
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
                                     "Timestamp": _rfc3339(self.clock.time())}
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
            state["RequireProgressBy"] = _rfc3339(self.clock.time() + state["ProgressDeadline"] / NS_PER_S)
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
        for alloc in self.allocs.values():
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

    # ---- evaluations and scheduling ------------------------------------------------------
    def evaluate(self, namespace: str, job_id: str, trigger: str, node_id: str = "") -> dict[str, Any]:
        job = self.jobs.get(self.key(namespace, job_id))
        idx = self._next()
        now = self.now_ns()
        ev = {
            "ID": str(uuid.uuid4()), "Namespace": namespace, "Priority": job["Priority"] if job else 50,
            "Type": job["Type"] if job else "service", "TriggeredBy": trigger, "JobID": job_id,
            "JobModifyIndex": job["JobModifyIndex"] if job else 0, "NodeID": node_id, "NodeModifyIndex": 0,
            "DeploymentID": "", "Status": "pending", "StatusDescription": "", "Wait": 0, "WaitUntil": None,
            "NextEval": "", "PreviousEval": "", "BlockedEval": "", "RelatedEvals": None,
            "FailedTGAllocs": None, "ClassEligibility": None, "QuotaLimitReached": "",
            "EscapedComputedClass": False, "AnnotatePlan": False, "QueuedAllocations": {},
            "SnapshotIndex": idx, "CreateIndex": idx, "ModifyIndex": idx, "CreateTime": now, "ModifyTime": now,
        }
        self.evals[ev["ID"]] = ev
        self._process(ev)
        return ev

    def _process(self, ev: dict[str, Any]) -> None:
        failed = self._reconcile(ev)
        ev["Status"] = "complete"
        ev["ModifyIndex"] = self._next()
        ev["ModifyTime"] = self.now_ns()
        if failed:
            ev["FailedTGAllocs"] = failed
            blocked = dict(ev, ID=str(uuid.uuid4()), Status="blocked", TriggeredBy="queued-allocs",
                           PreviousEval=ev["ID"], FailedTGAllocs=None, CreateIndex=self.index,
                           ModifyIndex=self.index, StatusDescription="created due to placement conflicts")
            self.evals[blocked["ID"]] = blocked
            ev["BlockedEval"] = blocked["ID"]

    def unblock(self) -> list[str]:
        """Re-run blocked evaluations once capacity may have appeared."""
        out = []
        for ev in [e for e in self.evals.values() if e["Status"] == "blocked"]:
            ev["Status"] = "complete"
            ev["ModifyIndex"] = self._next()
            if self.key(ev["Namespace"], ev["JobID"]) in self.jobs:
                out.append(self.evaluate(ev["Namespace"], ev["JobID"], "queued-allocs")["ID"])
        return out

    def _job_allocs(self, namespace: str, job_id: str) -> list[dict[str, Any]]:
        return [a for a in self.allocs.values() if a["JobID"] == job_id and a["Namespace"] == namespace]

    @staticmethod
    def _live(alloc: dict[str, Any]) -> bool:
        return alloc["DesiredStatus"] == "run" and alloc["ClientStatus"] in ("pending", "running")

    def _ports_taken(self, tg: dict[str, Any], node: dict[str, Any]) -> bool:
        """A static port already held on the node makes it infeasible, as Nomad's port collision check does."""
        wanted = set(_static_ports(tg).values())
        if not wanted:
            return False
        for a in self.allocs.values():
            if a["NodeID"] == node["ID"] and self._live(a):
                held = (a.get("AllocatedResources") or {}).get("Shared", {}).get("Ports") or []
                if wanted & {p["Value"] for p in held}:
                    return True
        return False

    def _distinct_host_taken(self, job: dict[str, Any], tg: dict[str, Any], node: dict[str, Any],
                             taken: list[dict[str, Any]]) -> bool:
        """The distinct_hosts constraint (job or group): no two live allocations of the job on one node."""
        if not any(c.get("Operand") == "distinct_hosts" and str(c.get("RTarget", "true")).lower() != "false"
                   for c in (job.get("Constraints") or []) + (tg.get("Constraints") or [])):
            return False
        mine = self._job_allocs(job["Namespace"], job["ID"]) + list(taken)
        return any(a["NodeID"] == node["ID"] and self._live(a) for a in mine)

    def _node_load(self) -> dict[str, int]:
        load = {nid: 0 for nid in self.nodes}
        for a in self.allocs.values():
            if self._live(a) and a["NodeID"] in load:
                load[a["NodeID"]] += 1
        return load

    def _feasible(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        dcs = job["Datacenters"]
        return [
            n for n in self.nodes.values()
            if n["Status"] == "ready" and n["SchedulingEligibility"] == "eligible" and not n["Drain"]
            and ("*" in dcs or n["Datacenter"] in dcs)
        ]

    def _reschedule_delay(self, tg: dict[str, Any], attempts: int) -> float:
        pol = tg["ReschedulePolicy"]
        delay = pol["Delay"] / NS_PER_S
        if pol.get("DelayFunction") == "exponential":
            delay *= 2 ** attempts
        return min(delay, pol["MaxDelay"] / NS_PER_S)

    def _reconcile(self, ev: dict[str, Any]) -> dict[str, Any]:
        ns, job_id = ev["Namespace"], ev["JobID"]
        key = self.key(ns, job_id)
        job = self.jobs.get(key)
        allocs = self._job_allocs(ns, job_id)
        groups = {tg["Name"]: tg for tg in job["TaskGroups"]} if job else {}
        failed_tgs: dict[str, Any] = {}
        queued: dict[str, int] = {}
        now = self.clock.time()
        dep = self._current_deployment(ns, job_id, job)
        for name in sorted(set(groups) | {a["TaskGroup"] for a in allocs}):
            tg = groups.get(name)
            mine = [a for a in allocs if a["TaskGroup"] == name]
            if job is None or job["Stop"] or tg is None:
                for a in mine:
                    if a["DesiredStatus"] == "run":
                        self._stop_alloc(a, "alloc not needed due to job update")
                continue
            tg_hash = _group_hash(tg)
            live = [a for a in sorted(mine, key=lambda a: a["CreateIndex"]) if self._live(a)]
            same = [a for a in live if a["_tg_hash"] == tg_hash]
            old = [a for a in live if a["_tg_hash"] != tg_hash]
            inplace = [a for a in same if a["JobVersion"] != job["Version"]]
            had_running = any(a["JobVersion"] == job["Version"]
                              and a.get("_job_create_index", job["CreateIndex"]) == job["CreateIndex"] for a in mine)
            system = job["Type"] == "system"
            desired = len(self._feasible(job)) if system else tg["Count"]
            dep = self._deploy_group(job, tg, dep, desired, had_running, bool(inplace or old))
            if not system and len(live) > tg["Count"]:
                # Old-spec allocations go first (they were to be replaced), then the highest indexes.
                extra = old + sorted(same, key=_alloc_index, reverse=True)
                for a in extra[: len(live) - tg["Count"]]:
                    self._stop_alloc(a, "alloc not needed due to job update")
                same, old = [a for a in same if self._live(a)], [a for a in old if self._live(a)]
                live = [a for a in live if self._live(a)]
            for a in same:
                if a["JobVersion"] != job["Version"]:  # an unchanged group spec: the allocation is updated in place
                    a["JobVersion"] = job["Version"]
                    a["_job_create_index"] = job["CreateIndex"]
                    self._join_deployment(a, dep)
            replace = old[: self._destructive_limit(tg, dep, live, len(old))]
            for a in replace:
                self._stop_alloc(a, "alloc is being updated due to job update")
            live = same + [a for a in old if a not in replace]
            if system:
                # https://developer.hashicorp.com/nomad/docs/schedulers#system: one allocation on every
                # feasible node; failed ones are not rescheduled elsewhere, ineligible nodes get nothing new.
                have = {a["NodeID"] for a in live} | {a["NodeID"] for a in mine if a["DesiredStatus"] == "run"
                                                      and a["ClientStatus"] == "failed"}
                for node in self._feasible(job):
                    if node["ID"] not in have:
                        self._place(job, tg, tg_hash, ev, None, set(), live, node=node, dep=dep)
                continue
            slots = tg["Count"] - len(live)
            waiting = [a for a in mine if a["DesiredStatus"] == "run" and a["ClientStatus"] == "failed"
                       and not a.get("NextAllocation")]
            for a in waiting[slots:]:
                self._stop_alloc(a, "alloc not needed due to job update")
            placements: list[tuple[dict[str, Any] | None, set[str]]] = []
            for a in waiting[:slots]:
                attempts = len((a.get("RescheduleTracker") or {}).get("Events") or [])
                due = a["_failed_at"] + self._reschedule_delay(tg, attempts)
                if due <= now + 1e-6:
                    placements.append((a, {a["NodeID"]}))
                else:
                    self._followup(a, due)
            slots -= len(waiting[:slots])
            placements.extend((None, set()) for _ in range(max(0, slots)))
            unplaced = 0
            for prev, avoid in placements:
                if not self._place(job, tg, tg_hash, ev, prev, avoid, live + [p for p, _ in placements if p], dep=dep):
                    unplaced += 1
            if unplaced:
                queued[name] = unplaced
                feasible = self._feasible(job)
                failed_tgs[name] = {
                    "NodesEvaluated": len(feasible), "NodesFiltered": len(self.nodes) - len(feasible),
                    "NodesAvailable": {self.datacenter: len(feasible)}, "ClassFiltered": None,
                    "ConstraintFiltered": None, "NodesExhausted": 0, "ClassExhausted": None,
                    "DimensionExhausted": None, "QuotaExhausted": None, "Scores": None,
                    "AllocationTime": 1000, "CoalescedFailures": unplaced - 1,
                }
        if job is not None:
            self.queued[key] = queued
        ev["QueuedAllocations"] = {n: queued.get(n, 0) for n in groups}
        return failed_tgs

    def _followup(self, alloc: dict[str, Any], due: float) -> None:
        if alloc.get("FollowupEvalID") and alloc["FollowupEvalID"] in self.evals:
            return
        idx = self._next()
        ev_id = str(uuid.uuid4())
        self.evals[ev_id] = {
            "ID": ev_id, "Namespace": alloc["Namespace"], "Priority": 50, "Type": "service",
            "TriggeredBy": "alloc-failure", "JobID": alloc["JobID"], "JobModifyIndex": 0, "NodeID": "",
            "NodeModifyIndex": 0, "DeploymentID": "", "Status": "pending", "StatusDescription": "created for delayed rescheduling",
            "Wait": 0, "WaitUntil": _rfc3339(due), "_due": due, "NextEval": "", "PreviousEval": alloc["EvalID"],
            "BlockedEval": "", "RelatedEvals": None, "FailedTGAllocs": None, "ClassEligibility": None,
            "QuotaLimitReached": "", "EscapedComputedClass": False, "AnnotatePlan": False,
            "QueuedAllocations": {}, "SnapshotIndex": idx, "CreateIndex": idx, "ModifyIndex": idx,
            "CreateTime": self.now_ns(), "ModifyTime": self.now_ns(),
        }
        alloc["FollowupEvalID"] = ev_id
        alloc["ModifyIndex"] = idx

    def tick(self) -> None:
        """Run delayed (reschedule) evaluations whose time has come."""
        now = self.clock.time()
        for ev in [e for e in self.evals.values() if e["Status"] == "pending" and e.get("_due") is not None]:
            if ev["_due"] <= now:
                ev.pop("_due")
                self._process(ev)

    def _place(self, job, tg, tg_hash, ev, prev, avoid, taken, node=None, dep=None) -> bool:
        if node is None:
            nodes = [n for n in self._feasible(job) if not self._ports_taken(tg, n)
                     and not self._distinct_host_taken(job, tg, n, taken)]
            if not nodes:
                return False
            load = self._node_load()
            # Spread: fewest live allocs first, so an empty (even unhealthy) node attracts work.
            node = min(nodes, key=lambda n: (n["ID"] in avoid, load[n["ID"]], n["Name"]))
        used = {_alloc_index(a) for a in taken if a["TaskGroup"] == tg["Name"]}
        used |= {_alloc_index(a) for a in self._job_allocs(job["Namespace"], job["ID"])
                 if a["TaskGroup"] == tg["Name"] and self._live(a)}
        i = _alloc_index(prev) if prev is not None else next(k for k in range(10**6) if k not in used)
        idx = self._next()
        now = self.now_ns()
        alloc_id = str(uuid.uuid4())
        tracker = None
        if prev is not None:
            events = list((prev.get("RescheduleTracker") or {}).get("Events") or [])
            events.append({"RescheduleTime": now, "PrevAllocID": prev["ID"], "PrevNodeID": prev["NodeID"],
                           "Delay": tg["ReschedulePolicy"]["Delay"]})
            tracker = {"Events": events}
            prev["NextAllocation"] = alloc_id
            prev["ModifyIndex"] = idx
        alloc = {
            "ID": alloc_id, "EvalID": ev["ID"], "Name": f"{job['ID']}.{tg['Name']}[{i}]",
            "Namespace": job["Namespace"], "NodeID": node["ID"], "NodeName": node["Name"], "JobID": job["ID"],
            "JobType": job["Type"], "JobVersion": job["Version"], "TaskGroup": tg["Name"],
            "DesiredStatus": "run", "DesiredDescription": "", "DesiredTransition": {},
            "ClientStatus": "pending", "ClientDescription": "No tasks have started",
            "TaskStates": {t["Name"]: _task_state("pending", now, "Received", "Task received by client")
                           for t in tg["Tasks"]},
            "DeploymentID": "", "DeploymentStatus": None, "FollowupEvalID": "", "RescheduleTracker": tracker,
            "PreviousAllocation": prev["ID"] if prev else "", "NextAllocation": "",
            "PreemptedAllocations": None, "PreemptedByAllocation": "",
            "CreateIndex": idx, "ModifyIndex": idx, "AllocModifyIndex": idx, "CreateTime": now, "ModifyTime": now,
            "AllocatedResources": _allocated(tg, node),
            "_tg_hash": tg_hash, "_failed_at": None, "_job_create_index": job["CreateIndex"],
        }
        self.allocs[alloc_id] = alloc
        taken.append(alloc)
        self._join_deployment(alloc, dep)
        self._spawn(self._start_alloc(alloc_id))
        return True

    # ---- client side: alloc lifecycle ----------------------------------------------------
    def _job_for_alloc(self, alloc: dict[str, Any]) -> dict[str, Any] | None:
        key = self.key(alloc["Namespace"], alloc["JobID"])
        for v in self.versions.get(key, []):
            if v["Version"] == alloc["JobVersion"]:
                return v
        return self.jobs.get(key)

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
                    "NOMAD_ALLOC_INDEX": str(_alloc_index(alloc)), "NOMAD_JOB_NAME": alloc["JobID"],
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
            alloc["TaskStates"][task["Name"]] = _task_state("running", now, "Started", "Task started by client",
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
            alloc["TaskStates"][name] = _task_state("dead", now, event, message, failed=True,
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
                alloc["TaskStates"][name] = _task_state("dead", now, "Killed", "Task successfully killed",
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
        alloc = self.allocs.get(alloc_id)
        if alloc is None:
            matches = [a for a in self.allocs.values() if a["ID"].startswith(alloc_id)] if len(alloc_id) >= 2 else []
            if len(matches) != 1:
                raise NomadError(404, "alloc not found")
            alloc = matches[0]
        return alloc

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
        return out

    async def shutdown(self) -> None:
        self.stopping = True
        await self.driver.kill_all()
        for task in list(self._tasks):
            task.cancel()
        self.save_state()

    # ---- metrics -------------------------------------------------------------------------------
    def node_counts(self) -> dict[str, dict[str, int]]:
        out = {nid: {"running": 0, "failed": 0, "pending": 0, "terminal": 0} for nid in self.nodes}
        for a in self.allocs.values():
            c = out.get(a["NodeID"])
            if c is None:
                continue
            if a["ClientStatus"] == "running":
                c["running"] += 1
            elif a["ClientStatus"] == "failed":
                c["failed"] += 1
            elif a["ClientStatus"] == "pending":
                c["pending"] += 1
            else:
                c["terminal"] += 1
        return out


def _alloc_index(alloc: dict[str, Any]) -> int:
    name = alloc["Name"]
    return int(name[name.rindex("[") + 1: -1])


def _task_state(state: str, now: int, event: str, message: str, failed: bool = False,
                started: Any = None, finished: Any = None, exit_code: int | None = None) -> dict[str, Any]:
    def stamp(v: Any) -> str | None:
        return _rfc3339(v / NS_PER_S) if isinstance(v, int) else v

    return {
        "State": state, "Failed": failed, "Restarts": 0, "LastRestart": None,
        "StartedAt": stamp(started), "FinishedAt": stamp(finished),
        "Events": [{"Type": event, "Time": now, "DisplayMessage": message, "Message": message,
                    "ExitCode": exit_code or 0, "FailsTask": failed, "Details": {}}],
    }


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


def _group_hash(tg: dict[str, Any]) -> str:
    """What makes an update destructive: the group without the fields Nomad changes in place or ignores."""
    return _hash({k: v for k, v in tg.items() if k not in ("Count", "Update", "ReschedulePolicy", "Scaling")})


def _static_ports(tg: dict[str, Any]) -> dict[str, int]:
    """Label -> port of the group's `network { port "x" { static = N } }` (JSON: Networks[].ReservedPorts)."""
    return {p["Label"]: int(p["Value"]) for net in tg.get("Networks") or [] for p in net.get("ReservedPorts") or []}


def _allocated(tg: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """The alloc's AllocatedResources.Shared as Nomad reports it: ports bound on the node's address."""
    ip = node["Attributes"].get("unique.network.ip-address", "127.0.0.1")
    ports = [{"HostIP": ip, "Label": label, "Value": value} for label, value in _static_ports(tg).items()]
    networks = [{"IP": ip, "ReservedPorts": [{"HostNetwork": "default", "Label": p["Label"], "Value": p["Value"]}
                                             for p in ports]}]
    return {"Shared": {"DiskMB": 300, "Ports": ports or None, "Networks": networks if ports else None}, "Tasks": {}}

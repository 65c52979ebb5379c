"""Nomad stand-in state: the store of nodes, jobs and versions, allocations and evaluations, persisted as JSON."""

from __future__ import annotations

import asyncio
import copy
import uuid
from pathlib import Path
from typing import Any

from .clock import Clock, RealClock
from .nomad_allocs import AllocsMixin
from .nomad_deployments import DeploymentsMixin
from .nomad_driver import ProcessDriver
from .nomad_model import (
    ACTIVE_DEPLOYMENT,
    DEFAULT_UPDATE,
    DEPLOYMENT_TYPES,
    NOMAD_VERSION,
    NS_PER_S,
    ByJob,
    NomadError,
    json_hash,
    rfc3339,
)
from .nomad_scheduler import SchedulerMixin
from .persist import load_json, save_json

__all__ = ["NomadState", "node_id_for"]

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
SCALE_BLOCKED = "job scaling blocked due to active deployment"


def node_id_for(name: str) -> str:
    return str(uuid.uuid5(_NS, f"nomad-node:{name}"))


def _given(block: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (block or {}).items() if v is not None}


def _spec(job: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in job.items() if k not in SERVER_JOB_FIELDS}


class NomadState(SchedulerMixin, DeploymentsMixin, AllocsMixin):
    """One Nomad server and its client nodes: this store, with evaluations and placement (SchedulerMixin),
    deployments (DeploymentsMixin) and the client side of allocations (AllocsMixin) acting on it."""

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
        self.allocs: ByJob = ByJob()
        self.evals: dict[str, dict[str, Any]] = {}
        self.deployments: ByJob = ByJob()
        self._progress_by: dict[str, float] = {}  # deployment ID -> event-loop time of its progress deadline
        self.unhealthy: set[str] = set()  # node IDs whose allocs fail (lab fault)
        self.dirty = False
        self.stopping = False  # stand-in shutdown: task exits then are not failures
        self._tasks: set[asyncio.Task] = set()
        for spec in nodes:
            self._add_node(spec, http_addr)
        self._load_state()

    # ---- bookkeeping -----------------------------------------------------------------------------
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

    def _job_allocs(self, namespace: str, job_id: str) -> list[dict[str, Any]]:
        return self.allocs.of(namespace, job_id)

    @staticmethod
    def _live(alloc: dict[str, Any]) -> bool:
        return alloc["DesiredStatus"] == "run" and alloc["ClientStatus"] in ("pending", "running")

    def _job_for_alloc(self, alloc: dict[str, Any]) -> dict[str, Any] | None:
        key = self.key(alloc["Namespace"], alloc["JobID"])
        for v in self.versions.get(key, []):
            if v["Version"] == alloc["JobVersion"]:
                return v
        return self.jobs.get(key)

    # ---- persistence -----------------------------------------------------------------------------
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
        self.allocs = ByJob(data["allocs"])
        self.evals = data["evals"]
        self.deployments = ByJob(data.get("deployments", {}))
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

    async def shutdown(self) -> None:
        self.stopping = True
        await self.driver.kill_all()
        for task in list(self._tasks):
            task.cancel()
        self.save_state()

    # ---- nodes -----------------------------------------------------------------------------------
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
            "ComputedClass": "v1:" + json_hash([spec.get("class", ""), spec.get("meta")])[:19],
            "Drain": False,
            "DrainStrategy": None,
            "SchedulingEligibility": "eligible",
            "Status": "ready",
            "StatusDescription": "",
            "StatusUpdatedAt": int(now),
            "Events": [
                {"Message": "Node registered", "Subsystem": "Cluster", "Details": None,
                 "Timestamp": rfc3339(now), "CreateIndex": 0}
            ],
            "Drivers": {
                "raw_exec": {"Attributes": {"driver.raw_exec": "true"}, "Detected": True, "Healthy": True,
                             "HealthDescription": "Healthy", "UpdateTime": rfc3339(now)}
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
            raise NomadError(500, f'invalid scheduling eligibility "{eligibility}"')
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
                "ForceDeadline": rfc3339(now + deadline / NS_PER_S) if deadline > 0 else "0001-01-01T00:00:00Z",
                "StartedAt": rfc3339(now),
            }
            node["ModifyIndex"] = self._next()
            evals = self._migrate_off(node)
            # Migrations here are immediate, so the drain completes at once, as Nomad
            # reports it: drain strategy cleared, node left ineligible.
            node["Drain"] = False
            node["DrainStrategy"] = None
            node["LastDrain"] = {"Status": "complete", "StartedAt": rfc3339(now), "UpdatedAt": rfc3339(now),
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

    # ---- lab faults ------------------------------------------------------------------------------
    def fault_unhealthy(self, node_ref: str) -> dict[str, Any]:
        node = self.node(node_ref)
        self.unhealthy.add(node["ID"])
        for alloc in list(self.allocs.values()):
            if alloc["NodeID"] == node["ID"] and self._live(alloc):
                self._spawn(self._fail_alloc(alloc["ID"], "Task failed: node unhealthy", kill=True))
        return node

    def clear_faults(self) -> None:
        self.unhealthy.clear()

    # ---- jobs ------------------------------------------------------------------------------------
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
            "NodePool": job.get("NodePool") or "default", "Multiregion": None,
            "StatusDescription": "", "JobSummary": self.summary(job["Namespace"], job["ID"]),
            "CreateIndex": job["CreateIndex"], "ModifyIndex": job["ModifyIndex"],
            "JobModifyIndex": job["JobModifyIndex"], "SubmitTime": job["SubmitTime"],
        }

    # ---- metrics ---------------------------------------------------------------------------------
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

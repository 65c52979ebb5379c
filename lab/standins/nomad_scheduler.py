"""Nomad stand-in scheduler: evaluations, the reconciler, spread placement and delayed rescheduling."""

from __future__ import annotations

import uuid
from typing import Any

from .nomad_model import NS_PER_S, alloc_index, json_hash, rfc3339, task_state

__all__ = ["SchedulerMixin"]


class SchedulerMixin:
    """Evaluations and placement, mixed into NomadState (whose store it reads and writes)."""

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
                extra = old + sorted(same, key=alloc_index, reverse=True)
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
            "Wait": 0, "WaitUntil": rfc3339(due), "_due": due, "NextEval": "", "PreviousEval": alloc["EvalID"],
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
        used = {alloc_index(a) for a in taken if a["TaskGroup"] == tg["Name"]}
        used |= {alloc_index(a) for a in self._job_allocs(job["Namespace"], job["ID"])
                 if a["TaskGroup"] == tg["Name"] and self._live(a)}
        i = alloc_index(prev) if prev is not None else next(k for k in range(10**6) if k not in used)
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
            "TaskStates": {t["Name"]: task_state("pending", now, "Received", "Task received by client")
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


def _group_hash(tg: dict[str, Any]) -> str:
    """What makes an update destructive: the group without the fields Nomad changes in place or ignores."""
    return json_hash({k: v for k, v in tg.items() if k not in ("Count", "Update", "ReschedulePolicy", "Scaling")})


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


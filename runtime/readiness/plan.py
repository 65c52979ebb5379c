"""The checks a planned run needs, derived from it: its actions' queue, endpoints, secrets, snapshot store and telemetry."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError
from temporalio.client import Client

from activities.contracts.targets import NomadTarget, VaultSecretRef
from activities.inventory import Inventory
from activities.retry import parse_duration
from runtime.independence import host_of, resolver_violations, violations
from runtime.readiness.capacity import capacity_verdict
from runtime.readiness.dns import tsig_verdict
from runtime.readiness.endpoints import approle_verdict, endpoint_verdict, secret_verdict
from runtime.readiness.model import Check, Verdict, not_ready, ready
from runtime.readiness.path import through_block_verdict
from runtime.readiness.snapshots import snapshot_verdict
from runtime.readiness.telemetry import telemetry_verdict
from runtime.readiness.trial import trial_restore_verdict
from runtime.readiness.vault_login import WorkerVaultLogin
from runtime.readiness.workers import workers_verdict
from workflows.contract import RunInput, readings_queue
from workflows.spec import ActionStep, ForEachStep, GateSpec, GateStep, ParallelStep, RampStep

__all__ = ["ReadinessSettings", "plan_checks"]

SNAPSHOT_SELECT = "consul.snapshot.select"
REDEPLOY = "nomad.job.redeploy_from_scratch"
BLOCK = "firewall.block"


@dataclass
class ReadinessSettings:
    """Where the controller is: its Temporal (a connect function, called once), queue and catalog build id."""

    connect: Callable[[], Awaitable[Client]]
    frontend: str
    task_queue: str
    build_id: str
    timeout: float = 10.0
    temporal_config: str = ""
    # The weekly trial restore of the newest snapshot into a scratch Consul agent (minutes, not seconds).
    trial_restore: bool = False
    # Where this host's resolver is configured; its nameservers must not be what the runbooks restore.
    resolv_conf: Path = Path("/etc/resolv.conf")
    # The Vault login secrets are read with (vault_login.worker_vault_token); None: each reference's own.
    vault: WorkerVaultLogin | None = field(default=None, repr=False)
    _client: asyncio.Task[Client] | None = field(default=None, repr=False)

    async def client(self) -> Client:
        if self._client is None:
            self._client = asyncio.ensure_future(self.connect())
        return await self._client


def _calls(steps: list[Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(action, inputs) of every action a run may call: steps, ramps, fan-outs, undos, parallel branches."""
    for step in steps:
        if isinstance(step, ActionStep):
            yield step.action, step.with_
            if step.undo:
                yield step.undo.action, step.undo.with_
        elif isinstance(step, RampStep):
            yield step.ramp.action, step.ramp.with_
        elif isinstance(step, ForEachStep):
            yield step.for_each.action, step.for_each.with_
        elif isinstance(step, ParallelStep):
            yield from _calls(step.parallel)


def _gates(steps: list[Any]) -> Iterator[GateSpec]:
    for step in steps:
        if isinstance(step, GateStep):
            yield step.gate
        elif isinstance(step, RampStep):
            yield from step.ramp.gates
        elif isinstance(step, ParallelStep):
            yield from _gates(step.parallel)


def _resolved(value: Any) -> bool:
    return not (isinstance(value, str) and "${{" in value)


def _walk(value: Any) -> Iterator[Any]:
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


def _base(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _ca_certs(calls: list[tuple[str, dict[str, Any]]]) -> dict[str, str]:
    """The CA bundle an input gives beside a URL (a cluster's `address` and `ca_cert`), by the URL's base."""
    found: dict[str, str] = {}
    for _, inputs in calls:
        for node in _walk(inputs):
            if isinstance(node, dict) and isinstance(node.get("ca_cert"), str) and _resolved(node["ca_cert"]):
                for value in node.values():
                    if isinstance(value, str) and value.startswith("https://") and _resolved(value):
                        found.setdefault(_base(value), node["ca_cert"])
    return found


def _secret_refs(inputs: dict[str, Any]) -> Iterator[VaultSecretRef]:
    for node in _walk(inputs):
        if isinstance(node, dict) and {"address", "path", "field"} <= node.keys() and all(map(_resolved, node.values())):
            try:
                yield VaultSecretRef.model_validate(node)
            except ValidationError:
                continue


def _objective(run: RunInput, inputs: list[dict[str, Any]]) -> timedelta | None:
    """The snapshot's age limit: the target's `facts.rpo`, or a select step's max_age_seconds if tighter."""
    limits: list[timedelta] = []
    if (rpo := (run.target.get("facts") or {}).get("rpo")) is not None:
        try:
            parsed = parse_duration(rpo)
        except ValueError:
            parsed = None
        if not isinstance(parsed, timedelta):
            raise ValueError(f"target {run.target_name}: facts.rpo {rpo!r} is not a duration such as 24h")
        limits.append(parsed)
    limits.extend(timedelta(seconds=float(i["max_age_seconds"])) for i in inputs
                  if isinstance(i.get("max_age_seconds"), int | float))
    return min(limits) if limits else None


def plan_checks(run: RunInput, settings: ReadinessSettings) -> list[Check]:
    """Every check this run's recovery path needs, in a stable order (workers, the controller, telemetry,
    endpoints, secrets, snapshots); ValueError for a target fact that is not valid."""
    steps = [*run.runbook.steps, *(run.runbook.deadline.on_miss if run.runbook.deadline else [])]
    calls = list(_calls(steps))
    gates = [g for g in _gates(steps) if _resolved(g.endpoint)]
    t = settings.timeout
    checks = [Check("workers", "workers", lambda: _workers(settings, settings.task_queue, workflows=True), t)]
    if gates:
        queue = readings_queue(settings.task_queue)
        checks.append(Check("workers.readings", "workers", lambda: _workers(settings, queue, workflows=False), t))
    inventory = Inventory.model_validate(run.target) if "telemetry" in run.target else None
    login = settings.vault or WorkerVaultLogin("no Vault login")
    checks.append(Check("temporal.independent", "independence", lambda: _independent(settings, inventory), t))
    prometheus = sorted({_base(g.endpoint) for g in gates if g.source == "prometheus"})
    checks.extend(Check(f"telemetry:{p}", "telemetry", lambda p=p: telemetry_verdict(p, timeout=t), t)
                  for p in prometheus)
    urls = {_base(v) for _, inputs in calls for v in _walk(inputs)
            if isinstance(v, str) and v.startswith(("http://", "https://")) and _resolved(v)}
    urls.update(_base(g.endpoint) for g in gates)
    cas = _ca_certs(calls)
    checks.extend(Check(f"endpoint:{u}", "endpoint", lambda u=u: endpoint_verdict(u, timeout=t, ca_cert=cas.get(u)), t)
                  for u in sorted(urls))
    checks.extend(_through_blocks(steps, urls, inventory, t))
    refs = {ref.model_dump_json(): ref for _, inputs in calls for ref in _secret_refs(inputs)}
    if inventory and inventory.dns and any(action.startswith("dns.") for action, _ in calls):
        # The key's own check resolves its secret and signs with it: one check, not two.
        refs.pop(inventory.dns.tsig_secret.model_dump_json(), None)
        steering = inventory.dns
        checks.append(Check(f"tsig:{steering.tsig_key_name}", "secret", lambda: tsig_verdict(
            steering, timeout=t, token=login.token_for(steering.tsig_secret)), t))
    for ref in sorted(refs.values(), key=lambda r: (r.address, r.mount, r.path, r.field)):
        name = f"secret:{ref.mount.strip('/')}/{ref.path.strip('/')}#{ref.field}"
        checks.append(Check(name, "secret", lambda ref=ref: secret_verdict(ref, token=login.token_for(ref)), t))
    if inventory and inventory.vault:
        approle = inventory.vault
        checks.append(Check("vault.approle", "secret", lambda: approle_verdict(
            approle.address, approle.approle_role_id_file, approle.approle_secret_id_file, timeout=t), t))
    selects = [inputs for action, inputs in calls if action == SNAPSHOT_SELECT]
    objective = _objective(run, selects)
    stores = {(i["store"], i.get("pattern", "*.snap")) for i in selects if isinstance(i.get("store"), str)
              and _resolved(i["store"])}
    checks.extend(_capacity(calls, t, login))
    # Reading a large snapshot takes a while: its check gets a longer allowance than a network probe.
    checks.extend(Check(f"snapshot:{store}", "snapshot", lambda s=store, p=pattern: snapshot_verdict(
        s, pattern=p, objective=objective), max(t, 120.0)) for store, pattern in sorted(stores))
    if settings.trial_restore:
        checks.extend(Check(f"snapshot.trial:{store}", "snapshot", lambda s=store, p=pattern: trial_restore_verdict(
            s, pattern=p), max(t, 300.0)) for store, pattern in sorted(stores))
    return checks


def _blocked_hosts(hosts: list[Any], inventory: Inventory | None) -> set[str]:
    """What a URL's host may be for each blocked host: its address, its inventory entry's, or its name (a
    namespace host has no address of its own)."""
    names: set[str] = set()
    for host in hosts:
        if not isinstance(host, dict):
            continue
        name = str(host.get("name", ""))
        names.update(filter(None, [name, host.get("address")]))
        if inventory and name in inventory.hosts:
            names.add(host_of(inventory.hosts[name].address))
    return {n.lower() for n in names}


def _through_blocks(steps: list[Any], urls: set[str], inventory: Inventory | None, timeout: float) -> Iterator[Check]:
    """For each step that blocks clients: every endpoint on a blocked host and port must stay reachable from here
    through an allowed tier (a URL's host matches by address, or by its first label being the host's name)."""
    for step in steps:
        if not isinstance(step, ActionStep) or step.action != BLOCK or not all(_resolved(v) for v in _walk(step.with_)):
            continue
        ports = {int(p) for p in step.with_.get("ports") or []}
        allow = step.with_.get("allow") or []
        if allow and all(isinstance(a, str) for a in allow):
            allow = [{"name": "allow", "cidrs": allow}]
        tiers = {str(a.get("name")): [str(c) for c in a.get("cidrs") or []] for a in allow if isinstance(a, dict)}
        blocked = _blocked_hosts(step.with_.get("hosts") or [], inventory)
        for url in sorted(urls):
            parts = urlsplit(url)
            host = (parts.hostname or "").lower()
            on_blocked = host in blocked or host.split(".", 1)[0] in blocked
            if on_blocked and (parts.port or (443 if parts.scheme == "https" else 80)) in ports:
                yield Check(f"out-of-band:{url}", "endpoint", lambda url=url, tiers=tiers, step=step.id:
                            through_block_verdict(url, tiers, step), timeout)


def _capacity(calls: list[tuple[str, dict[str, Any]]], timeout: float, login: WorkerVaultLogin) -> Iterator[Check]:
    """Each job a step redeploys from scratch, once per cluster and job."""
    seen: set[tuple[str, str]] = set()
    for action, inputs in calls:
        job, cluster = inputs.get("job"), inputs.get("nomad")
        if action != REDEPLOY or not isinstance(job, str) or not isinstance(cluster, dict) or not all(
                _resolved(v) for v in _walk(inputs)):
            continue
        target = NomadTarget.model_validate(cluster)
        if (target.address, job) in seen:
            continue
        seen.add((target.address, job))
        namespace, spec = str(inputs.get("namespace") or "default"), inputs.get("job_spec")
        vault_token = login.token_for(target.token) if target.token else None
        yield Check(f"nomad.capacity:{job}", "capacity", lambda target=target, job=job, namespace=namespace, spec=spec,
                    vault_token=vault_token: capacity_verdict(target, job, namespace=namespace, spec=spec,
                                                              vault_token=vault_token), timeout)


async def _workers(settings: ReadinessSettings, queue: str, *, workflows: bool) -> Verdict:
    try:
        client = await settings.client()
    except Exception as exc:  # noqa: BLE001 - any connection failure means no run can start
        return not_ready(f"Temporal at {settings.frontend} is unreachable: {_why(exc)}")
    return await workers_verdict(client, queue, settings.build_id, workflows=workflows)


def _why(exc: BaseException) -> str:
    """One short reason: the SDK's connect errors nest the OS error deep inside a long line."""
    text = str(exc)
    for reason in ("Connection refused", "No route to host", "timed out", "Name or service not known"):
        if reason.lower() in text.lower():
            return reason.lower()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= 160 else line[:157] + "..."


async def _independent(settings: ReadinessSettings, inventory: Inventory | None) -> Verdict:
    problems = violations(settings.frontend, settings.temporal_config, inventory)
    try:
        problems += resolver_violations(settings.resolv_conf.read_text(), inventory)
    except OSError as exc:
        problems.append(f"cannot read {settings.resolv_conf}: {exc.strerror}")
    if problems:
        return not_ready("; ".join(problems))
    what = "its frontend address" + (" and server config" if settings.temporal_config else "")
    return ready(f"Temporal ({what}), this host's resolver ({settings.resolv_conf}) and the gates' Prometheus need "
                 f"no Consul, Nomad or Vault")

"""Consul usage actions: disable non-essential services (flag, check, count) and restore them, one or many."""

from __future__ import annotations

import copy
import json
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import consul
from consul.callback import CB
from temporalio.exceptions import ApplicationError

from activities._clients import (
    bad,
    call,
    consul_client,
    consul_http,
    consul_token,
    describe,
    go_duration_seconds,
    heartbeat,
    nomad_client,
    secret_of,
    unavailable,
)
from activities._nomad_checks import check_at, differing, find_check, group_of, read_job, worst_status
from activities.binding import implements
from activities.consul._kv import CAS_ATTEMPTS, _entry, _want, kv_ensure
from activities.consul.services import UserService, _ci
from activities.contracts.consul_kv import ABSENT
from activities.contracts.consul_users import (
    USER_DISABLE,
    USER_ENABLE,
    USERS_DISABLE,
    USERS_ENABLE,
    AgentCheckRecord,
    FlagRecord,
    NomadCheckRecord,
    ScaleRecord,
    ServiceRecord,
    ServicesTarget,
    UserDisableInput,
    UserDisableOutput,
    UserEnableInput,
    UserEnableOutput,
    UsersDisableInput,
    UsersDisableOutput,
    UsersEnableInput,
    UsersEnableOutput,
)

__all__ = ["user_disable", "user_enable", "users_disable", "users_enable"]


def _nanoseconds(interval: str) -> int:
    return round(go_duration_seconds(interval) * 1e9)


def _duration_text(nanoseconds: int) -> str:
    for unit, size in (("h", 3600 * 10**9), ("m", 60 * 10**9), ("s", 10**9), ("ms", 10**6)):
        if nanoseconds and nanoseconds % size == 0:
            return f"{nanoseconds // size}{unit}"
    return f"{nanoseconds}ns"


def _seconds(value: Any) -> float:
    """An agent-reported or definition duration in seconds; unset ("" or None) is 0."""
    return 0.0 if value in (None, "") else go_duration_seconds(value)


# --------------------------------------------------------------------------- checks registered on an agent


def _agent_client(inp: ServicesTarget, client: consul.Consul, agent: str) -> consul.Consul:
    return client if agent == inp.consul.address else consul_client(inp.consul, agent, token=client.token or "")


def _read_agent_check(client: consul.Consul, agent: str, check_id: str) -> dict[str, Any]:
    checks = call(f"list agent checks on {agent}", lambda: client.agent.checks())
    chk = checks.get(check_id)
    if chk is None:
        raise ApplicationError(f"check {check_id!r} is not registered on agent {agent}", type="NotFound",
                               non_retryable=True)
    return chk


def _with_interval(definition: dict[str, Any], interval: str) -> dict[str, Any]:
    key = next(k for k in definition if k.lower() == "interval")
    return {**definition, key: interval}


# A check's kind (the Type the agent reports) by the field that defines it.
_CHECK_KINDS = (("HTTP", "http"), ("TCP", "tcp"), ("UDP", "udp"), ("GRPC", "grpc"), ("H2PING", "h2ping"),
                ("OSService", "os_service"))


def _check_kind(body: dict[str, Any]) -> str | None:
    """The Type the agent reports for a check registered from `body`; None when the body names no single kind."""
    kinds = {kind for field, kind in _CHECK_KINDS if _ci(body, field)}
    if _ci(body, "Args") or _ci(body, "ScriptArgs"):
        kinds.add("docker" if _ci(body, "DockerContainerID") else "script")
    return kinds.pop() if len(kinds) == 1 else None


def _agent_differences(live: dict[str, Any], body: dict[str, Any]) -> list[str]:
    """Each field in which the agent's check differs from what `body` registers, as "Field: want .., agent has ..".

    Compared: every field the agent reports of a registration (Name, ServiceID, Notes, Type, Interval, Timeout).
    The rest of the body (HTTP target, Method, Header, Body, TCP address, ...) is reported by no endpoint of
    Consul (1.22.7): the agent keeps it only in the running check and in its data dir. HealthCheck.Definition,
    where it could show, is filled in only for checks written through /v1/catalog/register, never by the agent,
    so it is empty in /v1/agent/checks, /v1/health/checks/:service, /v1/health/node/:node and
    /v1/agent/health/service/id/:id alike. The Output of an HTTP check names its method and target, but of its
    last run, which a re-registration keeps: it says nothing of the registration now in force. Status is not
    compared either: re-registering a check keeps its status, whatever the body says.
    """
    diffs = []
    for field in ("Name", "ServiceID", "Notes"):
        want, have = _ci(body, field) or "", live.get(field) or ""
        if want != have:
            diffs.append(f"{field}: want {want!r}, agent has {have!r}")
    kind = _check_kind(body)
    if kind is not None and live.get("Type") != kind:
        diffs.append(f"Type: want {kind!r}, agent has {live.get('Type')!r}")
    for field in ("Interval", "Timeout"):
        want, have = _ci(body, field), live.get(field)
        if _seconds(want) != _seconds(have):
            diffs.append(f"{field}: want {want or 'unset'!r}, agent has {have or 'unset'!r}")
    return diffs


def _observe_agent_check(inp: UserDisableInput, client: consul.Consul) -> AgentCheckRecord:
    svc = inp.service
    agent = svc.check_agent or inp.consul.address
    check_id, definition = svc.check_id, svc.check_definition
    assert check_id is not None and definition is not None  # UserService requires both of an agent's check
    live = _read_agent_check(_agent_client(inp, client, agent), agent, check_id)
    want = str(_ci(definition, "Interval"))
    diffs = _agent_differences(live, definition)
    if diffs and _agent_differences(live, _with_interval(definition, inp.check_interval)):
        # Neither as the inventory registers it nor as a disable stretched it: re-registering the check from
        # the inventory would change more than its interval, and enable could not put the original back.
        raise ApplicationError(
            f"check {check_id} on agent {agent} differs from the inventory's check_definition "
            f"({'; '.join(diffs)}): the inventory is out of date; not re-registering the check from it",
            type="Conflict", non_retryable=True)
    return AgentCheckRecord(agent=agent, check_id=check_id, interval=want, definition=definition)


def _ensure_agent_check(inp: ServicesTarget, client: consul.Consul, rec: AgentCheckRecord, interval: str,
                        changed: list[str]) -> None:
    """Register the recorded definition with `interval` unless the agent already shows it; read back and compare
    every field the agent reports (see _agent_differences). "check" goes into `changed` as soon as the agent
    took the registration."""
    agent_client = _agent_client(inp, client, rec.agent)
    body = {**_with_interval(rec.definition, interval), "ID": rec.check_id}
    if not _agent_differences(_read_agent_check(agent_client, rec.agent, rec.check_id), body):
        return
    # The agent keeps the check's status and output across a re-registration of the same ID.
    ok = call(f"register check {rec.check_id} on {rec.agent}", lambda: consul_http(agent_client).put(
        CB.boolean(), "/v1/agent/check/register", headers=agent_client.prepare_headers(), data=json.dumps(body)))
    if not ok:
        raise unavailable(f"agent {rec.agent} refused to register check {rec.check_id}")
    changed.append("check")
    diffs = _agent_differences(_read_agent_check(agent_client, rec.agent, rec.check_id), body)
    if diffs:
        # The agent took the body and shows something else (another writer, or an agent that rewrites it):
        # registering the same body again cannot settle that.
        raise ApplicationError(
            f"registered check {rec.check_id} on agent {rec.agent} from the inventory's check_definition (every "
            f"{interval}), but the agent reads back otherwise: {'; '.join(diffs)}", type="Conflict",
            non_retryable=True)


# --------------------------------------------------------------------------- the Nomad job: check and count


def _live_check(spec: dict[str, Any], rec: NomadCheckRecord) -> dict[str, Any]:
    """The recorded check in `spec`, refusing when it is gone or was changed since beyond what we stretch."""
    chk = check_at(spec, rec.place)
    where = f"check {rec.place.check!r} of service {rec.place.service!r} in job {rec.job}"
    if chk is None:
        raise ApplicationError(f"{where} is gone since it was recorded; not touching the job", type="Conflict",
                               non_retryable=True)
    moved = differing(chk, rec.definition)
    if moved:
        raise ApplicationError(f"{where} changed since it was recorded ({', '.join(moved)}); not overwriting it",
                               type="Conflict", non_retryable=True)
    return chk


def _job_group(spec: dict[str, Any], scale: ScaleRecord) -> dict[str, Any]:
    tg = next((g for g in spec.get("TaskGroups") or [] if g["Name"] == scale.group), None)
    if tg is None:
        raise ApplicationError(f"job {scale.job} has no task group {scale.group!r} any more; not touching it",
                               type="Conflict", non_retryable=True)
    return tg


def _check_status(client: consul.Consul, rec: NomadCheckRecord) -> str | None:
    """The worst state Consul holds for this check across the service's instances (None: none registered)."""
    _, checks = call(f"read health checks of {rec.place.service}", lambda: client.health.checks(rec.place.service))
    return worst_status([c.get("Status", "") for c in checks or [] if c.get("Name") == rec.place.check])


def _apply_to_job(api: Any, scale: ScaleRecord, plan: Any, changed: list[str],
                  known: dict[str, Any] | None = None) -> None:
    """One update_job with `plan(spec) -> [what it changed]` (editing spec); update_job reads the job back and
    asks `plan` again, which must then find nothing to do. What landed goes into `changed`, also when
    update_job fails after its register (then told from the job as it reads now). `known`: the job as
    this attempt just read it."""
    from activities.nomad import update_job

    planned: list[list[str]] = []

    def mutate(spec: dict[str, Any]) -> bool:
        found = plan(spec)
        if found:
            planned.append(found)
        return bool(found)

    try:
        _, did = update_job(api, scale.job, scale.namespace, mutate, known=known)
    except Exception:
        if planned:
            try:
                remaining = plan(read_job(api, scale.job, scale.namespace))
            except Exception:  # noqa: BLE001 - cannot tell: count the planned change as made
                remaining = []
            changed += [what for what in planned[-1] if what not in remaining]
        raise
    changed += planned[-1] if did else []


def _disable_job(inp: UserDisableInput, client: consul.Consul, api: Any, rec: ServiceRecord,
                 changed: list[str], known: dict[str, Any] | None = None) -> None:
    """Stretch the job's check and scale it down in ONE job version (each register starts a deployment).
    Only Interval, InitialStatus and OnUpdate of the check change (STRETCHED_FIELDS)."""
    scale = rec.scale
    assert scale is not None  # called for a record with a job only
    check = rec.check if isinstance(rec.check, NomadCheckRecord) else None
    want = _nanoseconds(inp.check_interval)

    def plan(spec: dict[str, Any]) -> list[str]:
        changes = []
        tg = _job_group(spec, scale)
        if check is not None:
            chk = _live_check(spec, check)
            if chk.get("Interval") != want:
                # A changed check is a new one to Consul: critical until its first run, which the agent
                # staggers anywhere within the interval. So it starts in the state it has now (read after
                # update_job waited out a deployment), and the deployment of this version does not wait on
                # it (on_update = ignore): it would otherwise fail, or roll back where auto_revert is on.
                status = _check_status(client, check)
                chk["Interval"] = want
                chk["OnUpdate"] = "ignore"
                if status is not None:
                    chk["InitialStatus"] = status
                changes.append("check")
        if int(tg.get("Count") or 0) > inp.scale_to:
            tg["Count"] = inp.scale_to
            changes.append("scale")
        return changes

    _apply_to_job(api, scale, plan, changed, known)


def _enable_job(api: Any, rec: ServiceRecord, changed: list[str]) -> None:
    """Put the recorded check (every field) and count back in ONE job version."""
    scale = rec.scale
    assert scale is not None  # called for a record with a job only
    check = rec.check if isinstance(rec.check, NomadCheckRecord) else None

    def plan(spec: dict[str, Any]) -> list[str]:
        changes = []
        tg = _job_group(spec, scale)
        if check is not None:
            chk = _live_check(spec, check)
            if chk != check.definition:
                chk.clear()
                chk.update(copy.deepcopy(check.definition))
                changes.append("check")
        if int(tg.get("Count") or 0) != scale.count:
            tg["Count"] = scale.count
            changes.append("scale")
        return changes

    _apply_to_job(api, scale, plan, changed)


# --------------------------------------------------------------------------- one service


def _journal_key(prefix: str, name: str) -> str:
    return f"{prefix.rstrip('/')}/{name}"


@dataclass
class _Reads:
    """What observing a service read in this attempt, so applying the change need not read it again."""

    flag: tuple[Any, dict[str, Any] | None] | None = None
    job: dict[str, Any] | None = None


def _observe(inp: UserDisableInput, client: consul.Consul, nomad_api: Any, reads: _Reads) -> ServiceRecord:
    svc = inp.service
    record = ServiceRecord(name=svc.name, tier=svc.tier)
    if svc.usage_flag_key:
        reads.flag = flag = call(f"read KV {svc.usage_flag_key}", lambda: client.kv.get(svc.usage_flag_key))
        cur = flag[1]
        record.flag = FlagRecord(key=svc.usage_flag_key, previous=_entry(cur) if cur else None)
    if svc.check_owner == "agent":
        record.check = _observe_agent_check(inp, client)
    if svc.nomad_job:
        spec = reads.job = read_job(nomad_api, svc.nomad_job, svc.nomad_namespace)
        tg = group_of(spec, svc.nomad_group)
        record.scale = ScaleRecord(job=svc.nomad_job, group=tg["Name"], namespace=svc.nomad_namespace,
                                   count=int(tg.get("Count") or 0))
        if svc.check_owner == "nomad":
            place = find_check(spec, tg["Name"], svc.check_service or svc.name, svc.check_name)
            found = check_at(spec, place)
            assert found is not None  # find_check has just found it in this spec
            definition = copy.deepcopy(found)
            if not definition.get("Interval"):
                record.notes.append(f"check {place.check!r} of job {svc.nomad_job} has no interval: left alone")
            else:
                record.check = NomadCheckRecord(job=svc.nomad_job, namespace=svc.nomad_namespace, place=place,
                                                interval=_duration_text(int(definition["Interval"])),
                                                definition=definition)
    return record


def _record(inp: UserDisableInput, client: consul.Consul, nomad_api: Any, reads: _Reads) -> ServiceRecord:
    """The service's original state: from the journal if an earlier attempt wrote it, else observed now
    (then `reads` holds what observing it read)."""
    if inp.journal_prefix is None:
        return _observe(inp, client, nomad_api, reads)
    key = _journal_key(inp.journal_prefix, inp.service.name)
    for _ in range(CAS_ATTEMPTS):
        _, cur = call(f"read journal {key}", lambda: client.kv.get(key))
        if cur is not None and cur.get("Value"):
            return ServiceRecord.model_validate_json(cur["Value"])
        record = _observe(inp, client, nomad_api, reads)
        if call(f"write journal {key}", lambda: client.kv.put(key, record.model_dump_json(), cas=0)):
            return record
        reads.flag = reads.job = None  # another attempt journaled first: its record wins, our reads are stale
    raise unavailable(f"could not create journal entry {key}")


def _partial(action_name: str, name: str, changed: list[str], exc: BaseException,
             details: dict[str, Any]) -> ApplicationError:
    """An error that says exactly what this call changed before it failed; details carry the way back."""
    done = f"changed {', '.join(changed)}" if changed else "changed nothing"
    cause = str(exc) if isinstance(exc, ApplicationError) else describe(exc)
    kind = (exc.type if isinstance(exc, ApplicationError) else None) or "Unavailable"
    return ApplicationError(f"{action_name} {name}: {done}, then failed: {cause}",
                            {"service": name, "changed": changed, **details}, type=kind,
                            non_retryable=isinstance(exc, ApplicationError) and exc.non_retryable)


def _disable_one(inp: UserDisableInput, client: consul.Consul, nomad_api: Any) -> UserDisableOutput:
    svc = inp.service
    if svc.essential:
        noop = UserEnableInput(consul=inp.consul, nomad=inp.nomad, journal_prefix=None,
                               record=ServiceRecord(name=svc.name, notes=["essential: left untouched"]))
        return UserDisableOutput(service=svc.name, skipped="essential", changed=[], record=None, restore=noop)
    if svc.nomad_job and nomad_api is None:
        raise bad(f"service {svc.name} names Nomad job {svc.nomad_job} but no nomad target was given")
    reads = _Reads()
    record = _record(inp, client, nomad_api, reads)
    restore = UserEnableInput(consul=inp.consul, nomad=inp.nomad, journal_prefix=inp.journal_prefix, record=record)
    changed: list[str] = []
    try:
        if record.flag is not None:
            _, did, _ = kv_ensure(client, record.flag.key, inp.disabled_value.encode(),
                                  record.flag.previous.flags if record.flag.previous else 0, current=reads.flag)
            changed += ["flag"] if did else []
        if isinstance(record.check, AgentCheckRecord):
            _ensure_agent_check(inp, client, record.check, inp.check_interval, changed)
        if record.scale is not None:
            _disable_job(inp, client, nomad_api, record, changed, known=reads.job)
    except Exception as exc:  # noqa: BLE001 - whatever failed, say what had changed and how to undo it
        raise _partial("consul.user.disable", svc.name, changed, exc, {
            "record": record.model_dump(mode="json"), "restore": restore.model_dump(mode="json")}) from None
    return UserDisableOutput(service=svc.name, changed=changed, record=record, restore=restore)


def _enable_one(inp: UserEnableInput, client: consul.Consul, nomad_api: Any) -> UserEnableOutput:
    rec = inp.record
    if inp.tiers is not None and rec.tier not in inp.tiers:
        return UserEnableOutput(service=rec.name, changed=[], notes=[f"tier {rec.tier!r} not in {inp.tiers}: later"])
    if rec.scale is not None and nomad_api is None:
        raise bad(f"record for {rec.name} has a Nomad job but no nomad target was given")
    changed: list[str] = []
    try:
        if rec.flag is not None:
            _, did, _ = kv_ensure(client, rec.flag.key, _want(rec.flag.previous),
                                  rec.flag.previous.flags if rec.flag.previous else 0)
            changed += ["flag"] if did else []
        if isinstance(rec.check, AgentCheckRecord):
            _ensure_agent_check(inp, client, rec.check, rec.check.interval, changed)
        if rec.scale is not None:
            _enable_job(nomad_api, rec, changed)
        if inp.journal_prefix is not None:
            # Only now: until everything is back, the journal still holds the original for a retry.
            kv_ensure(client, _journal_key(inp.journal_prefix, rec.name), ABSENT)
    except Exception as exc:  # noqa: BLE001 - whatever failed, say what had been restored
        raise _partial("consul.user.enable", rec.name, changed, exc, {}) from None
    return UserEnableOutput(service=rec.name, changed=changed, notes=rec.notes)


def _clients(shared: ServicesTarget) -> tuple[consul.Consul, Any]:
    return consul_client(shared.consul), nomad_client(shared.nomad) if shared.nomad else None


@implements(USER_DISABLE)
def user_disable(inp: UserDisableInput) -> UserDisableOutput:
    client, nomad_api = _clients(inp)
    return _disable_one(inp, client, nomad_api)


@implements(USER_ENABLE)
def user_enable(inp: UserEnableInput) -> UserEnableOutput:
    client, nomad_api = _clients(inp)
    return _enable_one(inp, client, nomad_api)


def _fan_out(name: str, items: list[Any], one: Any, max_parallel: int
             ) -> tuple[list[Any], dict[str, ApplicationError], bool]:
    """Run one(item) on a bounded pool, heartbeating progress from this (the activity's) thread, also while a
    slow item (a job waiting out a deployment) keeps the others from finishing."""
    results: list[Any] = []
    failures: dict[str, ApplicationError] = {}
    with ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix=name) as pool:
        pending = {pool.submit(one, item): item for item in items}
        while pending:
            done, _ = wait(pending, timeout=20, return_when=FIRST_COMPLETED)
            for fut in done:
                label = getattr(pending.pop(fut), "name", "?")
                try:
                    results.append(fut.result())
                except ApplicationError as exc:
                    failures[label] = exc
                except Exception as exc:  # noqa: BLE001 - one service's surprise must not hide the others
                    failures[label] = unavailable(describe(exc))
            heartbeat({"done": len(items) - len(pending), "of": len(items)})
    return results, failures, all(not exc.non_retryable for exc in failures.values())


def _partial_details(exc: ApplicationError) -> dict[str, Any]:
    details = exc.details[0] if exc.details else None
    return details if isinstance(details, dict) else {}


def _changes_text(changed: dict[str, list[str]]) -> str:
    if not changed:
        return "nothing"
    shown = [f"{name} ({', '.join(what)})" for name, what in sorted(changed.items())[:10]]
    return ", ".join(shown) + (f" and {len(changed) - 10} more" if len(changed) > 10 else "")


@implements(USERS_DISABLE)
def users_disable(inp: UsersDisableInput) -> UsersDisableOutput:
    token = consul_token(inp.consul)
    nomad_token = secret_of(inp.nomad.token) if inp.nomad is not None else None
    knobs = inp.model_dump(include={"disabled_value", "check_interval", "scale_to", "journal_prefix"})

    def one(svc: UserService) -> UserDisableOutput:
        client = consul_client(inp.consul, token=token or "")
        api = nomad_client(inp.nomad, token=nomad_token or "") if inp.nomad else None
        sub = UserDisableInput(consul=inp.consul, nomad=inp.nomad, service=svc, **knobs)
        return _disable_one(sub, client, api)

    results, failures, retryable = _fan_out("users-disable", inp.services, one, inp.max_parallel)
    partial = {name: _partial_details(exc) for name, exc in failures.items()}
    records = [r.record for r in results if r.record is not None]
    records += [ServiceRecord.model_validate(p["record"]) for p in partial.values() if p.get("record")]
    order = {s.name: i for i, s in enumerate(inp.services)}
    records.sort(key=lambda r: order[r.name])
    restore = UsersEnableInput(consul=inp.consul, nomad=inp.nomad, journal_prefix=inp.journal_prefix,
                               records=records, max_parallel=inp.max_parallel)
    changed = {r.service: r.changed for r in results if r.changed}
    changed |= {name: p["changed"] for name, p in partial.items() if p.get("changed")}
    if failures:
        raise ApplicationError(
            f"consul.users.disable: {len(failures)} of {len(inp.services)} service(s) failed; changed "
            f"{_changes_text(changed)}; details.restore brings back all {len(records)} recorded: "
            + "; ".join(f"{k}: {v}" for k, v in sorted(failures.items())[:10]),
            {"failed": {k: str(v) for k, v in failures.items()}, "changed": changed,
             "restore": restore.model_dump(mode="json")},
            type="PartialFailure", non_retryable=not retryable)
    return UsersDisableOutput(disabled=[r.service for r in results if r.skipped is None], changed=changed,
                              skipped_essential=[r.service for r in results if r.skipped], restore=restore)


@implements(USERS_ENABLE)
def users_enable(inp: UsersEnableInput) -> UsersEnableOutput:
    token = consul_token(inp.consul)
    nomad_token = secret_of(inp.nomad.token) if inp.nomad is not None else None

    def one(rec: ServiceRecord) -> UserEnableOutput:
        client = consul_client(inp.consul, token=token or "")
        api = nomad_client(inp.nomad, token=nomad_token or "") if inp.nomad else None
        sub = UserEnableInput(consul=inp.consul, nomad=inp.nomad, journal_prefix=inp.journal_prefix, record=rec)
        return _enable_one(sub, client, api)

    results, failures, retryable = _fan_out("users-enable", inp.records, one, inp.max_parallel)
    changed = {r.service: r.changed for r in results if r.changed}
    changed |= {name: d["changed"] for name, exc in failures.items() if (d := _partial_details(exc)).get("changed")}
    if failures:
        raise ApplicationError(
            f"consul.users.enable: {len(failures)} of {len(inp.records)} service(s) failed; restored "
            f"{_changes_text(changed)}: " + "; ".join(f"{k}: {v}" for k, v in sorted(failures.items())[:10]),
            {"failed": {k: str(v) for k, v in failures.items()}, "changed": changed},
            type="PartialFailure", non_retryable=not retryable)
    return UsersEnableOutput(enabled=[r.service for r in results], changed=changed)

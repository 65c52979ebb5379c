"""Consul health checks that a Nomad job defines (a `service` block, provider consul): found and read in the
job spec, which is where they are changed, since Nomad's service sync resets any change made on the agent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from activities._clients import bad, call
from activities.contracts.consul_users import CheckPlace

__all__ = ["STRETCHED_FIELDS", "check_at", "differing", "find_check", "group_of", "read_job", "worst_status"]

# What consul.user.disable changes in a check while a service is disabled; every other field stays as recorded.
STRETCHED_FIELDS = ("Interval", "InitialStatus", "OnUpdate")
# Consul's check states from best to worst (https://developer.hashicorp.com/consul/api-docs/health).
_STATUS_ORDER = ("passing", "warning", "critical")


def read_job(api: Any, job: str, namespace: str) -> dict[str, Any]:
    """GET /v1/job/:id in a namespace, as the API returns it."""
    return call(f"read job {job}", lambda: api.job.request(job, method="get", params={"namespace": namespace}).json(),
                not_found=f"Nomad job {job!r} not found in namespace {namespace!r}")


def group_of(spec: dict[str, Any], group: str | None) -> dict[str, Any]:
    """The named task group, or the job's only one."""
    groups = spec.get("TaskGroups") or []
    if group is None:
        if len(groups) != 1:
            raise bad(f"job {spec['ID']} has {len(groups)} task groups {[g['Name'] for g in groups]}; name one")
        return groups[0]
    found = next((g for g in groups if g["Name"] == group), None)
    if found is None:
        raise bad(f"job {spec['ID']} has no task group {group!r} (has {[g['Name'] for g in groups]})")
    return found


def _blocks(tg: dict[str, Any]) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """(task name or None, service block) for every service block of a group."""
    for svc in tg.get("Services") or []:
        yield None, svc
    for task in tg.get("Tasks") or []:
        for svc in task.get("Services") or []:
            yield task["Name"], svc


def find_check(spec: dict[str, Any], group: str | None, service: str, check: str | None) -> CheckPlace:
    """Locate a Consul check by service block name and check name (default: the block's only check)."""
    tg = group_of(spec, group)
    where = f"job {spec['ID']} group {tg['Name']}"
    blocks = [(task, svc) for task, svc in _blocks(tg) if svc.get("Name") == service]
    if not blocks:
        names = sorted({svc.get("Name", "") for _, svc in _blocks(tg)})
        raise bad(f"{where} has no service block named {service!r} (has {names})")
    if len(blocks) > 1:
        raise bad(f"{where} has {len(blocks)} service blocks named {service!r}; cannot tell which check is meant")
    task, block = blocks[0]
    provider = block.get("Provider") or "consul"
    if provider != "consul":
        raise bad(f"service {service!r} of {where} uses provider {provider!r}: its checks are not Consul's")
    checks = block.get("Checks") or []
    if check is None:
        if len(checks) != 1:
            raise bad(f"service {service!r} of {where} has {len(checks)} checks "
                      f"{[c.get('Name') for c in checks]}; name one (check_name)")
        found = checks[0]
    else:
        found = next((c for c in checks if c.get("Name") == check), None)
        if found is None:
            raise bad(f"service {service!r} of {where} has no check {check!r} (has {[c.get('Name') for c in checks]})")
    return CheckPlace(group=tg["Name"], task=task, service=service, check=found["Name"])


def check_at(spec: dict[str, Any], place: CheckPlace) -> dict[str, Any] | None:
    """The check's object inside `spec` (edit it in place to change the spec), or None when it is gone."""
    tg = next((g for g in spec.get("TaskGroups") or [] if g["Name"] == place.group), None)
    if tg is None:
        return None
    for task, svc in _blocks(tg):
        if task == place.task and svc.get("Name") == place.service:
            return next((c for c in svc.get("Checks") or [] if c.get("Name") == place.check), None)
    return None


def differing(current: dict[str, Any], recorded: dict[str, Any], ignore: tuple[str, ...] = STRETCHED_FIELDS
              ) -> list[str]:
    """Fields whose values differ between two check objects, leaving out `ignore`."""
    return sorted(k for k in (set(current) | set(recorded)) - set(ignore) if current.get(k) != recorded.get(k))


def worst_status(statuses: list[str]) -> str | None:
    """The worst of Consul check states (None for none)."""
    known = [s for s in statuses if s in _STATUS_ORDER]
    return max(known, key=_STATUS_ORDER.index) if known else None

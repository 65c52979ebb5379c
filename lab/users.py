"""The lab's internal services (Consul users): usage flags, agent checks and Nomad jobs, made at `lab up`."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import httpx

from lab.inventory import UserService
from lab.settings import LabConfig

__all__ = ["LAB_USERS", "USAGE_PREFIX", "LabUser", "register_users", "user_services", "write_users_file"]

USAGE_PREFIX = "coldstart/usage"
CHECK_INTERVAL = "60s"  # the postmortem's interval, stretched to 10 min while a service is disabled
NOMAD_DC = "services"  # their own datacenter: their allocations never compete with the cache nodes


@dataclass(frozen=True)
class LabUser:
    name: str
    tier: str
    essential: bool = False
    count: int = 3


# Matchmaking keeps players in games once they are admitted: essential, never disabled.
LAB_USERS = (
    LabUser("matchmaker", "t1", essential=True),
    LabUser("inventory", "t2"),
    LabUser("economy", "t2"),
    LabUser("chat", "t3"),
    LabUser("avatar", "t3"),
)


def user_services(cfg: LabConfig) -> list[UserService]:
    """The inventory entries that consul.user.disable/enable act on."""
    agent = cfg.consul_url
    return [UserService(name=u.name, tier=u.tier, essential=u.essential, usage_flag_key=f"{USAGE_PREFIX}/{u.name}",
                        check_id=f"{u.name}-http", check_agent=agent, nomad_job=u.name, nomad_group="app")
            for u in LAB_USERS]


def write_users_file(cfg: LabConfig) -> Path:
    """What the internal load generator models: one entry per service with its baseline job count."""
    path = cfg.path("users", "internal-users.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([{"name": u.name, "essential": u.essential, "count": u.count,
                                 "flag": f"{USAGE_PREFIX}/{u.name}", "job": u.name} for u in LAB_USERS]))
    return path


def _job(user: LabUser) -> dict:
    sleep = shutil.which("sleep") or "/bin/sleep"
    return {"ID": user.name, "Name": user.name, "Type": "service", "Datacenters": [NOMAD_DC],
            "TaskGroups": [{"Name": "app", "Count": user.count,
                            "Tasks": [{"Name": user.name, "Driver": "raw_exec",
                                       "Config": {"command": sleep, "args": ["infinity"]}}]}]}


def register_users(cfg: LabConfig, consul_token: str) -> None:
    """Idempotent: flags are created only if absent (a drill's disabled state is never overwritten here)."""
    headers = {"X-Consul-Token": consul_token}
    with httpx.Client(timeout=10, headers=headers) as http:
        checks = http.get(f"{cfg.consul_url}/v1/agent/checks").raise_for_status().json()
        for user in LAB_USERS:
            # cas=0: create only; a re-run of `lab up` keeps whatever the flag says now.
            http.put(f"{cfg.consul_url}/v1/kv/{USAGE_PREFIX}/{user.name}", params={"cas": 0},
                     content=b"enabled").raise_for_status()
            http.put(f"{cfg.consul_url}/v1/agent/service/register",
                     json={"Name": user.name, "ID": user.name, "Port": 8000}).raise_for_status()
            if f"{user.name}-http" not in checks:
                http.put(f"{cfg.consul_url}/v1/agent/check/register", json={
                    "ID": f"{user.name}-http", "Name": f"{user.name} http", "ServiceID": user.name,
                    "HTTP": f"http://{cfg.ip('internal')}:8000/health", "Interval": CHECK_INTERVAL,
                    "Timeout": "5s", "Status": "passing"}).raise_for_status()
        for user in LAB_USERS:
            current = http.get(f"{cfg.nomad_url}/v1/job/{user.name}")
            if current.status_code == 404 or current.json().get("Stop"):
                http.post(f"{cfg.nomad_url}/v1/jobs", json={"Job": _job(user)}).raise_for_status()

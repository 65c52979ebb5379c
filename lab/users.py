"""The lab's internal services (Consul users): usage flags and Nomad jobs whose service blocks own the health
checks, made at `lab up`.

Each service is a Nomad job (raw_exec) in datacenter `services` running a tiny HTTP server on its
Nomad-allocated port; the job's `service` block (provider consul) registers the service in Consul with
an HTTP check of that port every 60 s. The check belongs to the job, so the inventory says so
(check_owner: nomad) and consul.user.disable stretches it in the job spec, where it stays.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from activities.consul.services import UserService
from lab.settings import LabConfig

__all__ = ["CHECK_INTERVAL", "LAB_USERS", "USAGE_PREFIX", "LabUser", "check_name", "register_users",
           "user_services", "write_users_file"]

USAGE_PREFIX = "coldstart/usage"
CHECK_INTERVAL = "60s"  # the postmortem's interval, stretched to 10 min while a service is disabled
NOMAD_DC = "services"  # their own datacenter: their allocations never compete with the cache nodes
GROUP = "app"
PORT_LABEL = "http"
NS_PER_S = 1_000_000_000

# The task: answers 200 to any request on the port Nomad allocated (NOMAD_IP_/NOMAD_PORT_<label>), which is
# what the check targets. Without an allocated port it listens on any free one.
HTTP_SERVER = f"""\
import os, socket
srv = socket.create_server((os.environ.get("NOMAD_IP_{PORT_LABEL}", "0.0.0.0"),
                            int(os.environ.get("NOMAD_PORT_{PORT_LABEL}", "0"))))
while True:
    conn, _ = srv.accept()
    with conn:
        try:
            conn.settimeout(5)
            conn.recv(4096)
            conn.sendall(b"HTTP/1.0 200 OK\\r\\nContent-Type: text/plain\\r\\nContent-Length: 3\\r\\n\\r\\nok\\n")
        except OSError:
            pass
"""


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


def check_name(user: LabUser) -> str:
    return f"{user.name} http"


def user_services(cfg: LabConfig) -> list[UserService]:
    """The inventory entries that consul.user.disable/enable act on: the check is the job's (check_owner nomad)."""
    return [UserService(name=u.name, tier=u.tier, essential=u.essential, usage_flag_key=f"{USAGE_PREFIX}/{u.name}",
                        nomad_job=u.name, nomad_group=GROUP, check_owner="nomad", check_service=u.name,
                        check_name=check_name(u))
            for u in LAB_USERS]


def write_users_file(cfg: LabConfig) -> Path:
    """What the internal load generator models: one entry per service with its baseline job count."""
    path = cfg.path("users", "internal-users.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([{"name": u.name, "essential": u.essential, "count": u.count,
                                 "flag": f"{USAGE_PREFIX}/{u.name}", "job": u.name} for u in LAB_USERS]))
    return path


def _nanoseconds(text: str) -> int:
    units = {"ms": NS_PER_S // 1000, "s": NS_PER_S, "m": 60 * NS_PER_S, "h": 3600 * NS_PER_S}
    unit = "ms" if text.endswith("ms") else text[-1]
    return int(text[: -len(unit)]) * units[unit]


def job_spec(user: LabUser, *, datacenter: str = NOMAD_DC, python: str = sys.executable,
             check_interval: str = CHECK_INTERVAL) -> dict:
    """The service's Nomad job (API JSON): the server task, and the service block owning the HTTP check."""
    return {
        "ID": user.name, "Name": user.name, "Type": "service", "Datacenters": [datacenter],
        # Short deployments: a task is healthy once it has run for 5 s. With Nomad's default (checks), a
        # deployment would last until Consul first ran the 60 s check, at a random offset within its interval
        # (up to a minute), and every change to the job waits out the one before it.
        "Update": {"MinHealthyTime": 5 * NS_PER_S, "HealthCheck": "task_states"},
        "TaskGroups": [{
            "Name": GROUP, "Count": user.count,
            "Networks": [{"DynamicPorts": [{"Label": PORT_LABEL}]}],
            "Services": [{
                "Name": user.name, "PortLabel": PORT_LABEL, "Provider": "consul",
                "Checks": [{"Name": check_name(user), "Type": "http", "Path": "/health",
                            "Interval": _nanoseconds(check_interval), "Timeout": 5 * NS_PER_S}],
            }],
            "Tasks": [{"Name": user.name, "Driver": "raw_exec",
                       "Config": {"command": python, "args": ["-I", "-S", "-c", HTTP_SERVER]},
                       "Resources": {"CPU": 20, "MemoryMB": 32}}],
        }],
    }


def register_users(cfg: LabConfig, consul_token: str, *, consul_url: str | None = None, nomad_url: str | None = None,
                   datacenter: str = NOMAD_DC, python: str = sys.executable,
                   check_interval: str = CHECK_INTERVAL) -> None:
    """Idempotent: flags are created only if absent and jobs registered only if absent or stopped (a drill's
    disabled state, flag or job, is never overwritten here)."""
    consul_url = consul_url or cfg.consul_url
    nomad_url = nomad_url or cfg.nomad_url
    with httpx.Client(timeout=10, headers={"X-Consul-Token": consul_token}) as http:
        for user in LAB_USERS:
            # cas=0: create only; a re-run of `lab up` keeps whatever the flag says now.
            http.put(f"{consul_url}/v1/kv/{USAGE_PREFIX}/{user.name}", params={"cas": 0},
                     content=b"enabled").raise_for_status()
    with httpx.Client(timeout=10) as http:
        for user in LAB_USERS:
            current = http.get(f"{nomad_url}/v1/job/{user.name}")
            if current.status_code == 404 or current.json().get("Stop"):
                spec = job_spec(user, datacenter=datacenter, python=python, check_interval=check_interval)
                http.post(f"{nomad_url}/v1/jobs", json={"Job": spec}).raise_for_status()

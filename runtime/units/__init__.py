"""The systemd units shipped with the package (worker, trigger receiver, readiness timer) and their installation.

Each written unit starts with a header recording the sha256 of its body: a rewrite replaces a unit that still
matches its header (one an earlier install wrote) and refuses one edited since, unless forced."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from activities.errors import Refused

__all__ = ["HARDENING", "InstalledUnit", "UnitsRefused", "install_units", "render_units"]

# Nothing local needs a privilege: the firewall and host actions run their commands over SSH on their hosts,
# and the controller only makes outbound connections (and the trigger receiver and metrics listen on ports
# above 1024). Not MemoryDenyWriteExecute: libffi's closures (cffi, ctypes) need writable executable memory.
HARDENING = """\
NoNewPrivileges=yes
CapabilityBoundingSet=
AmbientCapabilities=
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RemoveIPC=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallErrorNumber=EPERM
"""

_HEADER = "# Written by `coldstart install-units`; change it with a drop-in (systemctl edit {name}): an edited\n" \
          "# file is not replaced without --force. sha256 of what follows: {digest}\n"
_RECORDED = re.compile(r"\A# Written by `coldstart install-units`.*\n# .*sha256 of what follows: ([0-9a-f]{64})\n",
                       re.DOTALL)
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


class UnitsRefused(Refused, ValueError):
    """Units were not installed; the message says why, and nothing was written."""


@dataclass(frozen=True)
class InstalledUnit:
    path: Path
    outcome: Literal["wrote", "updated", "unchanged", "replaced"]  # replaced: an edited file, with --force


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


def render_units(executable: Path, user: str) -> dict[str, str]:
    """Each unit's file name and text: `executable` is the installed `coldstart`, `user` the account they run as."""
    if not _USER.match(user):
        raise UnitsRefused(f"--user {user!r}: not a system user name")
    if not executable.is_absolute() or any(c.isspace() for c in str(executable)):
        raise UnitsRefused(f"--exec {executable}: an absolute path without spaces")
    rendered: dict[str, str] = {}
    for entry in sorted(resources.files(__name__).iterdir(), key=lambda e: e.name):
        if not entry.name.endswith((".service", ".timer")):
            continue
        body = (entry.read_text().replace("@EXEC@", str(executable)).replace("@USER@", user)
                .replace("@HARDENING@\n", HARDENING))
        rendered[entry.name] = _HEADER.format(name=entry.name, digest=_digest(body)) + body
    return rendered


def _edited(text: str) -> bool:
    """Whether a unit file differs from what its header says an install wrote (or has no such header)."""
    recorded = _RECORDED.match(text)
    return recorded is None or _digest(text[recorded.end():]) != recorded.group(1)


def install_units(directory: Path, executable: Path, user: str, *, force: bool = False) -> list[InstalledUnit]:
    """Write the units into `directory`: an unchanged file is left alone, one an earlier install wrote is
    updated, an edited one is refused (before anything is written) unless `force`."""
    units = render_units(executable, user)
    plan: list[InstalledUnit] = []
    edited: list[str] = []
    for name, text in units.items():
        path = directory / name
        try:
            current = path.read_text()
        except FileNotFoundError:
            plan.append(InstalledUnit(path, "wrote"))
            continue
        if current == text:
            plan.append(InstalledUnit(path, "unchanged"))
        elif _edited(current):
            edited.append(str(path))
            plan.append(InstalledUnit(path, "replaced"))
        else:
            plan.append(InstalledUnit(path, "updated"))
    if edited and not force:
        raise UnitsRefused(f"edited since installed: {', '.join(edited)}; keep local changes in a drop-in "
                           "(systemctl edit NAME), or --force to replace them")
    directory.mkdir(parents=True, exist_ok=True)
    for unit in plan:
        if unit.outcome != "unchanged":
            _write(unit.path, units[unit.path.name])
    return plan


def _write(path: Path, text: str) -> None:
    """Replace `path` at once (a reader never sees half a unit), mode 0644."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise

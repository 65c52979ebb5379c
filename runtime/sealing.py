"""The workers' sealing keys and the two local activities that seal and verify what runs carry forward.

The keys live in one file only workers read (`COLDSTART_SEAL_KEYS`, default
`~/.local/state/coldstart/seal-keys`), one key a line: `<key id> <base64 secret>`. The first line seals; every
line verifies, so a key is rotated by adding a new first line (`coldstart worker rotate-seal-key`) and
removing the old one once no run that it sealed is still going. Every worker of a deployment reads the same
file. A worker that finds no file makes one with a fresh key (mode 0600), for a single host; on several hosts,
distribute the file like any other secret before the workers start.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.errors import InvalidInput
from workflows.seals import SEAL_ACTIVITY, VERIFY_SEAL_ACTIVITY, Seal, SealRequest

__all__ = ["SEAL_KEYS_ENV", "SealKeys", "SealKeysInvalid", "Sealer", "default_keys_path"]

SEAL_KEYS_ENV = "COLDSTART_SEAL_KEYS"
_MIN_SECRET = 32


class SealKeysInvalid(InvalidInput):
    """The sealing key file cannot be used (one line naming the file and the line)."""


def default_keys_path(environ: Mapping[str, str] = os.environ) -> Path:
    """$COLDSTART_SEAL_KEYS, else ~/.local/state/coldstart/seal-keys."""
    given = environ.get(SEAL_KEYS_ENV)
    if given:
        return Path(given)
    state = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "coldstart" / "seal-keys"


def _new_line() -> str:
    key_id = secrets.token_hex(4)
    return f"{key_id} {base64.b64encode(secrets.token_bytes(32)).decode()}\n"


@dataclass(frozen=True)
class SealKeys:
    """The keys by id; `current` seals."""

    current: str
    keys: dict[str, bytes]
    path: Path | None = None

    @classmethod
    def load(cls, path: Path, *, create: bool = True) -> SealKeys:
        """Read the key file; with `create`, make one with a fresh key when there is none."""
        if create and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass  # another worker made it meanwhile: read theirs
            else:
                with os.fdopen(fd, "w") as out:
                    out.write(_new_line())
        try:
            text = path.read_text()
        except OSError as exc:
            raise SealKeysInvalid(f"{path}: cannot read the sealing keys: {exc.strerror or exc}") from None
        if path.stat().st_mode & 0o077:
            raise SealKeysInvalid(f"{path}: the sealing keys are readable by others (mode "
                                  f"{path.stat().st_mode & 0o777:o}); chmod 600 it")
        keys: dict[str, bytes] = {}
        current = ""
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2:
                raise SealKeysInvalid(f"{path}:{number}:1: a key line is '<key id> <base64 secret>'")
            key_id, encoded = parts
            try:
                secret = base64.b64decode(encoded, validate=True)
            except ValueError:
                raise SealKeysInvalid(f"{path}:{number}:{len(key_id) + 2}: the secret is not base64") from None
            if len(secret) < _MIN_SECRET:
                raise SealKeysInvalid(f"{path}:{number}:{len(key_id) + 2}: the secret has {len(secret)} bytes, "
                                      f"at least {_MIN_SECRET} are needed")
            if key_id in keys:
                raise SealKeysInvalid(f"{path}:{number}:1: key id {key_id!r} appears twice")
            keys[key_id] = secret
            current = current or key_id
        if not keys:
            raise SealKeysInvalid(f"{path}: holds no sealing key")
        return cls(current=current, keys=keys, path=path)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> SealKeys:
        return cls.load(default_keys_path(environ))

    @staticmethod
    def rotate(path: Path) -> str:
        """Put a new key first (it seals from the next worker start on); the old ones still verify. Returns
        the new key's id."""
        old = path.read_text() if path.exists() else ""
        line = _new_line()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        temporary = path.with_name(path.name + ".new")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(line + old)
        temporary.replace(path)
        return line.split()[0]

    def mac(self, key_id: str, request: SealRequest) -> str:
        message = f"{request.digest}\n{request.place}".encode()
        return hmac.new(self.keys[key_id], message, hashlib.sha256).hexdigest()


class Sealer:
    """The worker's `coldstart.seal` and `coldstart.verify_seal` local activities."""

    def __init__(self, keys: SealKeys) -> None:
        self._keys = keys

    @activity.defn(name=SEAL_ACTIVITY)
    async def seal(self, request: SealRequest) -> Seal:
        _only_local(SEAL_ACTIVITY)
        return Seal(key_id=self._keys.current, mac=self._keys.mac(self._keys.current, request))

    @activity.defn(name=VERIFY_SEAL_ACTIVITY)
    async def verify(self, request: SealRequest) -> None:
        _only_local(VERIFY_SEAL_ACTIVITY)
        given = request.seal
        if given is None:
            raise ApplicationError("the carried input has no seal: only the controller hands a plan on",
                                   type="SealRefused", non_retryable=True)
        if given.key_id not in self._keys.keys:
            raise ApplicationError(f"the carried input is sealed with key {given.key_id!r}, which no worker key "
                                   "file here holds", type="SealRefused", non_retryable=True)
        if not hmac.compare_digest(given.mac, self._keys.mac(given.key_id, request)):
            raise ApplicationError(f"the carried input's seal does not hold for {request.place.split(':')[0]} "
                                   "here: it was changed, or sealed for another run", type="SealRefused",
                                   non_retryable=True)


def _only_local(name: str) -> None:
    """A seal is made and checked only as a local activity, which only a workflow on this worker schedules: as
    an ordinary activity task (a client's standalone activity on the queue) it would be a signing oracle."""
    if not activity.info().is_local:
        raise ApplicationError(f"{name} runs only as a local activity of a run on this worker",
                               type="SealRefused", non_retryable=True)

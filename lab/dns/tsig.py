"""The lab's TSIG key: generated at setup, stored 0600 in the state dir until the lab moves it to Vault."""

from __future__ import annotations

import base64
import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["ALGORITHM", "TsigKey", "generate_key", "load_key", "save_key"]

ALGORITHM = "hmac-sha256"


@dataclass(frozen=True)
class TsigKey:
    """Key material; `repr` hides the secret so it never lands in a log or a traceback."""

    name: str
    algorithm: str
    secret: str  # base64, as pdns and dnspython take it

    def __repr__(self) -> str:
        return f"TsigKey(name={self.name!r}, algorithm={self.algorithm!r}, secret=<redacted>)"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def generate_key(name: str) -> TsigKey:
    # 32 random bytes = the HMAC-SHA256 block-size recommendation's lower bound (RFC 8945 §6).
    return TsigKey(name=name, algorithm=ALGORITHM, secret=base64.b64encode(secrets.token_bytes(32)).decode())


def save_key(key: TsigKey, path: Path) -> None:
    # Create with 0600 from the start rather than chmod after, so there is no readable window.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(key.as_dict(), fh)


def load_key(path: Path) -> TsigKey:
    data = json.loads(path.read_text())
    return TsigKey(name=data["name"], algorithm=data["algorithm"], secret=data["secret"])

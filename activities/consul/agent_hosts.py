"""A Consul agent as an inventory lists it (shell, API, config directory, restart) and its streaming setting."""

from __future__ import annotations

import json
import posixpath
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from activities._fields import BaseUrl
from activities.contracts.targets import HostTarget

__all__ = ["DROP_IN", "ConsulAgentHost", "Role", "StreamingReport", "drop_in", "wanted"]

DROP_IN = "coldstart-streaming.json"
Role = Literal["client", "server"]


class ConsulAgentHost(HostTarget):
    """One Consul agent: the host's shell, the agent's own API, where its config directory is, how it restarts."""

    role: Role
    http: BaseUrl = Field(description="the agent's own HTTP API as the worker reaches it")
    config_dir: str = Field(description="absolute path of a directory the agent reads with -config-dir")
    restart: list[str] = Field(min_length=1, max_length=64,
                               description="argv run on the host that restarts the agent (systemctl restart consul)")

    @field_validator("config_dir")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not path.startswith("/") or "\0" in path or ".." in path.split("/"):
            raise ValueError(f"config_dir {path[:120]!r} must be an absolute path without '..'")
        return posixpath.normpath(path)

    @field_validator("restart")
    @classmethod
    def _argv(cls, argv: list[str]) -> list[str]:
        if not argv[0] or any("\0" in part for part in argv):
            raise ValueError("restart must be an argv list with a program first")
        return argv


class StreamingReport(BaseModel):
    """What an agent reports in /v1/agent/self's DebugConfig; enable_streaming is a server's rpc.enable_streaming."""

    use_streaming_backend: bool
    enable_streaming: bool | None = None


def drop_in(role: Role, enabled: bool) -> str:
    """The drop-in's text: the client setting, and on servers the RPC side of streaming too."""
    cfg: dict[str, Any] = {"use_streaming_backend": enabled}
    if role == "server":
        cfg["rpc"] = {"enable_streaming": enabled}
    return json.dumps(cfg, indent=2, sort_keys=True) + "\n"


def wanted(role: Role, enabled: bool) -> StreamingReport:
    """What the agent reports once the drop-in is in effect."""
    return StreamingReport(use_streaming_backend=enabled, enable_streaming=enabled if role == "server" else None)

"""Runs the infra Pulumi program under mocks and records every resource with its inputs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pulumi
import yaml

from infra.policy import ResourceRecord

__all__ = ["INFRA_DIR", "SAMPLE_SECRETS", "RecordingMocks", "build_graph", "sample_config"]

INFRA_DIR = Path(__file__).resolve().parents[2] / "infra"
PROJECT = "coldstart-telemetry"
SAMPLE_SECRETS = {
    "pagingWebhookUrl": "https://pager.example.net/hooks/coldstart-7f3a",
    "sshPrivateKey": "-----BEGIN OPENSSH PRIVATE KEY-----\nmock\n-----END OPENSSH PRIVATE KEY-----\n",
    "grafanaAuth": "glsa_mocktoken",
    "scrapeTokens": {"consul": "consul-acl-mock", "vault": "hvs.mock"},
}


class RecordingMocks(pulumi.runtime.Mocks):
    """Echo inputs back as outputs (plus ids/uids), and keep a record for the assertions and the policy."""

    def __init__(self) -> None:
        self.resources: list[ResourceRecord] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(ResourceRecord(args.typ, args.name, dict(args.inputs)))
        outputs = dict(args.inputs)
        outputs.setdefault("uid", f"{args.name}-uid")
        return [f"{args.name}-id", outputs]

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}

    def of_type(self, typ: str) -> list[ResourceRecord]:
        return [r for r in self.resources if r.type_ == typ]


def sample_config() -> dict[str, Any]:
    """Pulumi.sample.yaml's config block with the project prefix stripped."""
    raw = yaml.safe_load((INFRA_DIR / "Pulumi.sample.yaml").read_text())["config"]
    return {key.split(":", 1)[1]: value for key, value in raw.items()}


_LOOP = asyncio.new_event_loop()


def build_graph(config: dict[str, Any] | None = None, secrets: dict[str, Any] | None = None):
    """Build the program for a stack config under mocks; returns (mocks, program result)."""
    config = sample_config() if config is None else config
    secrets = SAMPLE_SECRETS if secrets is None else secrets
    flat = {**config, **secrets}
    mocks = RecordingMocks()
    # Pulumi's resources make futures on the main thread's current loop; whatever ran before in this test
    # process (asyncio.run closes its loop and unsets it) must not decide whether there is one.
    asyncio.set_event_loop(_LOOP)
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack="sample", preview=False)
    pulumi.runtime.set_all_config(
        {f"{PROJECT}:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in flat.items()},
        secret_keys=[f"{PROJECT}:{k}" for k in secrets],
    )
    from infra import program

    holder: dict[str, Any] = {}

    @pulumi.runtime.test
    def run():
        holder["result"] = program.main()

    run()
    return mocks, holder["result"]

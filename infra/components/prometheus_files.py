"""A Prometheus someone else runs (the lab's): its config and rules, each checked before the swap, then a reload."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import pulumi
from pulumi_command import remote

from infra.components.remote_file import deploy_file, sudo_prefix
from infra.telemetry.prometheus_config import CONFIG_FILENAME

__all__ = ["PrometheusFiles", "PrometheusFilesArgs"]


@dataclass
class PrometheusFilesArgs:
    address: str
    # Absolute directory holding prometheus.yml (the rules sit in rules/ below it).
    config_dir: str
    # {path relative to config_dir: text}, as infra.telemetry.prometheus_file_texts renders them.
    files: dict[str, str]
    # Prometheus' lifecycle endpoint (--web.enable-lifecycle): a failed reload answers 500 with the reason.
    reload_url: str
    user: str = "root"
    port: int = 22
    host_key: str | None = None
    ssh_private_key: pulumi.Input[str] | None = None


class PrometheusFiles(pulumi.ComponentResource):
    """One file resource per rendered file (keyed by its sha256) and one reload after any of them changes."""

    def __init__(self, name: str, args: PrometheusFilesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("coldstart:telemetry:PrometheusFiles", name, None, opts)
        conn = remote.ConnectionArgs(host=args.address, port=args.port, user=args.user,
                                     private_key=args.ssh_private_key, host_key=args.host_key)
        q = shlex.quote
        self.files: dict[str, remote.Command] = {}
        digests: list[pulumi.Output[str]] = []
        # Rules first: the config check reads the rule files the config names, from their final place.
        for rel in sorted(args.files, key=lambda r: r == CONFIG_FILENAME):
            path = f"{args.config_dir.rstrip('/')}/{rel}"
            check = ('promtool check config "$tmp" >&2' if rel == CONFIG_FILENAME
                     else 'promtool check rules "$tmp" >&2')
            cmd, digest = deploy_file(
                f"{name}-file-{rel.replace('/', '-')}", connection=conn, user=args.user, path=path,
                content=args.files[rel], check=check,
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(self.files.values())),
            )
            self.files[path] = cmd
            digests.append(digest)
        s = sudo_prefix(args.user)
        self.reload = remote.Command(
            f"{name}-reload",
            connection=conn,
            # curl -f fails on the 500 a rejected config gets; the body carries Prometheus' reason.
            create=f"set -eu; {s}curl -sS --fail-with-body -X POST {q(args.reload_url)} >&2",
            triggers=digests,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(self.files.values())),
        )
        self.register_outputs({"files": sorted(self.files), "reloadUrl": args.reload_url})

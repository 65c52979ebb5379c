"""One namespace host with sshd and a real Prometheus, as `lab up` starts it, deployed by a real `pulumi up`."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from infra.engine import PulumiEngine
from lab.cli import lab_app
from lab.hosts import create, destroy, start_daemon, wait_for_port
from lab.lifecycle import CONFIG
from lab.services import Secrets
from lab.settings import LabConfig
from lab.telemetry_stack import STACK, TELEMETRY_HOST, lab_backends, render_in_place, telemetry_ssh_spec

__all__ = ["PulumiLab", "deployed_files", "pulumi_lab"]

@dataclass
class PulumiLab:
    cfg: LabConfig
    engine: PulumiEngine
    # The stack configuration the first `up` deployed (keys without the project prefix).
    config: dict
    first_up_s: float
    # {path under the config dir: text} as `lab up` rendered them, before Pulumi deployed its own.
    lab_up_files: dict[str, str]

    @property
    def prometheus_url(self) -> str:
        return self.cfg.prometheus_url


def deployed_files(cfg: LabConfig) -> dict[str, str]:
    root = cfg.path("prometheus")
    return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file() and "data" not in p.parts}


@contextmanager
def pulumi_lab(state_dir: Path, bin_dir: Path, *, prefix: str = "csi",
               subnet: str = "10.221.0.0/24") -> Iterator[PulumiLab]:
    """Build the host, start Prometheus on `lab up`'s files, run `coldstart lab telemetry --pulumi`.

    bin_dir is the engine that command finds (scripts/pulumi-install.sh); the caller drives it afterwards.
    """
    cfg = LabConfig(state_dir=state_dir, inventory_path=state_dir.parent / "lab.yaml", prefix=prefix,
                    bridge=f"{prefix}br0", veth_prefix=f"{prefix}v", subnet=ipaddress.IPv4Network(subnet))
    # Only the telemetry host's namespace: the deploy needs its sshd and its Prometheus, nothing else.
    spec = telemetry_ssh_spec(cfg).model_copy(update={"hosts": {TELEMETRY_HOST: cfg.spec.hosts[TELEMETRY_HOST]}})
    destroy(spec)  # a crashed earlier run is swept by name prefix first
    try:
        create(spec)
        sec = Secrets(cfg)
        sec.ensure()
        # The backends `coldstart lab telemetry` will see (no inventory here: what PATH holds).
        conf = render_in_place(cfg, sec, lab_backends(cfg))
        lab_up_files = deployed_files(cfg)
        prom = start_daemon(spec, TELEMETRY_HOST, "prometheus", [
            "/usr/bin/prometheus", f"--config.file={conf}", f"--storage.tsdb.path={cfg.path('prometheus', 'data')}",
            f"--web.listen-address={cfg.ip(TELEMETRY_HOST)}:{cfg.ports.prometheus}", "--web.enable-lifecycle"])
        wait_for_port(cfg.ip(TELEMETRY_HOST), cfg.ports.prometheus, timeout=30, pid=prom.pid)
        # As `lab up` leaves it for the commands after it; then the command a user runs.
        cfg.path(CONFIG).write_text(cfg.model_dump_json())
        t = time.perf_counter()
        out = CliRunner().invoke(lab_app, ["telemetry", "--pulumi", "--state-dir", str(state_dir)])
        if out.exit_code != 0:
            raise RuntimeError(f"coldstart lab telemetry --pulumi failed: {out.output}")
        first_up_s = time.perf_counter() - t
        engine = PulumiEngine(bin_dir=bin_dir, root=cfg.path("pulumi"), stack=STACK)
        yield PulumiLab(cfg, engine, engine.read_config(), first_up_s, lab_up_files)
    finally:
        destroy(spec)

"""Runs the Pulumi CLI on infra/ against a local (file://) state backend, with nothing downloaded."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from activities.errors import ColdstartError
from activities.retry import format_duration

__all__ = ["COMMAND_PROVIDER", "PROJECT", "PulumiEngine", "PulumiError", "find_engine", "missing_engine_reason"]

REPO = Path(__file__).resolve().parent.parent
INSTALL = REPO / "scripts" / "pulumi-install.sh"
PROJECT = "coldstart-telemetry"
# The provider the program's TelemetryHost/PrometheusFiles use; matches pulumi-command in requirements.lock.
COMMAND_PROVIDER = ("command", "1.2.1")


class PulumiError(ColdstartError):
    """A pulumi command failed; the message says which resource failed and what it printed."""


def _install_output() -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(INSTALL)], capture_output=True, text=True, timeout=300, check=False)


def find_engine() -> Path | None:
    """The folder holding `pulumi` (the user's own, else ../shared/pulumi unpacked), or None."""
    proc = _install_output()
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    return Path(proc.stdout.strip().splitlines()[-1])


def missing_engine_reason() -> str | None:
    """One line saying why no Pulumi engine can run here, or None when one can."""
    proc = _install_output()
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or ["scripts/pulumi-install.sh failed"])[-1]
    bin_dir = Path(proc.stdout.strip())
    for tool in ("pulumi", "pulumi-language-python"):
        if not (bin_dir / tool).exists() and not _on_path(tool):
            return f"no {tool} beside {bin_dir / 'pulumi'} or on PATH"
    return None


def _on_path(tool: str) -> bool:
    return any((Path(d) / tool).exists() for d in os.environ.get("PATH", "").split(os.pathsep) if d)


_PROGRESS = re.compile(r"(\S+:\S*:\S+) (\S+) .*?\]; (.*)$")
_FAILED = re.compile(r"(\S+:\S*:\S+) (\S+) \*\*[\w ]*failed\*\*")


def _summary(output: str, limit: int = 30) -> str:
    """What each failed resource printed (promtool's reason, curl's answer), then the engine's errors.

    The Python program's traceback after an aborted update is left out: the engine stopped it.
    """
    lines = output.strip().splitlines()
    failed = {m.group(2) for line in lines if (m := _FAILED.search(line))}
    picked = [f"{m.group(2)}: {m.group(3).strip()}" for line in lines
              if (m := _PROGRESS.search(line)) and m.group(2) in failed and m.group(3).strip()]
    picked += [line.strip() for line in lines if line.strip().startswith("error:")]
    picked = list(dict.fromkeys(picked))
    return "\n".join(picked[-limit:] if picked else lines[-limit:])


@dataclass(frozen=True)
class PulumiEngine:
    """One workspace: a Pulumi.yaml whose `main` is infra/, its stack file, PULUMI_HOME and the state."""

    bin_dir: Path
    root: Path  # everything below: home/, state/, project/, passphrase
    stack: str = "lab"

    @property
    def project_dir(self) -> Path:
        return self.root / "project"

    @property
    def stack_file(self) -> Path:
        return self.project_dir / f"Pulumi.{self.stack}.yaml"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "PATH": f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}",
            "PULUMI_HOME": str(self.root / "home"),
            "PULUMI_BACKEND_URL": (self.root / "state").as_uri(),
            # Only the plugins installed into PULUMI_HOME from files: nothing ambient, nothing fetched.
            "PULUMI_IGNORE_AMBIENT_PLUGINS": "1",
            # The venv's pulumiverse-grafana makes the engine fetch its provider, needed only with grafanaUrl.
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            "PULUMI_SKIP_UPDATE_CHECK": "1",
            "PULUMI_CONFIG_PASSPHRASE_FILE": str(self.root / "passphrase"),
        })
        env.pop("PULUMI_CONFIG_PASSPHRASE", None)
        return env

    def prepare(self, config: Mapping[str, Any]) -> None:
        """Write the workspace (project file, stack config), install the provider from a file, init the stack."""
        for sub in ("home", "state", "project"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        passphrase = self.root / "passphrase"
        if not passphrase.exists():
            fd = os.open(passphrase, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(24) + "\n")
        project = {
            "name": PROJECT,
            "runtime": {"name": "python",
                        "options": {"toolchain": "pip", "virtualenv": str(REPO / ".venv")}},
            # The program stays in the repository; only this workspace lives in the state dir.
            "main": os.path.relpath(REPO / "infra", self.project_dir),
        }
        (self.project_dir / "Pulumi.yaml").write_text(yaml.safe_dump(project, sort_keys=False))
        self.write_config(config)
        self._install_provider()
        if not (self.root / "state" / ".pulumi" / "stacks" / PROJECT / f"{self.stack}.json").exists():
            self.run("stack", "select", "--create", self.stack)

    def read_config(self) -> dict[str, Any]:
        """The stack's plain configuration, keys without the project prefix."""
        raw = (yaml.safe_load(self.stack_file.read_text()) or {}).get("config") or {}
        return {key.split(":", 1)[1]: value for key, value in raw.items()}

    def write_config(self, config: Mapping[str, Any]) -> None:
        """Replace the stack's plain (non-secret) configuration; keeps the encryption salt pulumi wrote."""
        current: dict[str, Any] = {}
        if self.stack_file.exists():
            current = yaml.safe_load(self.stack_file.read_text()) or {}
        current["config"] = {f"{PROJECT}:{key}": value for key, value in config.items()}
        self.stack_file.write_text(yaml.safe_dump(current, sort_keys=False))

    def _install_provider(self) -> None:
        kind, version = COMMAND_PROVIDER
        if (self.root / "home" / "plugins" / f"resource-{kind}-v{version}").exists():
            return
        name = f"pulumi-resource-{kind}"
        user_home = Path(os.environ.get("PULUMI_HOME") or Path.home() / ".pulumi")
        # Beside the CLI (../shared/pulumi), in the user's own PULUMI_HOME, or an earlier unpack.
        candidates = [self.bin_dir / name, user_home / "plugins" / f"resource-{kind}-v{version}" / name,
                      REPO / ".cache" / "pulumi" / name]
        binary = next((c for c in candidates if c.is_file()), None)
        if binary is None:
            raise PulumiError(f"no {name} {version} in {', '.join(map(str, candidates))}: run "
                              f"`pulumi plugin install resource {kind} {version}` where the network allows, "
                              "or provide ../shared/pulumi")
        self.run("plugin", "install", "resource", kind, version, "--file", str(binary))

    def run(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """`pulumi ARGS` in this workspace (stack commands get --cwd and --stack); PulumiError if it fails."""
        argv = [str(self.bin_dir / "pulumi"), *args, "--non-interactive"]
        if args[0] in {"preview", "up", "destroy", "refresh", "stack"}:
            argv += ["--cwd", str(self.project_dir)]
            if args[0] != "stack":
                argv += ["--stack", self.stack]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, env=self.env(), timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise PulumiError(f"pulumi {' '.join(args)} did not finish within {format_duration(timeout)}") from None
        if check and proc.returncode != 0:
            summary = _summary(proc.stdout + proc.stderr)
            raise PulumiError(f"pulumi {' '.join(args)} failed ({proc.returncode}):\n{summary}")
        return proc

    def preview(self) -> dict[str, str]:
        """{resource URN: planned operation} for every resource that is not unchanged."""
        proc = self.run("preview", "--json")
        steps = json.loads(proc.stdout).get("steps", [])
        return {step["urn"]: step["op"] for step in steps if step.get("op") != "same"}

    def up(self, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("up", "--yes", "--skip-preview", check=check)

    def destroy(self) -> subprocess.CompletedProcess[str]:
        return self.run("destroy", "--yes", "--skip-preview")

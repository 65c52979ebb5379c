"""requirements.lock pins every dependency with hashes, and the .venv under test is exactly the lock
(requirements-py313.lock and .venv-py313 on Python 3.13).

Offline and fast: reads pyproject.toml, the lock and the installed distributions' metadata.
`make lock` regenerates the lock (README, "Reproducible installs").
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
# One lock per Python CI runs (Makefile `lock`): requirements.lock for .venv (3.11), requirements-py313.lock
# for .venv-py313; the tests hold the interpreter running them to its own.
LOCKS = {"3.11": "requirements.lock", "3.13": "requirements-py313.lock"}
LOCK_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
if LOCK_PYTHON not in LOCKS:
    LOCK_PYTHON = "3.11"
LOCK = REPO / LOCKS[LOCK_PYTHON]
PROJECT = "coldstart"
# The platform the lock is resolved for (Makefile: --python-version X.Y --python-platform x86_64-manylinux_2_28).
LOCK_ENV = {"python_version": LOCK_PYTHON, "python_full_version": f"{LOCK_PYTHON}.0", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython"}
_HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def parse_lock(text: str) -> dict[str, tuple[Version, int]]:
    """name -> (pinned version, number of sha256 hashes) for each `name==version --hash=...` entry."""
    entries: dict[str, tuple[Version, int]] = {}
    logical = re.sub(r"\\\n", " ", "\n".join(line.split(" #", 1)[0] for line in text.splitlines()))
    for line in logical.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise ValueError(f"requirements.lock: option line {line[:60]!r}: only hashed pins belong in the lock")
        spec, _, options = line.partition(" --hash")
        req = Requirement(spec)
        pins = [s for s in req.specifier if s.operator == "=="]
        if len(pins) != 1 or len(req.specifier) != 1 or "*" in pins[0].version:
            raise ValueError(f"requirements.lock: {spec!r} is not pinned with == to one version")
        name = canonicalize_name(req.name)
        if name in entries:
            raise ValueError(f"requirements.lock: {name} is pinned twice")
        entries[name] = (Version(pins[0].version), len(_HASH.findall("--hash" + options if options else "")))
    return entries


def declared_requirements(pyproject: dict) -> list[Requirement]:
    """The runtime dependencies and every extra (`make lock` resolves them all), as requirements (markers for
    the lock's platform). An extra naming the project's own (coldstart[lab,infra]) adds nothing of its own."""
    project = pyproject["project"]
    extras = project.get("optional-dependencies", {}).values()
    raw = [*project["dependencies"], *(spec for specs in extras for spec in specs)]
    return [r for r in map(Requirement, raw)
            if canonicalize_name(r.name) != PROJECT and (r.marker is None or r.marker.evaluate(LOCK_ENV))]


def unpinned(requirements: list[Requirement], lock: dict[str, tuple[Version, int]]) -> list[str]:
    """What the lock lacks for these requirements: a missing pin, a pin outside the range, no hash."""
    problems = []
    for req in requirements:
        name = canonicalize_name(req.name)
        if name not in lock:
            problems.append(f"{req}: not in requirements.lock")
            continue
        version, hashes = lock[name]
        if not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req}: locked at {version}, outside the range")
        if not hashes:
            problems.append(f"{req}: locked without a --hash")
    return problems


def _lock() -> dict[str, tuple[Version, int]]:
    return parse_lock(LOCK.read_text(encoding="utf-8"))


def test_every_declared_dependency_is_pinned_with_hashes():
    requirements = declared_requirements(tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8")))
    lock = _lock()
    assert len(requirements) >= 20 and len(lock) >= len(requirements)
    problems = unpinned(requirements, lock)
    assert not problems, "requirements.lock is out of date with pyproject.toml (run `make lock`):\n" + "\n".join(problems)
    assert PROJECT not in lock, "the project itself is installed editable, not from the lock"
    assert not [name for name, (_, hashes) in lock.items() if not hashes], "every pin needs its hashes"


def test_lock_is_closed_under_dependencies():
    """Bootstrap installs with --no-deps: every requirement of a locked distribution (with the extras
    pyproject asks for) must itself be locked, or a fresh .venv would miss it."""
    lock = _lock()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    extras: dict[str, set[str]] = {}
    for req in declared_requirements(pyproject):
        extras.setdefault(canonicalize_name(req.name), set()).update(req.extras)
    missing = []
    for name in lock:
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue  # reported by test_installed_environment_matches_the_lock
        for raw in requires:
            req = Requirement(raw)
            wanted = extras.get(name, set()) | {""}
            if req.marker is not None and not any(req.marker.evaluate({**LOCK_ENV, "extra": e}) for e in wanted):
                continue
            dep = canonicalize_name(req.name)
            if dep not in lock:
                missing.append(f"{name} needs {req}, not in requirements.lock")
            elif not req.specifier.contains(lock[dep][0], prereleases=True):
                missing.append(f"{name} needs {req}, locked at {lock[dep][0]}")
    assert not missing, "run `make lock`:\n" + "\n".join(missing)


def test_installed_environment_matches_the_lock():
    """The interpreter running the tests has exactly the locked versions (what CI tested)."""
    differences = []
    for name, (version, _) in sorted(_lock().items()):
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            differences.append(f"{name}: locked {version}, not installed")
            continue
        if Version(installed) != version:
            differences.append(f"{name}: locked {version}, installed {installed}")
    assert not differences, (f"{sys.prefix} differs from {LOCK.name} (run `make bootstrap`, or "
                             "`make lock` if pyproject.toml changed):\n" + "\n".join(differences))


def test_the_checks_catch_what_they_name():
    lock = parse_lock("a==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n    # via x\nb-c==2.0\n")
    assert lock == {"a": (Version("1.0"), 1), "b-c": (Version("2.0"), 0)}
    problems = unpinned([Requirement("A>=1"), Requirement("B_C"), Requirement("d"), Requirement("a>=2")], lock)
    assert problems == ["B_C: locked without a --hash", "d: not in requirements.lock", "a>=2: locked at 1.0, outside the range"]
    for bad in ("a>=1 --hash=sha256:" + "0" * 64, "a==1.*", "-e .", "a==1\na==1"):
        try:
            parse_lock(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad!r}")


def test_the_installers_are_pinned_with_hashes_too():
    """pip and setuptools (bootstrap) and uv (`make lock`) come from requirements-tools.lock, hash-checked;
    the .venv runs the pinned pip and setuptools."""
    tools = parse_lock((REPO / "requirements-tools.lock").read_text())
    assert set(tools) == {"pip", "setuptools", "uv"}
    assert all(hashes >= 1 for _, hashes in tools.values()), tools
    for name in ("pip", "setuptools"):
        assert Version(metadata.version(name)) == tools[name][0], f"{name} is not the pinned one (run make bootstrap)"

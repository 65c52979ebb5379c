"""The drill lab. It needs the `lab` extra (pip install 'coldstart[lab]'): in an install without it, importing the lab
fails here, naming what is missing, rather than halfway through building a lab (`coldstart lab` and `coldstart drill`
say so as one line, cli/main.py's _plugin)."""

from __future__ import annotations

import re
from importlib import metadata

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?[^;]*;\s*extra\s*==\s*['\"]([^'\"]+)['\"]\s*$")


def _missing(extra: str) -> list[str]:
    """The distributions `extra` of the installed coldstart names (with the extras it includes) that are not
    installed; none where coldstart is not installed as a distribution (a source tree)."""
    try:
        lines = metadata.requires("coldstart") or []
    except metadata.PackageNotFoundError:
        return []
    by_extra: dict[str, list[tuple[str, list[str]]]] = {}
    for line in lines:
        if match := _REQUIREMENT.match(line):
            name, includes, of = match.groups()
            by_extra.setdefault(of, []).append((name, [x.strip() for x in (includes or "").split(",") if x.strip()]))
    missing: list[str] = []
    todo, seen = [extra], set()
    while todo:
        if (current := todo.pop()) in seen:
            continue
        seen.add(current)
        for name, includes in by_extra.get(current, []):
            if name == "coldstart":
                todo += includes
                continue
            try:
                metadata.version(name)
            except metadata.PackageNotFoundError:
                missing.append(name)
    return sorted(missing)


if _unmet := _missing("lab"):
    raise ImportError(f"the drill lab needs the lab extra (pip install 'coldstart[lab]'); not installed: "
                      f"{', '.join(_unmet)}", name="lab")

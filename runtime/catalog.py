"""The controller's catalog: the runbooks and targets a worker runs, and each run request resolved against it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.policy import TargetPolicy
from workflows.contract import RESOLVE_RUN_ACTIVITY, CatalogRecord, RunInput, RunRequest
from workflows.loader import RunbookInvalid, load_inventory, plan_run, runbook_digest
from workflows.yaml_safety import YamlRefused, load_text, read_text

__all__ = ["CATALOG_ENV", "Catalog", "CatalogRefused", "CatalogRunbook", "RunResolver", "TARGETS_ENV"]

CATALOG_ENV = "COLDSTART_CATALOG"
TARGETS_ENV = "COLDSTART_TARGETS"


class CatalogRefused(Exception):
    """A run request the catalog will not run; the message is one line saying why."""


@dataclass(frozen=True)
class CatalogRunbook:
    name: str
    path: Path
    text: str
    digest: str


class Catalog:
    """Runbooks (`*.yaml` directly in `runbooks`, by content digest) and target inventories (`targets/NAME.yaml`),
    read from the controller's own directories at each resolution: deploy them at a reviewed commit.

    A request names a runbook by digest and a target by name; everything the run executes comes from here.
    Only a target marked `development: true` runs a runbook text the catalog does not hold."""

    def __init__(self, runbooks: Path | None, targets: Path | None, *,
                 inventories: Mapping[str, dict[str, Any]] | None = None) -> None:
        self.runbooks_dir = runbooks
        self.targets_dir = targets
        self._inventories = dict(inventories or {})

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> "Catalog":
        """$COLDSTART_CATALOG (default `runbooks`) and $COLDSTART_TARGETS (default `targets`)."""
        return cls(Path(environ.get(CATALOG_ENV, "runbooks")), Path(environ.get(TARGETS_ENV, "targets")))

    def runbooks(self) -> dict[str, CatalogRunbook]:
        """The catalogued runbooks by digest; a file that cannot be read or has no name is not in the catalog."""
        found: dict[str, CatalogRunbook] = {}
        if self.runbooks_dir is None or not self.runbooks_dir.is_dir():
            return found
        for path in sorted(self.runbooks_dir.glob("*.yaml")):
            try:
                text = read_text(path)
                data = load_text(text)
            except (OSError, YamlRefused, ValueError):
                continue
            name = (data.get("metadata") or {}).get("name") if isinstance(data, dict) else None
            if isinstance(name, str):
                digest = runbook_digest(text)
                found[digest] = CatalogRunbook(name=name, path=path, text=text, digest=digest)
        return found

    def inventory(self, target: str) -> dict[str, Any]:
        """The target's inventory as runbooks see it, or CatalogRefused when the catalog has no such target."""
        if target in self._inventories:
            return self._inventories[target]
        if self.targets_dir is None:
            raise CatalogRefused(f"target {target!r} is not in the controller's catalog")
        try:
            return load_inventory(target, self.targets_dir).as_target()
        except FileNotFoundError:
            raise CatalogRefused(f"target {target!r} is not in the controller's catalog") from None
        except (OSError, ValueError) as exc:
            raise CatalogRefused(f"target {target!r}: the controller's inventory is invalid: "
                                 f"{str(exc).splitlines()[0]}") from None

    def target(self, request: RunRequest) -> tuple[dict[str, Any], bool]:
        """The inventory of the request's target, and whether it is a development target."""
        inventory = self.inventory(request.target)
        return inventory, bool(inventory.get("development"))

    def resolve(self, request: RunRequest, registry: Any) -> RunInput:
        """The plan the controller runs for `request`, or CatalogRefused naming the first reason it will not."""
        inventory, development = self.target(request)
        where = _difference(request.inventory, inventory)
        if where is not None:
            raise CatalogRefused(f"target {request.target!r}: the run brought an inventory that differs from the "
                                 f"controller's at {where}; endpoints and secrets come from the controller only")
        if runbook_digest(request.text) != request.digest:
            raise CatalogRefused(f"runbook {request.runbook!r}: its text does not match its digest {request.digest}")
        catalogued = self.runbooks()
        entry = catalogued.get(request.digest)
        if entry is not None:
            text, origin, path = entry.text, "catalog", str(entry.path)
        elif development:
            text, origin, path = request.text, "development", request.source
        else:
            same = sorted((e for e in catalogued.values() if e.name == request.runbook), key=lambda e: str(e.path))
            if same:
                raise CatalogRefused(
                    f"runbook {request.runbook!r} ({_short(request.digest)}) is a modified copy: the catalog holds "
                    f"{_short(same[0].digest)} ({same[0].path}), and target {request.target!r} runs catalogued runbooks only")
            raise CatalogRefused(f"runbook {request.runbook!r} ({_short(request.digest)}) is not in the controller's "
                                 f"catalog, and target {request.target!r} is not a development target")
        starters = TargetPolicy.of(inventory).starters
        if starters is not None and request.initiator not in starters:
            raise CatalogRefused(f"{request.initiator!r} may not start runs on target {request.target!r} "
                                 f"(starters: {', '.join(starters) or 'none'})")
        if request.drill and not inventory.get("drill"):
            raise CatalogRefused(f"target {request.target!r} is not marked as a drill target (drill: true); refusing a drill")
        try:
            plan = plan_run(path, text=text, registry=registry, params=request.params, inventory=inventory,
                            initiator=request.initiator, drill=request.drill)
        except RunbookInvalid as exc:
            raise CatalogRefused(f"runbook {request.runbook!r} does not plan on the controller: {exc.errors[0]}"
                                 + (f" (and {len(exc.errors) - 1} more)" if len(exc.errors) > 1 else "")) from None
        return plan.model_copy(update={"request": None, "source": path,
                                       "catalog": CatalogRecord(digest=request.digest, origin=origin, path=path)})


class RunResolver:
    """The worker's `coldstart.resolve_run` activity: a new run's first act, before any action."""

    def __init__(self, catalog: Catalog, registry: Any) -> None:
        self._catalog = catalog
        self._registry = registry

    @activity.defn(name=RESOLVE_RUN_ACTIVITY)
    def resolve(self, request: RunRequest) -> RunInput:
        try:
            return self._catalog.resolve(request, self._registry)
        except CatalogRefused as exc:
            raise ApplicationError(str(exc), type="CatalogRefused", non_retryable=True) from None


def _short(digest: str) -> str:
    return digest[:19]


def _difference(given: Any, held: Any, path: str = "") -> str | None:
    """The first place where `given` differs from `held`, as a dotted path, or None when they are equal."""
    if isinstance(given, dict) and isinstance(held, dict):
        for key in sorted(set(given) | set(held), key=str):
            if key not in given or key not in held:
                return f"{path}.{key}".lstrip(".")
            found = _difference(given[key], held[key], f"{path}.{key}")
            if found is not None:
                return found.lstrip(".")
        return None
    if isinstance(given, list) and isinstance(held, list):
        if len(given) != len(held):
            return path.lstrip(".") or "(top)"
        for index, (a, b) in enumerate(zip(given, held)):
            found = _difference(a, b, f"{path}[{index}]")
            if found is not None:
                return found.lstrip(".")
        return None
    return None if given == held else (path.lstrip(".") or "(top)")

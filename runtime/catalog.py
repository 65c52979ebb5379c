"""The controller's catalog: the runbooks and targets a worker runs, and each run request resolved against it."""

from __future__ import annotations

import asyncio
import copy
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.contracts.vault import IdentityKeysInput
from activities.errors import Refused
from activities.heartbeats import beating
from activities.oidc import IdentityKeys
from activities.policy import TargetPolicy
from activities.registry import Registry
from activities.vault import fetch_identity_keys
from runtime.action_versions import catalog_build_id
from runtime.drill_safety import drill_refusal
from runtime.version import controller_version
from workflows.contract import (
    RESOLVE_RUN_ACTIVITY,
    SCHEDULED_SUFFIX,
    CatalogRecord,
    RunInput,
    RunRequest,
    workflow_id_for,
)
from workflows.identity import IdentityError, effective_identity, start_nonce, verify_identity_token
from workflows.loader import RunbookInvalid, load_inventory, plan_run, runbook_digest
from workflows.names import NameRefused, check_name, named_file
from workflows.spec import IdentityPolicy
from workflows.yaml_safety import YamlRefused, load_text, read_text

__all__ = ["CATALOG_ENV", "TARGETS_ENV", "Catalog", "CatalogRefused", "CatalogRunbook", "CatalogWarmed", "RunResolver"]

CATALOG_ENV = "COLDSTART_CATALOG"
TARGETS_ENV = "COLDSTART_TARGETS"


_PARSED_KEPT = 1024  # runbook texts whose names are kept (a catalog edited that often starts afresh)


def _runbook_name(text: str) -> str | None:
    """The runbook's `metadata.name`, or None for a file that is no runbook."""
    try:
        data = load_text(text)
    except (YamlRefused, ValueError):
        return None
    name = (data.get("metadata") or {}).get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


class CatalogRefused(Refused):
    """A run request the catalog will not run; the message is one line saying why."""


@dataclass(frozen=True)
class CatalogWarmed:
    """What Catalog.warm parsed: the runbooks' names, how many runbook texts and which targets were parsed
    anew (none once they are kept), and the targets whose inventory the catalog refuses, with why."""
    runbooks: list[str]
    runbooks_parsed: int
    targets_parsed: list[str]
    targets_refused: dict[str, str]
    # The targets whose inventory says `development: true`, whether or not the catalog lets them be.
    development: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CatalogRunbook:
    name: str
    path: Path
    text: str
    digest: str


class Catalog:
    """Runbooks (`*.yaml` directly in `runbooks`, by content digest) and target inventories (`targets/NAME.yaml`),
    read from the controller's own directories at each resolution: deploy them at a reviewed commit. Each file is
    read every time; what is parsed from it is kept for as long as its text stays the same.

    A request names a runbook by digest and a target by name; everything the run executes comes from here.
    Only a target marked `development: true` runs a runbook text the catalog does not hold, and only in a
    catalog made with `allow_development` (a worker started with --allow-development): otherwise an inventory
    file anyone could write into the targets directory would let a starter run its own text there."""

    def __init__(self, runbooks: Path | None, targets: Path | None, *,
                 inventories: Mapping[str, dict[str, Any]] | None = None,
                 identity_keys: Callable[[IdentityPolicy], IdentityKeys] | None = None,
                 allow_development: bool = False) -> None:
        self.runbooks_dir = runbooks
        self.targets_dir = targets
        self.allow_development = allow_development
        self._inventories = dict(inventories or {})
        # Parsed once per text, not once per run: every resolution parsed every runbook in the catalog (to
        # find the one with the request's digest) and the target's inventory again.
        self._names: dict[str, str | None] = {}
        self._read_inventories: dict[Path, tuple[str, dict[str, Any]]] = {}
        # Test seam: where the starter's token is checked, the Vault's keys (default: read from the Vault).
        self._identity_keys = identity_keys

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ, *, allow_development: bool = False) -> Catalog:
        """$COLDSTART_CATALOG (default `runbooks`) and $COLDSTART_TARGETS (default `targets`); development targets
        only with `allow_development` (never from the environment: the worker's flag says so)."""
        return cls(Path(environ.get(CATALOG_ENV, "runbooks")), Path(environ.get(TARGETS_ENV, "targets")),
                   allow_development=allow_development)

    def runbooks(self) -> dict[str, CatalogRunbook]:
        """The catalogued runbooks by digest; a file that cannot be read or has no name is not in the catalog."""
        found: dict[str, CatalogRunbook] = {}
        if self.runbooks_dir is None or not self.runbooks_dir.is_dir():
            return found
        if len(self._names) > _PARSED_KEPT:
            self._names.clear()
        for path in sorted(self.runbooks_dir.glob("*.yaml")):
            try:
                text = read_text(path)
            except (OSError, YamlRefused, ValueError):
                continue
            digest = runbook_digest(text)
            if digest not in self._names:
                self._names[digest] = _runbook_name(text)
            name = self._names[digest]
            if name is not None:
                found[digest] = CatalogRunbook(name=name, path=path, text=text, digest=digest)
        return found

    def inventory(self, target: str) -> dict[str, Any]:
        """The target's inventory as runbooks see it, or CatalogRefused when the catalog has no such target (or
        `target` is no target name: the inventory is targets/<name>.yaml, never a path the request chose)."""
        try:
            check_name("target", target)
            path = named_file(self.targets_dir, "target", target) if self.targets_dir is not None else None
        except NameRefused as exc:
            raise CatalogRefused(str(exc)) from None
        if target in self._inventories:
            return self._inventories[target]
        if path is None or self.targets_dir is None:
            raise CatalogRefused(self._no_target(target))
        try:
            text = read_text(path)
            kept = self._read_inventories.get(path)
            if kept is not None and kept[0] == text:
                return copy.deepcopy(kept[1])
            inventory = load_inventory(target, self.targets_dir).as_target()
        except FileNotFoundError:
            raise CatalogRefused(self._no_target(target)) from None
        except (OSError, ValueError) as exc:
            raise CatalogRefused(f"target {target!r}: the controller's inventory is invalid: "
                                 f"{str(exc).splitlines()[0]}") from None
        # Kept with the text read before the parse: a file changed in between is parsed again next time.
        self._read_inventories[path] = (text, copy.deepcopy(inventory))
        return inventory

    def _no_target(self, target: str) -> str:
        where = (f"{self.targets_dir}/{target}.yaml" if self.targets_dir is not None
                 else f"{target}.yaml in a targets directory")
        return (f"target {target!r} is not in the controller's catalog: its inventory goes in {where} "
                f"($COLDSTART_TARGETS, [catalog] targets), read at the next run without a worker restart")

    def _add_runbook(self) -> str:
        where = self.runbooks_dir if self.runbooks_dir is not None else "the catalog's runbooks directory"
        return (f"to run it, put the file in {where} ($COLDSTART_CATALOG, [catalog] runbooks), read at the next "
                "run without a worker restart")

    def warm(self) -> CatalogWarmed:
        """Parse every catalogued runbook and target inventory now, so that a run's first resolution does not
        (the worker calls it before its first poll: runtime/worker.warm_up). A target whose inventory is invalid
        is reported, not raised: its runs are refused at resolution as before."""
        known = set(self._names)
        runbooks = self.runbooks()
        parsed_runbooks = sum(1 for digest in self._names if digest not in known)
        parsed_targets: list[str] = []
        refused: dict[str, str] = {}
        development: list[str] = []
        paths = sorted(self.targets_dir.glob("*.yaml")) if self.targets_dir is not None and self.targets_dir.is_dir() else []
        for path in paths:
            before = self._read_inventories.get(path)
            try:
                inventory = self.inventory(path.stem)
            except CatalogRefused as exc:
                refused[path.stem] = str(exc)
                continue
            if self._read_inventories.get(path) is not before:
                parsed_targets.append(path.stem)
            if inventory.get("development"):
                development.append(path.stem)
        return CatalogWarmed(runbooks=sorted({r.name for r in runbooks.values()}), runbooks_parsed=parsed_runbooks,
                             targets_parsed=parsed_targets, targets_refused=refused, development=development)

    def target(self, request: RunRequest) -> tuple[dict[str, Any], bool]:
        """The inventory of the request's target, and whether it is a development target: marked
        `development: true`, in a catalog that allows development targets."""
        inventory = self.inventory(request.target)
        return inventory, self.allow_development and bool(inventory.get("development"))

    def resolve(self, request: RunRequest, registry: Any, workflow_id: str = "") -> RunInput:
        """The plan the controller runs for `request` (in workflow `workflow_id`), or CatalogRefused naming the
        first reason it will not."""
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
                    f"{_short(same[0].digest)} ({same[0].path}), and target {request.target!r} runs catalogued runbooks only; "
                    f"run that file, or review this text into it")
            if inventory.get("development"):
                raise CatalogRefused(f"runbook {request.runbook!r} ({_short(request.digest)}) is not in the controller's "
                                     f"catalog, and target {request.target!r} is marked development: true but the "
                                     "worker was not started with --allow-development, so it runs catalogued runbooks only; "
                                     + self._add_runbook())
            raise CatalogRefused(f"runbook {request.runbook!r} ({_short(request.digest)}) is not in the controller's "
                                 f"catalog, and target {request.target!r} is not a development target; "
                                 + self._add_runbook())
        if request.drill and not inventory.get("drill"):
            raise CatalogRefused(f"target {request.target!r} is not marked as a drill target (drill: true); refusing a drill")
        policy = TargetPolicy.of(inventory)
        if request.drill and policy.drills is not None:
            refusal = drill_refusal(policy.drills, inventory)
            if refusal is not None:
                raise CatalogRefused(f"drill on {request.target!r} not started: {refusal}")
        plan = self._plan(request, path, text, inventory, registry, request.initiator)
        initiator, subject = self._starter(request, plan, policy, workflow_id, development)
        if policy.starters is not None and initiator not in policy.starters:
            raise CatalogRefused(f"{initiator!r} may not start runs on target {request.target!r} "
                                 f"(starters: {', '.join(policy.starters) or 'none'})")
        if initiator != request.initiator:
            # ${{ run.initiator }} resolves to the verified starter.
            plan = self._plan(request, path, text, inventory, registry, initiator)
        record = CatalogRecord(digest=request.digest, origin=origin, path=path, controller=controller_version(),
                               contracts=catalog_build_id(registry) if isinstance(registry, Registry) else "")
        return plan.model_copy(update={"request": None, "source": path, "initiator_subject": subject,
                                       "catalog": record})

    @staticmethod
    def _plan(request: RunRequest, path: str, text: str, inventory: dict[str, Any], registry: Any,
              initiator: str) -> RunInput:
        try:
            return plan_run(path, text=text, registry=registry, params=request.params, inventory=inventory,
                            initiator=initiator, drill=request.drill)
        except RunbookInvalid as exc:
            raise CatalogRefused(f"runbook {request.runbook!r} does not plan on the controller: {exc.errors[0]}"
                                 + (f" (and {len(exc.errors) - 1} more)" if len(exc.errors) > 1 else "")) from None

    def _starter(self, request: RunRequest, plan: RunInput, policy: TargetPolicy, workflow_id: str,
                 development: bool) -> tuple[str, str | None]:
        """Who starts the run: (name, Vault entity) verified from the request's token where the target's policy
        asks for a verified starter, or four eyes meets verified approvals (it must compare verified people);
        (the name the starter gave, None) elsewhere, unless a token came anyway (then it is checked too)."""
        identity = effective_identity(plan.runbook.identity, policy.identity)
        if identity is None:
            return request.initiator, None
        if identity.provider is None:
            raise CatalogRefused(f"runbook {request.runbook!r}: verified identity needs a Vault OIDC provider "
                                 "(identity.provider), whose tokens are bound to one run, step and verb")
        if identity.vault.startswith("http://") and not (development or plan.drill or plan.target.get("drill")):
            raise CatalogRefused(f"target {request.target!r}: the identity Vault {identity.vault} is not https; "
                                 "signing keys are read over https only (with ca_cert for a private CA)")
        needed = "start" in identity.controls or ("approve" in identity.controls and _four_eyes(plan, policy))
        if request.identity_token is None:
            if needed:
                raise CatalogRefused(f"target {request.target!r} needs a verified starter ("
                                     + ("its policy says so" if "start" in identity.controls
                                        else "four eyes compares verified people")
                                     + "): start with --vault-login or --identity-token")
            return request.initiator, None
        keys = self._keys(identity)
        nonce = start_nonce(workflow_id, request.digest, request.target, request.params, request.drill)
        try:
            who = verify_identity_token(request.identity_token, keys, audience=identity.audience,
                                        now=datetime.now(UTC), name_claim=identity.name_claim, nonce=nonce)
        except IdentityError as exc:
            raise CatalogRefused(f"the starter's {exc}") from None
        return who.name, who.subject

    def _keys(self, identity: IdentityPolicy) -> IdentityKeys:
        if self._identity_keys is not None:
            return self._identity_keys(identity)
        try:
            return fetch_identity_keys(IdentityKeysInput(address=identity.vault, provider=identity.provider,
                                                         ca_cert=identity.ca_cert))
        except ApplicationError as exc:
            if exc.non_retryable:
                raise CatalogRefused(f"verified start: {exc.message}") from None
            raise


class RunResolver:
    """The worker's `coldstart.resolve_run` activity: a new run's first act, before any action."""

    def __init__(self, catalog: Catalog, registry: Any, *,
                 others: Callable[[str, str], Awaitable[str | None]] | None = None) -> None:
        self._catalog = catalog
        self._registry = registry
        # Test seam: another run holding the target (default: asked of the server with the worker's client).
        self._others = others or _another_run

    @activity.defn(name=RESOLVE_RUN_ACTIVITY)
    async def resolve(self, request: RunRequest) -> RunInput:
        # In a thread (it reads files, and Vault for a verified start), heartbeating meanwhile: an attempt lost
        # with its worker goes to another at the heartbeat timeout, so a run starting then is not held a minute.
        workflow_id = activity.info().workflow_id or ""
        try:
            async with beating():
                plan = await asyncio.to_thread(self._catalog.resolve, request, self._registry, workflow_id)
                busy = await self._others(plan.target_name, workflow_id)
        except CatalogRefused as exc:
            raise ApplicationError(str(exc), type="CatalogRefused", non_retryable=True) from None
        if busy is not None:
            raise ApplicationError(f"target {plan.target_name} is busy: run {busy} is still running", type="TargetBusy",
                                   non_retryable=True)
        return plan


async def _another_run(target: str, workflow_id: str) -> str | None:
    """Another running run on `target`, or None. Single flight holds by workflow id: the target's own id, and
    the ids a drill Schedule gives its runs (the target's id and a time), which the server cannot tell apart."""
    client = activity.client()
    expected = workflow_id_for(target)
    if workflow_id != expected:
        try:
            description = await client.get_workflow_handle(expected).describe()
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
        else:
            if description.status == WorkflowExecutionStatus.RUNNING:
                return expected
    query = f"WorkflowId STARTS_WITH '{expected}-' AND ExecutionStatus = 'Running'"
    try:
        async for found in client.list_workflows(query, limit=20):
            if found.id != workflow_id and SCHEDULED_SUFFIX.fullmatch(found.id.removeprefix(expected)):
                return found.id
    except RPCError as exc:
        # Temporal's time-skipping test server has no visibility (it runs no Schedules either).
        if exc.status != RPCStatusCode.UNIMPLEMENTED:
            raise
    return None


def _four_eyes(plan: RunInput, policy: TargetPolicy) -> bool:
    """Whether any decision of the run is under four eyes (the target's, the runbook's or one step's)."""
    if policy.four_eyes or plan.runbook.four_eyes:
        return True

    def walk(steps: list[Any]) -> bool:
        for step in steps:
            for spec in (getattr(step, "approval", None), getattr(getattr(step, "ramp", None), "approval", None)):
                if spec is not None and spec.four_eyes:
                    return True
            if walk(getattr(step, "parallel", None) or []):
                return True
        return False
    # on_miss steps are the run's too: an approval there is decided like any other.
    deadline = plan.runbook.deadline
    return walk(plan.runbook.steps) or (deadline is not None and walk(deadline.on_miss))


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
        for index, (a, b) in enumerate(zip(given, held, strict=True)):
            found = _difference(a, b, f"{path}[{index}]")
            if found is not None:
                return found.lstrip(".")
        return None
    return None if given == held else (path.lstrip(".") or "(top)")

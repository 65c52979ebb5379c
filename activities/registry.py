"""The action registry: every action a runbook may call, by its contract (models, defaults, docs); no implementations."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypedDict, Unpack

from pydantic import BaseModel

from activities.errors import ColdstartError
from activities.retry import Retry

__all__ = ["ActionSpec", "Defaults", "Registry", "Unimplemented", "declare", "default_registry"]


class Unimplemented(ColdstartError, LookupError):
    """A worker was asked to run actions whose implementations were never bound to their contracts."""


@dataclass(frozen=True)
class ActionSpec:
    """What the validator and the worker need to know about one action; `fn` is the bound implementation
    (None where only the contract was imported, as `validate` and `actions` do)."""

    name: str
    input_model: type[BaseModel]
    output_model: type[BaseModel] | None
    description: str
    timeout: timedelta
    heartbeat: timedelta | None
    retry: Retry
    mutating: bool
    undo: str | None
    # Name of a field in the output that the undo action takes as its whole input.
    undo_from_output: str | None
    summary: str | None = None
    # The reference text of `coldstart actions`: paragraphs, the first one the summary.
    doc: str = ""
    fn: Callable[..., Any] | None = None

    def contract(self) -> ActionSpec:
        """The same action without its implementation."""
        return dataclasses.replace(self, fn=None)


class Registry:
    """A name -> ActionSpec map; tests build their own instead of patching the default.

    `declaring`, when set, imports what declares an action the map lacks (every action for None):
    activities.catalog sets it so that `validate` imports only the contracts a runbook calls, while
    `specs`, `names()` and the rest always see every action.
    """

    def __init__(self, specs: dict[str, ActionSpec] | None = None,
                 declaring: Callable[[str | None], None] | None = None) -> None:
        self._specs: dict[str, ActionSpec] = dict(specs or {})
        self.declaring = declaring

    @property
    def specs(self) -> dict[str, ActionSpec]:
        if self.declaring is not None:
            self.declaring(None)
        return self._specs

    def add(self, spec: ActionSpec) -> None:
        held = self._specs.get(spec.name)
        if held is not None:
            if held.contract() != spec.contract():
                raise ValueError(f"action {spec.name!r} declared twice, differently")
            if held.fn is not None and spec.fn is not None and held.fn is not spec.fn:
                raise ValueError(f"action {spec.name!r} registered twice")
            if spec.fn is None:
                return
        self._specs[spec.name] = spec

    def get(self, name: str) -> ActionSpec | None:
        if name not in self._specs and self.declaring is not None:
            self.declaring(name)
        return self._specs.get(name)

    def names(self) -> list[str]:
        return sorted(self.specs)

    def implementation(self, name: str) -> Callable[..., Any]:
        """The activity bound to one declared action."""
        spec = self.get(name)
        if spec is None or spec.fn is None:
            raise Unimplemented(f"action {name} is declared without an implementation")
        return spec.fn

    def activities(self) -> list[Callable[..., Any]]:
        """Every implementation, for a worker; an action declared but never implemented is refused."""
        missing = [name for name, spec in sorted(self.specs.items()) if spec.fn is None]
        if missing:
            raise Unimplemented(f"actions declared without an implementation: {', '.join(missing)}")
        return [spec.fn for spec in self.specs.values() if spec.fn is not None]

    def build_models(self) -> int:
        """Build every action's input and output models now (they are built on first use otherwise, to keep
        them off the CLI's start); how many were built. For long-lived processes, before their first run."""
        built = 0
        for spec in self.specs.values():
            for model in (spec.input_model, spec.output_model):
                if model is not None and not model.__pydantic_complete__:
                    model.model_rebuild()
                    built += 1
        return built

    def merged(self, *others: Registry) -> Registry:
        combined = Registry(self.specs)
        for other in others:
            for spec in other.specs.values():
                combined.add(spec)
        return combined


default_registry = Registry()


def _seconds(value: float | timedelta | None) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    return timedelta(seconds=value)


class Defaults(TypedDict, total=False):
    """What an action declares besides its models, each optional: a step may override timeout and retry."""

    timeout: float | timedelta  # 60 s unless given
    heartbeat: float | timedelta | None
    retry: Retry | None  # Retry()'s defaults unless given
    mutating: bool
    undo: str | None
    undo_from_output: str | None


def declare(
    name: str,
    input_model: type[BaseModel],
    output_model: type[BaseModel] | None = None,
    *,
    doc: str,
    registry: Registry | None = None,
    **defaults: Unpack[Defaults],
) -> ActionSpec:
    """Declare one action's contract: what a runbook's `with:` is checked against, its output and its defaults.

    `doc` is the reference text (paragraphs; the first line is the description). An implementation binds to
    the returned spec with `activities.binding.implements`.
    """
    text = inspect.cleandoc(doc)
    spec = ActionSpec(
        name=name,
        input_model=input_model,
        output_model=output_model,
        description=text.splitlines()[0] if text else name,
        timeout=_seconds(defaults.get("timeout", 60)) or timedelta(seconds=60),
        heartbeat=_seconds(defaults.get("heartbeat")),
        retry=defaults.get("retry") or Retry(),
        mutating=defaults.get("mutating", False),
        undo=defaults.get("undo"),
        undo_from_output=defaults.get("undo_from_output"),
        doc=text,
    )
    (registry or default_registry).add(spec)
    return spec

"""The action registry: every activity a runbook may call, with its contract and defaults."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.retry import Retry

__all__ = ["ActionSpec", "Registry", "action", "default_registry", "invalid_argument", "parse_input"]

INVALID_ARGUMENT = "InvalidArgument"
M = TypeVar("M", bound=BaseModel)


def invalid_argument(message: str) -> ApplicationError:
    """A bad-argument error: retrying cannot help, so it is never retried."""
    return ApplicationError(message, type=INVALID_ARGUMENT, non_retryable=True)


def parse_input(name: str, model: type[M], inp: Any) -> M:
    """The one validation of an action's input at run time; bad arguments fail once, never retried."""
    try:
        # warnings=False: a model_construct-ed input may hold raw dicts; validation reports them.
        data = inp.model_dump(warnings=False) if isinstance(inp, BaseModel) else inp
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<input>'}: {e['msg']}" for e in exc.errors())
        raise invalid_argument(f"bad arguments for {name} ({model.__name__}): {problems}") from None


def _validating(name: str, fn: Callable[..., Any], model: type[BaseModel], output: Any) -> Callable[..., Any]:
    """Wrap an action so its input is validated here, once, and nowhere else.

    The wrapper's own signature says `Any`, so the data converter hands over plain JSON and
    does not validate (its failures would be retried as "Failed decoding arguments").
    """
    run: Callable[..., Any]
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def run_async(inp: Any) -> Any:
            return await fn(parse_input(name, model, inp))
        run = run_async
    else:
        @functools.wraps(fn)
        def run_sync(inp: Any) -> Any:
            return fn(parse_input(name, model, inp))
        run = run_sync
    run.__annotations__ = {"inp": Any, "return": output}
    run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("inp", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Any)],
        return_annotation=output)
    return run


@dataclass(frozen=True)
class ActionSpec:
    """What the validator and the worker need to know about one action."""

    name: str
    fn: Callable[..., Any]
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


@dataclass
class Registry:
    """A name -> ActionSpec map; tests build their own instead of patching the default."""

    specs: dict[str, ActionSpec] = field(default_factory=dict)

    def add(self, spec: ActionSpec) -> None:
        if spec.name in self.specs and self.specs[spec.name].fn is not spec.fn:
            raise ValueError(f"action {spec.name!r} registered twice")
        self.specs[spec.name] = spec

    def get(self, name: str) -> ActionSpec | None:
        return self.specs.get(name)

    def names(self) -> list[str]:
        return sorted(self.specs)

    def activities(self) -> list[Callable[..., Any]]:
        return [spec.fn for spec in self.specs.values()]

    def merged(self, *others: Registry) -> Registry:
        combined = Registry(dict(self.specs))
        for other in others:
            for spec in other.specs.values():
                combined.add(spec)
        return combined


default_registry = Registry()


def action(
    name: str,
    *,
    timeout: float | timedelta = 60,
    heartbeat: float | timedelta | None = None,
    retry: Retry | None = None,
    mutating: bool = False,
    undo: str | None = None,
    undo_from_output: str | None = None,
    registry: Registry | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register an async or sync function taking one pydantic model as a Temporal activity.

    The input and output models are read from the function's annotations, so the
    signature is the contract the runbook validator checks `with:` arguments against.
    """

    def _seconds(value: float | timedelta | None) -> timedelta | None:
        if value is None or isinstance(value, timedelta):
            return value
        return timedelta(seconds=value)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        hints = inspect.get_annotations(fn, eval_str=True)
        params = [p for p in inspect.signature(fn).parameters]
        if len(params) != 1:
            raise TypeError(f"action {name}: takes exactly one input model")
        input_model = hints.get(params[0])
        if not (isinstance(input_model, type) and issubclass(input_model, BaseModel)):
            raise TypeError(f"action {name}: its input must be a pydantic model")
        output_model = hints.get("return")
        if not (isinstance(output_model, type) and issubclass(output_model, BaseModel)):
            output_model = None
        defn = activity.defn(name=name)(_validating(name, fn, input_model, hints.get("return", Any)))
        doc = inspect.getdoc(fn) or ""
        (registry or default_registry).add(
            ActionSpec(
                name=name,
                fn=defn,
                input_model=input_model,
                output_model=output_model,
                description=doc.splitlines()[0] if doc else name,
                timeout=_seconds(timeout) or timedelta(seconds=60),
                heartbeat=_seconds(heartbeat),
                retry=retry or Retry(),
                mutating=mutating,
                undo=undo,
                undo_from_output=undo_from_output,
            )
        )
        return defn

    return decorate

"""Binds action implementations to their declared contracts as Temporal activities (the worker's side of the registry)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, Unpack

from pydantic import BaseModel, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.registry import ActionSpec, Defaults, Registry, declare, default_registry

__all__ = ["action", "implements", "invalid_argument", "parse_input"]

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


def _models(name: str, fn: Callable[..., Any]) -> tuple[type[BaseModel], type[BaseModel] | None, Any]:
    """The input and output models a function's annotations name, and its return annotation as written."""
    hints = inspect.get_annotations(fn, eval_str=True)
    params = list(inspect.signature(fn).parameters)
    if len(params) != 1:
        raise TypeError(f"action {name}: takes exactly one input model")
    input_model = hints.get(params[0])
    if not (isinstance(input_model, type) and issubclass(input_model, BaseModel)):
        raise TypeError(f"action {name}: its input must be a pydantic model")
    returned = hints.get("return", Any)
    output_model = returned if isinstance(returned, type) and issubclass(returned, BaseModel) else None
    return input_model, output_model, returned


def implements(
    contract: ActionSpec, *, registry: Registry | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Bind an async or sync function to a declared action as its Temporal activity.

    The function takes the contract's input model and returns its output model; a signature that says
    otherwise is refused at import, so an implementation cannot drift from what runbooks are checked against.
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        input_model, output_model, returned = _models(contract.name, fn)
        if (input_model, output_model) != (contract.input_model, contract.output_model):
            raise TypeError(f"action {contract.name}: the implementation takes {input_model.__name__} -> "
                            f"{getattr(output_model, '__name__', None)}, the contract says "
                            f"{contract.input_model.__name__} -> {getattr(contract.output_model, '__name__', None)}")
        defn = activity.defn(name=contract.name)(_validating(contract.name, fn, input_model, returned))
        (registry or default_registry).add(dataclasses.replace(contract, fn=defn))
        return defn

    return decorate


def action(
    name: str, *, registry: Registry | None = None, **defaults: Unpack[Defaults]
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare and implement an action in one (a test's or a plugin's own): the contract is read from the
    function's annotations and docstring."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        input_model, output_model, _ = _models(name, fn)
        contract = declare(name, input_model, output_model, doc=inspect.getdoc(fn) or "", registry=registry,
                           **defaults)
        return implements(contract, registry=registry)(fn)

    return decorate

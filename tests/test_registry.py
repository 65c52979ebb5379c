"""The action registry: the one place an action's input is validated at run time."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.binding import action
from activities.registry import Registry


class Greeting(BaseModel):
    name: str = Field(min_length=1)
    times: int = 1


class Greeted(BaseModel):
    text: str


def _registry() -> tuple[Registry, list[Greeting]]:
    seen: list[Greeting] = []
    registry = Registry()

    @action("test.greet", registry=registry)
    async def greet(inp: Greeting) -> Greeted:
        seen.append(inp)
        return Greeted(text=" ".join([f"hello {inp.name}"] * inp.times))

    @action("test.greet_sync", registry=registry)
    def greet_sync(inp: Greeting) -> Greeted:
        seen.append(inp)
        return Greeted(text=inp.name)

    return registry, seen


async def test_the_action_receives_its_model_whatever_arrives() -> None:
    registry, seen = _registry()
    greet = registry.get("test.greet").fn
    assert (await greet({"name": "ada", "times": 2})).text == "hello ada hello ada"
    assert (await greet(Greeting(name="bob"))).text == "hello bob"
    assert registry.get("test.greet_sync").fn({"name": "cy"}).text == "cy"
    assert [type(s) for s in seen] == [Greeting] * 3


@pytest.mark.parametrize("bad", [{"name": ""}, {"name": "x", "times": "many"}, {"nme": "x"}, None, "text"])
async def test_bad_input_fails_once_with_one_non_retryable_error(bad: Any) -> None:
    registry, seen = _registry()
    with pytest.raises(ApplicationError) as err:
        await registry.get("test.greet").fn(bad)
    assert err.value.type == "InvalidArgument" and err.value.non_retryable
    assert err.value.message.startswith("bad arguments for test.greet (Greeting): ")
    assert seen == []  # the action's body never ran


def test_the_data_converter_does_not_validate_first() -> None:
    # A conversion failure in the SDK is retried as "Failed decoding arguments": the wrapper
    # declares Any so plain JSON reaches the one validation above.
    registry, _ = _registry()
    for name in ("test.greet", "test.greet_sync"):
        definition = activity._Definition.must_from_callable(registry.get(name).fn)
        assert definition.name == name and definition.arg_types == [Any] and definition.ret_type is Greeted
    spec = registry.get("test.greet")
    assert spec.input_model is Greeting and spec.output_model is Greeted


def test_every_registered_action_is_wrapped() -> None:
    from activities.catalog import load_registry

    for spec in load_registry().specs.values():
        assert activity._Definition.must_from_callable(spec.fn).arg_types == [Any], spec.name


def test_the_run_input_pins_exactly_the_registry_s_defaults() -> None:
    """ActionDefaults (what a run pins for replay) names fields; ActionSpec (the registry) holds each with the
    same type, so the loader copies them by name and a field added to one side cannot be forgotten."""
    import dataclasses
    import typing

    from activities.catalog import load_registry
    from activities.registry import ActionSpec
    from workflows.loader import pinned_defaults
    from workflows.spec import ActionDefaults

    held = {f.name: f.type for f in dataclasses.fields(ActionSpec)}
    hints = typing.get_type_hints(ActionSpec)
    for name, field in ActionDefaults.model_fields.items():
        assert name in held, f"ActionDefaults.{name} has no ActionSpec field"
        assert hints[name] == field.annotation, (name, hints[name], field.annotation)
    spec = load_registry().get("consul.snapshot.restore")
    assert spec is not None
    pinned = pinned_defaults(spec)
    assert {name: getattr(pinned, name) for name in ActionDefaults.model_fields} == \
        {name: getattr(spec, name) for name in ActionDefaults.model_fields}

"""The workers' sealing keys and seals, without a server: what holds, what is refused, and the digest both
sides compute over what Temporal carries."""

from __future__ import annotations

import dataclasses
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from runtime.connection import DATA_CONVERTER
from runtime.sealing import Sealer, SealKeys, SealKeysInvalid
from tests import support
from workflows.contract import FanOutInput, ResumeState, RunStart, SealedFanOut, SealedRun, StepState
from workflows.loader import plan_run
from workflows.seals import Seal, SealRequest, carried_digest, continuation_place, fan_out_place, received_digest
from workflows.spec import ForEachSpec


def test_a_first_start_makes_a_private_key_file_that_later_starts_read(tmp_path):
    path = tmp_path / "state" / "seal-keys"
    first = SealKeys.load(path)
    assert (path.stat().st_mode & 0o777) == 0o600
    again = SealKeys.load(path)
    assert again.current == first.current and again.keys == first.keys


def test_a_key_file_others_can_read_is_refused(tmp_path):
    path = tmp_path / "seal-keys"
    SealKeys.load(path)
    os.chmod(path, 0o644)
    with pytest.raises(SealKeysInvalid, match=r"readable by others .*chmod 600"):
        SealKeys.load(path)


@pytest.mark.parametrize(("text", "where"), [
    ("k1\n", ":1:1: a key line"),
    ("k1 not-base64!\n", ":1:4: the secret is not base64"),
    ("k1 c2hvcnQ=\n", ":1:4: the secret has 5 bytes"),
    ("# only a comment\n", "holds no sealing key"),
])
def test_a_malformed_key_file_is_refused_with_its_place(tmp_path, text, where):
    path = tmp_path / "seal-keys"
    path.write_text(text)
    os.chmod(path, 0o600)
    with pytest.raises(SealKeysInvalid) as refused:
        SealKeys.load(path, create=False)
    assert str(refused.value).startswith(str(path)) and where in str(refused.value)
    assert "\n" not in str(refused.value)


async def test_a_seal_holds_for_its_input_and_place_only(tmp_path):
    sealer = Sealer(SealKeys.load(tmp_path / "keys"))
    env = _local()
    place = continuation_place("coldstart-t", "run-1")
    request = SealRequest(digest="a" * 64, place=place)
    seal = await env.run(sealer.seal, request)
    await env.run(sealer.verify, request.model_copy(update={"seal": seal}))
    for changed in (request.model_copy(update={"digest": "b" * 64, "seal": seal}),
                    request.model_copy(update={"place": continuation_place("coldstart-t", "run-2"), "seal": seal}),
                    request.model_copy(update={"seal": seal.model_copy(update={"mac": "0" * 64})}),
                    request.model_copy(update={"seal": seal.model_copy(update={"key_id": "elsewhere"})}),
                    request):
        with pytest.raises(ApplicationError) as refused:
            await env.run(sealer.verify, changed)
        assert refused.value.type == "SealRefused" and refused.value.non_retryable


async def test_a_rotated_key_seals_and_the_old_one_still_verifies(tmp_path):
    path = tmp_path / "keys"
    before = Sealer(SealKeys.load(path))
    env = _local()
    request = SealRequest(digest="c" * 64, place=fan_out_place("child", "parent", "run"))
    old_seal = await env.run(before.seal, request)
    new_id = SealKeys.rotate(path)
    after_keys = SealKeys.load(path)
    assert after_keys.current == new_id and old_seal.key_id in after_keys.keys
    after = Sealer(after_keys)
    assert (await env.run(after.seal, request)).key_id == new_id
    await env.run(after.verify, request.model_copy(update={"seal": old_seal}))
    assert (path.stat().st_mode & 0o777) == 0o600


def _local() -> ActivityEnvironment:
    """An activity environment as a workflow's local activity sees it."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, is_local=True)
    return env


async def test_a_seal_is_never_made_or_checked_as_an_ordinary_activity_task(tmp_path):
    sealer = Sealer(SealKeys.load(tmp_path / "keys"))
    request = SealRequest(digest="a" * 64, place=continuation_place("coldstart-t", "run-1"))
    for call in (sealer.seal, sealer.verify):
        with pytest.raises(ApplicationError) as refused:
            await ActivityEnvironment().run(call, request)
        assert refused.value.type == "SealRefused" and "only as a local activity" in refused.value.message


def _carried_through_temporal(value):
    """What the receiving workflow parses from the payload the sender's value becomes."""
    payload = DATA_CONVERTER.payload_converter.to_payloads([value])[0]
    return DATA_CONVERTER.payload_converter.from_payloads([payload], [type(value)])[0]


def test_the_receiver_digests_a_continuation_as_its_sender_sealed_it(tmp_path):
    book = support.write_runbook(tmp_path, """
        metadata: {name: digest}
        target: t
        steps:
          - id: each
            for_each:
              items: [a, b]
              action: test.append
              with: {path: /tmp/x, label: "${{ item }}"}
    """)
    plan = plan_run(book, registry=support.registry(), inventory={"name": "t"}, initiator="carol")
    resume = ResumeState(next_index=1, steps={"each": StepState(id="each", kind="for_each", attempts=1,
                                                                 started_at=datetime(2026, 1, 1, 0, 0, 0, 123456, UTC),
                                                                 outputs={"n": 1.5, "when": datetime(2026, 1, 1, tzinfo=UTC)})},
                         undo_stack=[], outputs={"each": {"results": [(1, 2), None]}}, started_at=datetime.now(UTC))
    carried = plan.model_copy(update={"request": None, "resume": resume})
    start = RunStart(sealed=SealedRun(plan=carried, seal=Seal(key_id="k", mac="0" * 64)))
    arrived = _carried_through_temporal(start)
    assert arrived.sealed is not None
    assert received_digest(arrived.sealed.plan) == carried_digest(carried)


def test_the_receiver_digests_a_fan_out_batch_as_its_parent_sealed_it(tmp_path):
    book = support.write_runbook(tmp_path, """
        metadata: {name: digest}
        target: t
        steps:
          - {id: one, action: test.append, with: {path: /tmp/x, label: one}}
    """)
    action = plan_run(book, registry=support.registry(), inventory={"name": "t"}, initiator="c").actions["test.append"]
    spec = ForEachSpec.model_validate({"items": [], "action": "test.append", "as": "row",
                                       "with": {"path": "/tmp/x", "label": "${{ row.name }}"}})
    batch = FanOutInput(step_id="each", spec=spec, items=[{"name": "a", "n": 1}, {"name": "b", "n": 2.0}],
                        context={"params": {"when": datetime(2026, 1, 1, tzinfo=UTC)}}, action=action, offset=500)
    arrived = _carried_through_temporal(SealedFanOut(batch=batch, seal=Seal(key_id="k", mac="0" * 64)))
    assert received_digest(arrived.batch) == carried_digest(batch)
    assert received_digest(arrived.batch) != carried_digest(batch.model_copy(update={"items": [{"name": "c"}]}))


def test_the_default_key_file_follows_the_environment(tmp_path):
    from runtime.sealing import default_keys_path

    assert default_keys_path({"COLDSTART_SEAL_KEYS": str(tmp_path / "k")}) == tmp_path / "k"
    assert default_keys_path({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "coldstart" / "seal-keys"
    assert default_keys_path({}) == Path.home() / ".local" / "state" / "coldstart" / "seal-keys"

"""Every operator control is authorized by the runbook, and every malformed request is refused in one line."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.client import WorkflowUpdateFailedError
from typer.testing import CliRunner

from tests import support
from workflows.contract import ApproveRequest, ControlRequest, RequestError, parse_request


def _book(tmp_path, flag, *, access: str) -> object:
    out = tmp_path / "out.txt"
    return support.write_runbook(tmp_path, f"""
        metadata: {{name: access}}
        target: t
        {access}
        steps:
          - id: flaky
            action: test.maybe_fail
            with: {{path: "{out}", label: flaky, fail_until_file_exists: "{flag}"}}
            on_failure: hold
          - id: go
            approval: {{prompt: "go on?"}}
          - id: after
            action: test.append
            with: {{path: "{out}", label: after}}
    """, name="access")


async def _refused(handle, name: str, body) -> str:
    with pytest.raises(WorkflowUpdateFailedError) as failure:
        await handle.execute_update(name, body)
    message = str(failure.value.cause.message if hasattr(failure.value.cause, "message") else failure.value.cause)
    assert "\n" not in message
    return message


async def _held(handle, step="flaky"):
    return step in (await support.status(handle)).held


async def test_skip_needs_an_approver_and_four_eyes_needs_two(env, task_queue, tmp_path):
    flag = tmp_path / "never"
    book = _book(tmp_path, flag, access="approvers: [alice, bob]\n        operators: [olga]\n        four_eyes: true")
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue, initiator="olga")
        await support.wait_for(lambda: _held(handle))

        message = await _refused(handle, "skip", ControlRequest(step="flaky", actor="mallory", reason="trust me"))
        assert message == "'mallory' may not skip 'flaky' (approvers: alice, bob)"
        # An operator may retry, not skip.
        message = await _refused(handle, "skip", ControlRequest(step="flaky", actor="olga"))
        assert "may not skip" in message and "approvers: alice, bob" in message
        message = await _refused(handle, "retry", ControlRequest(step="flaky", actor="mallory"))
        assert message == "'mallory' may not retry this run (operators: alice, bob, olga)"

        first = await handle.execute_update("skip", ControlRequest(step="flaky", actor="alice", reason="gate is wrong"))
        assert "a second approver must confirm" in first
        assert (await support.status(handle)).held == ["flaky"]
        message = await _refused(handle, "skip", ControlRequest(step="flaky", actor="alice"))
        assert "four eyes: 'alice' already asked to skip 'flaky'" in message
        await handle.execute_update("skip", ControlRequest(step="flaky", actor="bob", reason="agreed"))

        await support.wait_for(lambda: _awaiting(handle, "go"))
        # Four eyes on approvals: the initiator may not approve their own run (olga is no approver anyway).
        message = await _refused(handle, "approve", ApproveRequest(step="go", approver="mallory"))
        assert message == "'mallory' may not approve 'go' (approvers: alice, bob)"
        await handle.execute_update("approve", ApproveRequest(step="go", approver="bob"))
        await handle.result()
        status = await support.status(handle)
        assert [s.status for s in status.steps] == ["skipped", "succeeded", "succeeded"]
        assert [(c.verb, c.actor, c.step) for c in status.controls] == [
            ("skip-requested", "alice", "flaky"), ("skip", "bob", "flaky")]


async def _awaiting(handle, step):
    return step in (await support.status(handle)).awaiting_approval


async def test_nobody_may_skip_without_declared_approvers(env, task_queue, tmp_path):
    flag = tmp_path / "fixed"
    book = _book(tmp_path, flag, access="operators: [olga]")
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        await support.wait_for(lambda: _held(handle))
        message = await _refused(handle, "skip", ControlRequest(step="flaky", actor="olga"))
        assert message == ("nobody may skip 'flaky': runbook access and its target name no approvers in common "
                           "(retry or abort instead)")
        message = await _refused(handle, "pause", ControlRequest(actor="eve"))
        assert message == "'eve' may not pause this run (operators: olga)"
        message = await _refused(handle, "abort", ControlRequest(actor="eve"))
        assert message == "'eve' may not abort this run (operators: olga)"
        # The skip signal is refused the same way and kept where status shows it.
        await handle.signal("skip_signal", ControlRequest(step="flaky", actor="eve"))
        await support.wait_for(lambda: handle.query("rejected_signals"))
        assert (await handle.query("rejected_signals"))[0].startswith("skip: nobody may skip 'flaky'")
        flag.touch()
        await handle.execute_update("retry", ControlRequest(step="flaky", actor="olga", reason="fixed"))
        await support.wait_for(lambda: _awaiting(handle, "go"))
        await handle.execute_update("abort", ControlRequest(actor="olga", reason="drill over"))
        status = await support.status(handle)
        assert status.steps[0].status == "succeeded"
        assert [(c.verb, c.actor) for c in status.controls] == [("retry", "olga"), ("abort", "olga")]


async def _cli(*args: str) -> tuple[int, str]:
    """`coldstart ARGS` as an operator runs it: (its exit code, what it printed or refused with, in one line)."""
    from cli.main import app

    result = await asyncio.to_thread(CliRunner().invoke, app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        message = str(result.exception)
        assert "\n" not in message, message
        return getattr(result.exception, "code", 1), message
    return result.exit_code, result.output


NAMED_BOOK = """
    metadata: {{name: {name}}}
    target: t
    {access}
    steps:
      - id: go
        approval: {{prompt: "go on?"}}
"""


async def test_abort_as_an_unnamed_actor_is_refused_whatever_the_policy_names(env, task_queue, tmp_path, monkeypatch):
    """`coldstart abort TARGET --as mallory` never ends a run because mallory typed a name: where the target's policy
    names operators, they and the approvers may; where nothing names operators, the runbook's approvers alone;
    where nobody is named, nobody, and the refusal says so. `coldstart plan` and the status say the same."""
    monkeypatch.setenv("TEMPORAL_ADDRESS", env.client.service_client.config.target_host)
    targets = tmp_path / "targets"
    targets.mkdir()
    monkeypatch.setenv("COLDSTART_TARGETS", str(targets))
    cases = [
        ("named-operators", "approvers: [alice, bob]", {"operators": ["carol"]}, ["alice", "bob", "carol"],
         "'mallory' may not abort this run (operators: alice, bob, carol)", "carol"),
        ("named-approvers", "approvers: [alice, bob]", None, ["alice", "bob"],
         "'mallory' may not abort this run (operators: alice, bob)", "bob"),
        ("nobody-named", "", None, [],
         "nobody may abort this run: neither runbook nobody-named nor its target names operators or approvers", None),
    ]
    async with support.worker(env.client, task_queue):
        for name, access, policy, operators, refusal, operator in cases:
            target = f"{name}-{uuid.uuid4().hex[:8]}"
            inventory = {"name": target, "telemetry": {"prometheus": "http://127.0.0.1:9"},
                         **({"policy": policy} if policy else {})}
            (targets / f"{target}.yaml").write_text(json.dumps(inventory))
            book = support.write_runbook(tmp_path, NAMED_BOOK.format(name=name, access=access), name=name)
            code, planned = await _cli("plan", str(book), "--target", target)
            assert code == 0, planned
            said = ", ".join(operators) if operators else "nobody (no operators or approvers named)"
            assert f"retry/pause/resume/abort: {said}" in " ".join(planned.split()), planned  # wrapped at 80

            handle = await support.start(env.client, book, task_queue, target=inventory)
            await support.wait_for(lambda handle=handle: _awaiting(handle, "go"))
            assert (await support.status(handle)).operators == operators
            for verb in ("abort", "pause"):
                code, message = await _cli(verb, target, "--as", "mallory")
                assert code == 5, (verb, message)  # refused
                hint = (" (the name is --as NAME, else $COLDSTART_USER, else your login: decide as one of those "
                        "named)" if " may not " in refusal else "")
                assert message == f"{verb} refused: {refusal.replace('abort', verb, 1)}{hint}", message
            assert (await support.status(handle)).state == "running"
            if operator is None:
                await handle.terminate()
                continue
            code, said = await _cli("pause", target, "--as", operator)
            assert code == 0 and said.strip() == f"paused by {operator}; the current step finishes first", said
            code, said = await _cli("abort", target, "--as", operator, "-m", "test over")
            assert code == 0 and said.strip() == f"abort requested by {operator}", said
            assert [(c.verb, c.actor) for c in (await support.status(handle)).controls] == [
                ("pause", operator), ("abort", operator)]


# What the Web UI lets anyone type: each is refused by the validator in one line, and changes nothing.
HOSTILE = [
    ({"step": "go", "approver": "bob", "role": "admin"}, "unknown field 'role'"),
    ({"step": "go"}, "field 'approver' is required"),
    ({"step": "go", "approver": 42}, "field 'approver': Input should be a valid string"),
    ({"step": "go", "approver": "b" * 65}, "a name is 65 characters, at most 64 allowed"),
    ({"step": "go", "approver": "bob", "comment": "x" * 1001}, "the text is 1001 characters, at most 1000 allowed"),
    ({"step": "go", "approver": "bob\x1b[2J"}, "a name contains control character U+001B"),
    ({"step": "go", "approver": "bob", "comment": "ok\u202egnp.exe"}, "the text contains control character U+202E"),
    ({"step": "go", "approver": "bob", "identity_token": "not a token"}, "the identity token is not a signed JWT"),
    (["go", "bob"], "ApproveRequest must be a JSON object, got list"),
]


async def test_malformed_requests_are_refused_and_change_nothing(env, task_queue, tmp_path):
    flag = tmp_path / "fixed"
    flag.touch()
    book = _book(tmp_path, flag, access="approvers: [bob]")
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        await support.wait_for(lambda: _awaiting(handle, "go"))
        before = (await support.status(handle)).model_dump()
        for body, expected in HOSTILE:
            message = await _refused(handle, "approve", body)
            assert expected in message, (body, message)
            await handle.signal("approve_signal", body)
        await support.wait_for(lambda: _rejected(handle, len(HOSTILE)))
        assert all("\n" not in line for line in await handle.query("rejected_signals"))
        # A flood of bad signals keeps only the latest 50 refusals in the run's state.
        for n in range(60):
            await handle.signal("approve_signal", {"step": "go", "approver": f"flood{n}", "role": "x"})
        await support.wait_for(lambda: _last_rejected_mentions(handle, "unknown field 'role'", count=50))
        kept = await handle.query("rejected_signals")
        assert len(kept) == 50
        after = (await support.status(handle)).model_dump()
        assert after == before
        await handle.execute_update("approve", {"step": "go", "approver": "bob", "comment": "multi\nline is fine"})
        await handle.result()


async def _rejected(handle, count: int) -> bool:
    return len(await handle.query("rejected_signals")) >= count


async def _last_rejected_mentions(handle, text: str, *, count: int) -> bool:
    kept = await handle.query("rejected_signals")
    return len(kept) == count and all(text in line for line in kept)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=80),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
_fields = st.fixed_dictionaries({}, optional={
    "step": _json | st.text(max_size=100), "approver": _json | st.text(max_size=100), "actor": _json | st.text(max_size=100),
    "comment": _json | st.text(), "reason": _json | st.text(), "identity_token": _json | st.text(max_size=64),
}) | st.dictionaries(st.text(max_size=20), _json, max_size=6) | _json


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=_fields)
def test_fuzzed_requests_parse_or_fail_in_one_line(raw):
    for model in (ApproveRequest, ControlRequest):
        try:
            parsed = parse_request(model, raw)
        except RequestError as exc:
            message = str(exc)
            assert message.startswith(model.__name__) and "\n" not in message and len(message) < 700
        else:
            dumped = parsed.model_dump()
            for value in dumped.values():
                if isinstance(value, str):
                    assert len(value) <= 16384
                    assert not any(ord(c) < 0x20 and c not in "\n\t" for c in value)

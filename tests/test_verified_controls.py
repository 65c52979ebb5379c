"""Verified identity through the workflow: Vault-signed tokens checked by the Update validators, subjects on record."""

from __future__ import annotations

import asyncio

import hvac
import pytest
from temporalio.client import WorkflowUpdateFailedError

from cli.identity import fetch_identity_token
from cli.timeline import build_timeline
from lab.hashistack.local import VaultDev
from lab.identity import IDENTITY_AUDIENCE, IDENTITY_ROLE, configure_identity
from tests import support
from workflows.contract import ApproveRequest, ControlRequest

ROOT = "verified-controls-root"
USERS = {"alice": "alice-pw", "bob": "bob-pw", "olga": "olga-pw"}


@pytest.fixture(scope="module")
def idp(tmp_path_factory):
    vault = VaultDev(tmp_path_factory.mktemp("vault-idp"), ROOT).start()
    try:
        setup = configure_identity(hvac.Client(url=vault.url, token=ROOT), USERS)
        yield vault, setup
    finally:
        vault.stop()


def _token(vault, user: str) -> str:
    return fetch_identity_token(vault.url, IDENTITY_ROLE, username=user, password=USERS[user])


async def _refused(handle, name: str, body) -> str:
    with pytest.raises(WorkflowUpdateFailedError) as failure:
        await handle.execute_update(name, body)
    cause = failure.value.cause
    return str(getattr(cause, "message", cause))


async def test_approvals_and_skips_need_a_valid_token_of_the_named_approver(env, task_queue, tmp_path, idp):
    vault, setup = idp
    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: verified}}
        target: t
        approvers: [alice, bob]
        operators: [olga]
        identity: {{vault: "{vault.url}", audience: {IDENTITY_AUDIENCE}, role: {IDENTITY_ROLE}}}
        steps:
          - id: go
            approval: {{prompt: "go on?"}}
          - id: flaky
            action: test.maybe_fail
            with: {{path: "{out}", label: flaky, fail_until_file_exists: "{tmp_path / 'never'}"}}
            on_failure: hold
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue, initiator="olga")
        await support.wait_for(lambda: _awaiting(handle, "go"))

        assert "approve needs a verified identity" in await _refused(handle, "approve", ApproveRequest(step="go", approver="alice"))
        bob = _token(vault, "bob")
        message = await _refused(handle, "approve", ApproveRequest(step="go", approver="alice", identity_token=bob))
        assert message == "the identity token is 'bob''s, not 'alice''s"
        olga = _token(vault, "olga")
        message = await _refused(handle, "approve", ApproveRequest(step="go", approver="olga", identity_token=olga))
        assert message == "'olga' may not approve 'go' (approvers: alice, bob)"
        forged = bob[:-4] + ("AAAA" if not bob.endswith("AAAA") else "BBBB")
        assert "signature" in await _refused(handle, "approve", ApproveRequest(step="go", approver="bob", identity_token=forged))

        record = await handle.execute_update("approve", ApproveRequest(step="go", approver="bob", identity_token=bob))
        assert record["subject"] == setup["users"]["bob"]

        await support.wait_for(lambda: _held(handle, "flaky"))
        # The same token again (it sits in the history for anyone who can read it): refused.
        message = await _refused(handle, "skip", ControlRequest(step="flaky", actor="bob", identity_token=bob))
        assert message == "this identity token was already used in this run: fetch a new one"
        # Retry is not among the verified controls here (approve and skip are): the operator's name suffices.
        await handle.execute_update("retry", ControlRequest(step="flaky", actor="olga"))
        await support.wait_for(lambda: _held(handle, "flaky"))
        # A refused signal leaves its token in the history for anyone to copy: it is spent all the same.
        copied = _token(vault, "alice")
        await handle.signal("skip_signal", {"step": "go", "actor": "alice", "identity_token": copied})
        await support.wait_for(lambda: _rejected(handle))
        message = await _refused(handle, "skip", ControlRequest(step="flaky", actor="alice", identity_token=copied))
        assert message == "this identity token was already used in this run: fetch a new one"
        await asyncio.sleep(1.1)  # Vault signs the same claims in the same second into the same token
        result = await handle.execute_update("skip", ControlRequest(step="flaky", actor="alice", reason="known bad check",
                                                                   identity_token=_token(vault, "alice")))
        assert result == f"skip flaky by alice (verified {setup['users']['alice']})"
        await handle.result()

        status = await support.status(handle)
        assert status.identity_required == ["approve", "skip"]
        assert [(c.verb, c.actor, c.subject) for c in status.controls] == [
            ("retry", "olga", None), ("skip", "alice", setup["users"]["alice"])]
        timeline = await build_timeline(env.client, handle.id)
        actors = [e.actor for e in timeline.entries if e.event in ("approve (update)", "skip (update)")]
        assert actors == [f"bob (verified {setup['users']['bob']})", f"alice (verified {setup['users']['alice']})"]


async def _rejected(handle) -> list[str]:
    return await handle.query("rejected_signals")


async def test_a_run_whose_vault_has_no_keys_fails_before_any_step(env, task_queue, tmp_path):
    vault = VaultDev(tmp_path / "bare-vault", ROOT).start()
    try:
        out = tmp_path / "out.txt"
        book = support.write_runbook(tmp_path, f"""
            metadata: {{name: verified-bare}}
            target: t
            approvers: [alice]
            identity: {{vault: "{vault.url}", audience: {IDENTITY_AUDIENCE}}}
            steps:
              - id: a
                action: test.append
                with: {{path: "{out}", label: a}}
        """)
        async with support.worker(env.client, task_queue):
            handle = await support.start(env.client, book, task_queue)
            with pytest.raises(Exception) as failure:
                await handle.result()
        assert "verified identity: cannot read the signing keys" in str(failure.value.cause)
        assert not out.exists()
    finally:
        vault.stop()


async def _awaiting(handle, step):
    return step in (await support.status(handle)).awaiting_approval


async def _held(handle, step):
    return step in (await support.status(handle)).held


async def test_the_timeline_says_verified_only_from_the_runs_own_records(env, task_queue, tmp_path):
    """A decision shows `(verified <subject>)` from the control record the run kept for its Update, never
    from text: a name cannot carry parentheses, and an unverified decision shows none."""
    from workflows.contract import RequestError, parse_request

    with pytest.raises(RequestError, match="a name cannot contain parentheses"):
        parse_request(ControlRequest, {"actor": "mallory (verified ent-1)"})
    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: plain}}
        target: t
        steps:
          - id: flaky
            action: test.maybe_fail
            with: {{path: "{out}", label: flaky, fail_items: [flaky]}}
            on_failure: hold
    """)
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue)
        await support.wait_for(lambda: _held(handle, "flaky"))
        await handle.execute_update("abort", ControlRequest(actor="mallory", reason="verified by nobody"))
        with pytest.raises(Exception):
            await handle.result()
        status = await support.status(handle)
        timeline = await build_timeline(env.client, handle.id)
    [record] = status.controls
    assert record.update_id and record.subject is None
    [entry] = [e for e in timeline.entries if e.event == "abort (update)"]
    assert entry.actor == "mallory"

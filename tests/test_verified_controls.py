"""Verified identity through the workflow: Vault-signed tokens checked by the Update validators, subjects on record."""

from __future__ import annotations

import asyncio

import hvac
import pytest
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError

from cli.identity import decision_source, fetch_decision_token, fetch_identity_token
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


def _fetch(vault, setup, user: str):
    """`user`'s Vault login, fetching a token from a DecisionSource (the run's provider and a decision's nonce)."""
    def fetch(source) -> str:
        assert source.provider == setup["provider"] and source.audience == setup["client_id"]
        return fetch_decision_token(vault.url, source.provider, source.audience, source.nonce, username=user,
                                    password=USERS[user])
    return fetch


async def _token(vault, setup, user: str, handle, verb: str, step: str | None = None) -> str:
    source, _ = await decision_source(handle, verb, step)
    assert source is not None
    return _fetch(vault, setup, user)(source)


async def _refused(handle, name: str, body) -> str:
    with pytest.raises(WorkflowUpdateFailedError) as failure:
        await handle.execute_update(name, body)
    cause = failure.value.cause
    return str(getattr(cause, "message", cause))


def _identity(vault, setup) -> str:
    return f'{{vault: "{vault.url}", audience: {setup["client_id"]}, provider: {setup["provider"]}}}'


async def test_approvals_and_skips_need_a_valid_token_of_the_named_approver(env, task_queue, tmp_path, idp):
    vault, setup = idp
    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: verified}}
        target: t
        approvers: [alice, bob]
        operators: [olga]
        identity: {_identity(vault, setup)}
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

        message = await _refused(handle, "approve", ApproveRequest(step="go", approver="alice"))
        assert message.startswith("approve needs a verified identity: send identity_token (`coldstart identity token ")
        bob = await _token(vault, setup, "bob", handle, "approve", "go")
        message = await _refused(handle, "approve", ApproveRequest(step="go", approver="alice", identity_token=bob))
        assert message == "the identity token is 'bob''s, not 'alice''s"
        olga = await _token(vault, setup, "olga", handle, "approve", "go")
        message = await _refused(handle, "approve", ApproveRequest(step="go", approver="olga", identity_token=olga))
        assert message == "'olga' may not approve 'go' (approvers: alice, bob)"
        forged = bob[:-4] + ("AAAA" if not bob.endswith("AAAA") else "BBBB")
        assert "signature" in await _refused(handle, "approve", ApproveRequest(step="go", approver="bob", identity_token=forged))

        record = await handle.execute_update("approve", ApproveRequest(step="go", approver="bob", identity_token=bob))
        assert record["subject"] == setup["users"]["bob"]

        await support.wait_for(lambda: _held(handle, "flaky"))
        # The approval's token (it sits in the history for anyone who can read it) is bound to approving `go`.
        message = await _refused(handle, "skip", ControlRequest(step="flaky", actor="bob", identity_token=bob))
        assert message == "identity token is bound to another run, step or verb (its nonce differs): fetch one for this decision"
        # Retry is not among the verified controls here (approve and skip are): the operator's name suffices.
        await handle.execute_update("retry", ControlRequest(step="flaky", actor="olga"))
        await support.wait_for(lambda: _held(handle, "flaky"))
        # A refused signal leaves its token in the history for anyone to copy: it is spent all the same.
        copied = await _token(vault, setup, "alice", handle, "skip", "flaky")
        await handle.signal("skip_signal", {"step": "go", "actor": "alice", "identity_token": copied})
        await support.wait_for(lambda: _rejected(handle))
        message = await _refused(handle, "skip", ControlRequest(step="flaky", actor="alice", identity_token=copied))
        assert message == "this identity token was already used in this run: fetch a new one"
        await asyncio.sleep(1.1)  # Vault signs the same claims in the same second into the same token
        fresh = await _token(vault, setup, "alice", handle, "skip", "flaky")
        result = await handle.execute_update("skip", ControlRequest(step="flaky", actor="alice", reason="known bad check",
                                                                   identity_token=fresh))
        assert result == f"skip flaky by alice (verified {setup['users']['alice']})"
        await handle.result()

        status = await support.status(handle)
        assert status.identity_required == ["approve", "skip"]
        assert [(c.verb, c.actor, c.subject) for c in status.controls] == [
            ("retry", "olga", None), ("skip", "alice", setup["users"]["alice"])]
        timeline = await build_timeline(env.client, handle.id)
        actors = [e.actor for e in timeline.entries if e.event in ("approve (update)", "skip (update)")]
        assert actors == [f"bob (verified {setup['users']['bob']})", f"alice (verified {setup['users']['alice']})"]


async def test_a_decision_copied_from_one_runs_history_serves_no_other_run_step_or_verb(env, task_queue, tmp_path, idp):
    vault, setup = idp
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: bound}}
        target: t
        approvers: [alice, bob]
        identity: {{vault: "{vault.url}", audience: {setup["client_id"]}, provider: {setup["provider"]},
                    controls: [approve, skip, abort]}}
        steps:
          - id: first
            approval: {{prompt: "first?"}}
          - id: second
            approval: {{prompt: "second?"}}
    """)
    async with support.worker(env.client, task_queue):
        one = await support.start(env.client, book, task_queue, target={"name": f"one-{task_queue}"})
        two = await support.start(env.client, book, task_queue, target={"name": f"two-{task_queue}"})
        await support.wait_for(lambda: _awaiting(one, "first"))
        await support.wait_for(lambda: _awaiting(two, "first"))
        token = await _token(vault, setup, "alice", one, "approve", "first")
        bound = "identity token is bound to another run, step or verb (its nonce differs): fetch one for this decision"
        # Another run, same step and verb: refused.
        assert await _refused(two, "approve", ApproveRequest(step="first", approver="alice", identity_token=token)) == bound
        # Another verb, same run: refused.
        assert await _refused(one, "abort", ControlRequest(actor="alice", identity_token=token)) == bound
        await one.execute_update("approve", ApproveRequest(step="first", approver="alice", identity_token=token))
        await support.wait_for(lambda: _awaiting(one, "second"))
        # Another step, same run and verb: refused (it is bound to `first`, and spent).
        assert await _refused(one, "approve", ApproveRequest(step="second", approver="alice", identity_token=token)) in (
            bound, "this identity token was already used in this run: fetch a new one")
        # An unbound token (identity/oidc/token, valid signature, same Vault) carries no nonce: refused too.
        unbound = fetch_identity_token(vault.url, IDENTITY_ROLE, username="alice", password=USERS["alice"])
        message = await _refused(one, "approve", ApproveRequest(step="second", approver="alice", identity_token=unbound))
        assert message.startswith("identity token ")
        for handle in (one, two):
            await handle.execute_update("abort", ControlRequest(
                actor="bob", identity_token=await _token(vault, setup, "bob", handle, "abort")))


async def test_four_eyes_compares_the_verified_starter_not_the_name_it_typed(env, task_queue, tmp_path, idp):
    vault, setup = idp
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: four-eyes}}
        target: t
        approvers: [alice, bob]
        four_eyes: true
        identity: {_identity(vault, setup)}
        steps:
          - id: go
            approval: {{prompt: "go on?"}}
    """)
    async with support.worker(env.client, task_queue):
        # No starter token: four eyes cannot compare people it has not verified, so the run does nothing.
        handle = await support.start(env.client, book, task_queue, initiator="alice",
                                     target={"name": f"unverified-{task_queue}"})
        with pytest.raises(Exception) as failure:
            await handle.result()
        assert "needs a verified starter (four eyes compares verified people)" in str(failure.value.cause)

        # bob starts it claiming to be alice (COLDSTART_USER=alice): the run records bob, whom four eyes then refuses.
        handle = await support.start(env.client, book, task_queue, initiator="alice",
                                     target={"name": f"spoofed-{task_queue}"}, identity=_fetch(vault, setup, "bob"))
        await support.wait_for(lambda: _awaiting(handle, "go"))
        status = await support.status(handle)
        assert status.initiator == "bob"
        message = await _refused(handle, "approve", ApproveRequest(
            step="go", approver="bob", identity_token=await _token(vault, setup, "bob", handle, "approve", "go")))
        assert message == "four eyes: 'bob' started this run and cannot approve it"
        await handle.execute_update("approve", ApproveRequest(
            step="go", approver="alice", identity_token=await _token(vault, setup, "alice", handle, "approve", "go")))
        await handle.result()


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
            identity: {{vault: "{vault.url}", audience: {IDENTITY_AUDIENCE}, provider: coldstart}}
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
        operators: [mallory]
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
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        status = await support.status(handle)
        timeline = await build_timeline(env.client, handle.id)
    [record] = status.controls
    assert record.update_id and record.subject is None
    [entry] = [e for e in timeline.entries if e.event == "abort (update)"]
    assert entry.actor == "mallory"


async def test_where_the_target_verifies_identity_a_typed_name_never_steers_the_run(env, task_queue, tmp_path, idp):
    """The target's policy verifies approvals and skips only (its `controls`), yet retry, pause, resume and abort
    need a verified token too: a named operator's name typed by anyone is not enough to end a recovery."""
    vault, setup = idp
    book = support.write_runbook(tmp_path, """
        metadata: {name: target-verified}
        target: t
        approvers: [alice, bob]
        operators: [olga]
        steps:
          - id: go
            approval: {prompt: "go on?"}
    """)
    target = {"name": f"verified-target-{task_queue}", "policy": {"identity": {
        "vault": vault.url, "provider": setup["provider"], "audience": setup["client_id"],
        "controls": ["approve", "skip"]}}}
    async with support.worker(env.client, task_queue):
        handle = await support.start(env.client, book, task_queue, target=target)
        await support.wait_for(lambda: _awaiting(handle, "go"))
        status = await support.status(handle)
        assert status.identity_required == ["approve", "skip", "retry", "pause", "resume", "abort"]
        assert status.operators == ["alice", "bob", "olga"]
        for verb in ("pause", "abort"):
            message = await _refused(handle, verb, ControlRequest(actor="olga"))
            assert message.startswith(f"{verb} needs a verified identity: send identity_token (`coldstart identity "
                                      f"token {handle.id} --verb {verb} --vault-login`"), message
        # mallory's own verified name is still no operator's.
        message = await _refused(handle, "abort", ControlRequest(
            actor="mallory", identity_token=await _token(vault, setup, "olga", handle, "abort")))
        assert message == "the identity token is 'olga''s, not 'mallory''s"
        await asyncio.sleep(1.1)  # Vault signs the same claims in the same second into the same token
        said = await handle.execute_update("abort", ControlRequest(
            actor="olga", reason="verified", identity_token=await _token(vault, setup, "olga", handle, "abort")))
        assert said == "abort requested by olga"
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        assert [(c.verb, c.actor, c.subject) for c in (await support.status(handle)).controls] == [
            ("abort", "olga", setup["users"]["olga"])]

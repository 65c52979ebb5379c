"""Operator controls: who may approve, retry, skip, pause, resume or abort, and what each accepted one records."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.policy import OPERATOR_VERBS, TargetPolicy, narrowed
    from workflows.contract import ApprovalRecord, ApproveRequest, ControlRecord, ControlRequest
    from workflows.identity import RUN_LEVEL, decision_nonce, effective_identity, verify_identity_token
    from workflows.run_state import RunFields
    from workflows.spec import ApprovalSpec, IdentityPolicy

__all__ = ["MAX_CONTROLS_KEPT", "MAX_TOKENS_KEPT", "OperatorControls"]


# What a run keeps of its decisions is bounded (it travels in the status and across continue-as-new); the
# history keeps every one. Tokens live at most 15 minutes, so the newest thousand spent are all that can
# still be presented again.
MAX_CONTROLS_KEPT = 200
MAX_TOKENS_KEPT = 1000


# Decisions about the whole run: their tokens are bound to the run, not to a step.
_RUN_VERBS = frozenset({"abort", "pause", "resume"})


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:32]


class OperatorControls(RunFields):
    """RunbookWorkflow's operator controls, checked in Update validators and applied by the handlers.

    Each control is authorized twice over: the target's policy (from the controller's inventory) and
    the runbook, which may only narrow it, say who may (approvers, operators, four eyes); where the runbook
    requires verified identity, a Vault-signed token says who is asking, and where the target does, for
    every control that steers the run too.
    """

    def _policy(self) -> TargetPolicy:
        return TargetPolicy.of(self._inp.target)

    def _allowed_approvers(self, spec: ApprovalSpec) -> list[str] | None:
        """Who may approve this step; None: anyone named (neither the target nor the runbook restricts it)."""
        asked = spec.approvers if spec.approvers is not None else self._inp.runbook.approvers
        return narrowed(self._policy().approvers, list(asked) or None)

    def _skippers(self) -> list[str]:
        """Who may skip a held step: the runbook's approvers within the target's; nobody when neither names any."""
        return narrowed(self._policy().approvers, list(self._inp.runbook.approvers) or None) or []

    def _four_eyes(self, spec: ApprovalSpec | None = None) -> bool:
        if self._policy().four_eyes:
            return True
        if spec is not None and spec.four_eyes is not None:
            return spec.four_eyes
        return self._inp.runbook.four_eyes

    def _identity(self) -> IdentityPolicy | None:
        """The verified identity this run enforces: the target's, with the runbook's decisions added."""
        return effective_identity(self._inp.runbook.identity, self._policy().identity)

    def _needs_identity(self, verb: str) -> bool:
        if verb in OPERATOR_VERBS and self._policy().identity is not None:
            # Where the target verifies who decides, a typed name never steers a run, whatever `controls` lists.
            return True
        policy = self._identity()
        return policy is not None and verb in policy.controls

    def _identity_required(self) -> list[str]:
        """The decisions that need a verified token in this run (its status says so, and the views add
        --vault-login to their commands)."""
        identity = self._identity()
        if identity is None:
            return []
        return [*identity.controls, *(verb for verb in OPERATOR_VERBS
                                      if verb not in identity.controls and self._needs_identity(verb))]

    def _nonce(self, verb: str, step: str | None) -> str:
        info = workflow.info()
        return decision_nonce(info.workflow_id, info.first_execution_run_id, verb, step or RUN_LEVEL)

    def token_command(self, verb: str, step: str | None) -> str:
        """The command that fetches an identity token for one decision of this run, for an approver to paste."""
        where = f" --step {step}" if step and step != RUN_LEVEL and verb not in _RUN_VERBS else ""
        return f"coldstart identity token {workflow.info().workflow_id} --verb {verb}{where} --vault-login"

    def _example(self, verb: str, **fields: Any) -> str:
        if self._needs_identity(verb):
            fields["identity_token"] = f"<output of `{self.token_command(verb, fields.get('step'))}`>"
        return json.dumps(fields)

    # ---- operator controls -----------------------------------------------------------------
    # Each control is authorized twice over: the runbook says who may (approvers, operators, four
    # eyes) and, where it requires verified identity, a Vault-signed token says who is asking.

    def _identify(self, verb: str, name: str, token: str | None, step: str | None = None) -> tuple[str, str | None]:
        """The acting name and, with verified identity, the token's subject; ValueError otherwise. `step` is
        the step decided on (None for the whole run): a bound token must carry this decision's nonce."""
        if name in self._policy().drill_approvers and not self._inp.drill:
            raise ValueError(f"{name!r} is a drill approver: it acts on drill runs only, and this run is no drill")
        if not self._needs_identity(verb):
            return name, None
        policy = self._identity()
        assert policy is not None
        if not token:
            raise ValueError(f"{verb} needs a verified identity: send identity_token "
                             f"(`{self.token_command(verb, step)}` fetches one)")
        if policy.provider is None:
            raise ValueError("verified identity needs a Vault OIDC provider (identity.provider): this run's "
                             "tokens could not be bound to their decision")
        if self._identity_keys is None:
            raise ValueError("the run has not captured its identity keys yet; try again in a moment")
        who = verify_identity_token(token, self._identity_keys, audience=policy.audience, now=workflow.now(),
                                    name_claim=policy.name_claim, nonce=self._nonce(verb, step))
        if name != who.name:
            raise ValueError(f"the identity token is {who.name!r}'s, not {name!r}'s")
        if _digest(token) in self._used_tokens:
            raise ValueError("this identity token was already used in this run: fetch a new one")
        return who.name, who.subject

    def _spend(self, token: str | None) -> None:
        if token and self._identity() is not None:
            self._used_tokens.append(_digest(token))
            del self._used_tokens[:-MAX_TOKENS_KEPT]

    def _operators(self) -> list[str]:
        """Who may retry, pause, resume and abort (TargetPolicy.run_operators: empty, nobody)."""
        book, policy = self._inp.runbook, self._policy()
        return policy.run_operators(list(book.operators), list(book.approvers))

    def _check_operator(self, verb: str, req: ControlRequest, step: str | None = None) -> str | None:
        allowed = self._operators()
        if not allowed:
            raise ValueError(f"nobody may {verb} this run: {self._nobody_operates()}")
        name, subject = self._identify(verb, req.actor, req.identity_token, step)
        if name not in allowed:
            raise ValueError(f"{name!r} may not {verb} this run (operators: {', '.join(allowed) or 'none'})")
        return subject

    def _nobody_operates(self) -> str:
        """Why nobody may retry, pause, resume or abort this run, for its refusals and views."""
        book, policy = self._inp.runbook, self._policy()
        if not (book.operators or book.approvers or policy.operators or policy.approvers):
            return f"neither runbook {book.metadata.name} nor its target names operators or approvers"
        return f"runbook {book.metadata.name} and its target name no operators or approvers in common"

    def _check_approve(self, req: ApproveRequest) -> str | None:
        if req.step not in self._steps:
            raise ValueError(f"no step {req.step!r} in runbook {self._inp.runbook.metadata.name}")
        spec = self._awaiting.get(req.step)
        if spec is None or req.step in self._granted:
            raise ValueError(f"step {req.step!r} is not awaiting approval (it is {self._steps[req.step].status})")
        if not req.approver.strip():
            raise ValueError("an approval needs the approver's name")
        name, subject = self._identify("approve", req.approver, req.identity_token, req.step)
        allowed = self._allowed_approvers(spec)
        if allowed is not None and name not in allowed:
            raise ValueError(f"{name!r} may not approve {req.step!r} (approvers: {', '.join(allowed) or 'none'})")
        starter = self._inp.initiator_subject
        if self._four_eyes(spec) and (name == self._inp.initiator or (subject is not None and subject == starter)):
            raise ValueError(f"four eyes: {name!r} started this run and cannot approve it")
        return subject

    def _held_step(self, req: ControlRequest, verb: str) -> str:
        if not req.actor.strip():
            raise ValueError(f"{verb} needs the operator's name (actor)")
        if req.step is None:
            held = [s for s, st in self._steps.items() if st.status == "held" and s not in self._decisions]
            if len(held) != 1:
                raise ValueError(f"{verb}: name the step (held: {', '.join(held) or 'none'})")
            return held[0]
        if req.step not in self._steps:
            raise ValueError(f"no step {req.step!r} in runbook {self._inp.runbook.metadata.name}")
        if self._steps[req.step].status != "held" or req.step in self._decisions:
            raise ValueError(f"step {req.step!r} is not held (it is {self._steps[req.step].status})")
        return req.step

    def _check_held(self, req: ControlRequest, verb: str) -> tuple[str, str | None]:
        """(the held step, the verified subject or None)."""
        step = self._held_step(req, verb)
        if verb != "skip":
            return step, self._check_operator(verb, req, step)
        # Skipping a held step (a failed health gate, most often) is the most dangerous act in a recovery.
        name, subject = self._identify("skip", req.actor, req.identity_token, step)
        approvers = self._skippers()
        if not approvers:
            raise ValueError(f"nobody may skip {step!r}: runbook {self._inp.runbook.metadata.name} and its target name "
                             "no approvers in common (retry or abort instead)")
        if name not in approvers:
            raise ValueError(f"{name!r} may not skip {step!r} (approvers: {', '.join(approvers)})")
        first = self._steps[step].skip_requested_by
        if self._four_eyes() and first == name:
            raise ValueError(f"four eyes: {name!r} already asked to skip {step!r}; a second approver must confirm")
        return step, subject

    def _record(self, verb: str, step: str | None, actor: str, reason: str, subject: str | None) -> None:
        update = workflow.current_update_info()
        self._controls.append(ControlRecord(verb=verb, step=step, actor=actor, reason=reason,
                                            at=workflow.now(), subject=subject, update_id=update.id if update else None))
        del self._controls[:-MAX_CONTROLS_KEPT]
        workflow.logger.info(f"operator {verb}", extra={"step": step, "actor": actor, "subject": subject,
                                                          "reason": reason})

    def _decide(self, req: ControlRequest, verb: str) -> str:
        step, subject = self._check_held(req, verb)
        self._spend(req.identity_token)
        verified = f" (verified {subject})" if subject else ""
        state = self._steps[step]
        if verb == "skip" and self._four_eyes() and state.skip_requested_by is None:
            state.skip_requested_by = req.actor
            self._record("skip-requested", step, req.actor, req.reason, subject)
            return f"skip of {step} requested by {req.actor}{verified}; four eyes: a second approver must confirm"
        state.skip_requested_by = None
        self._decisions[step] = verb
        self._record(verb, step, req.actor, req.reason, subject)
        return f"{verb} {step} by {req.actor}{verified}"

    def _approve(self, req: ApproveRequest) -> ApprovalRecord:
        subject = self._check_approve(req)
        self._spend(req.identity_token)
        record = ApprovalRecord(step=req.step, approver=req.approver, comment=req.comment, at=workflow.now(),
                                subject=subject)
        self._granted[req.step] = record
        workflow.logger.info("approved", extra={"step": req.step, "approver": req.approver, "subject": subject})
        return record

    def _check_abort(self, req: ControlRequest) -> str | None:
        if not req.actor.strip():
            raise ValueError("abort needs the operator's name (actor)")
        if self._abort is not None:
            raise ValueError(f"already aborted by {self._abort.actor}")
        if self._state != "running":
            raise ValueError(f"the run has already {self._state}")
        return self._check_operator("abort", req)

    def _abort_run(self, req: ControlRequest) -> str:
        subject = self._check_abort(req)
        self._spend(req.identity_token)
        self._abort = req
        self._record("abort", req.step, req.actor, req.reason, subject)
        return f"abort requested by {req.actor}"

    def _check_pausing(self, req: ControlRequest, verb: str) -> str | None:
        """pause or resume: who may, and only from the other state."""
        if not req.actor.strip():
            raise ValueError(f"{verb} needs the operator's name (actor)")
        if self._paused == (verb == "pause"):
            raise ValueError("the run is already paused" if self._paused else "the run is not paused")
        return self._check_operator(verb, req)

    def _set_paused(self, req: ControlRequest, verb: str) -> str:
        subject = self._check_pausing(req, verb)
        self._spend(req.identity_token)
        self._paused = verb == "pause"
        self._record(verb, None, req.actor, req.reason, subject)
        if not self._paused:
            return f"resumed by {req.actor}"
        workflow.set_current_details(self._details(None))
        return f"paused by {req.actor}; the current step finishes first"

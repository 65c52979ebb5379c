"""What a runbook run keeps, declared once for the classes RunbookWorkflow is made of.

RunbookWorkflow sets these in its constructor; its operator controls (workflows/controls.py) and its
Web UI face (workflows/visibility.py) read and change them, and call each other's methods named below.
Declarations only: nothing here exists at run time but the class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from datetime import datetime

    from activities.oidc import IdentityKeys
    from workflows.contract import ApprovalRecord, ControlRecord, RunInput, RunOutcome, RunStatus, StepState
    from workflows.spec import AnyStep, ApprovalSpec

__all__ = ["RunFields"]


class RunFields:
    _inp: RunInput
    _steps: dict[str, StepState]
    _awaiting: dict[str, ApprovalSpec]
    _granted: dict[str, ApprovalRecord]
    _decisions: dict[str, str]
    _controls: list[ControlRecord]
    _identity_keys: IdentityKeys | None
    _used_tokens: list[str]
    _state: Literal["running"] | RunOutcome
    _paused: bool
    _error: str | None
    _ended_at: datetime | None
    # The live view, paced (VIEW_EVERY) by the status keeper.
    _published: tuple[str | None, bool] | None
    _wanted_view: tuple[str | None, bool] | None
    _asks: int

    if TYPE_CHECKING:
        # RunbookWorkflow's
        def status(self) -> RunStatus: ...
        def _run_status(self, steps: list[StepState], current_step: str | None, held: list[str]) -> RunStatus: ...

        # RunVisibility's
        def _details(self, step: AnyStep | None) -> str: ...

        # OperatorControls'
        def _allowed_approvers(self, spec: ApprovalSpec) -> list[str] | None: ...
        def _skippers(self) -> list[str]: ...
        def _four_eyes(self, spec: ApprovalSpec | None = None) -> bool: ...
        def _needs_identity(self, verb: str) -> bool: ...
        def token_command(self, verb: str, step: str | None) -> str: ...
        def _example(self, verb: str, **fields: Any) -> str: ...
        def _operators(self) -> list[str] | None: ...
        def _nobody_operates(self) -> str: ...

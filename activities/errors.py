"""coldstart's one exception hierarchy: every error the controller raises on purpose is a ColdstartError.

    ColdstartError
    ├── InvalidInput (also a ValueError): a runbook, inventory, request or argument that cannot be
    │   │                                 used; nothing was started or changed
    │   └── LocatedErrors: every problem in one input, one `file:line:col: message` line each
    ├── Refused: a well-formed request the controller will not carry out (policy, a busy target)
    └── Unavailable: a system the operation needs could not be reached or answered wrongly

Errors inside an action that Temporal must see are raised as ApplicationError (activities/registry.py);
these are the errors of the code around the runs: the loader, the catalog, the CLI, the receiver.
"""

from __future__ import annotations

__all__ = ["ColdstartError", "InvalidInput", "LocatedErrors", "Refused", "Unavailable"]


class ColdstartError(Exception):
    """Base of every error coldstart raises on purpose (a bug stays a plain Python error)."""


class InvalidInput(ColdstartError, ValueError):
    """Input that cannot be used; a ValueError too, so callers catching malformed input catch it."""


class LocatedErrors(InvalidInput):
    """Every problem found in one input, one `file:line:col: message` line each, in `errors`."""

    def __init__(self, errors: list[str]):
        super().__init__("\n".join(errors))
        self.errors = list(errors)


class Refused(ColdstartError):
    """A well-formed request the controller will not carry out."""


class Unavailable(ColdstartError):
    """A system the operation needs could not be reached, or answered wrongly; trying again may help."""

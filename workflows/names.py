"""Target and runbook names: one pattern wherever a name enters (a run request, the CLI, a trigger, a schedule,
a fleet, the catalog), and the files a name picks kept inside their directory."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, WithJsonSchema

from activities.errors import InvalidInput

__all__ = ["NAME_PATTERN", "NameRefused", "RunbookName", "TargetName", "check_name", "named_file"]

# Letters, digits, `_`, `.` and `-`, a letter or digit first, at most 128 characters: a name is one file name
# in its directory (no `/`, no leading `.`, so never `..` or a path of its own) and fits a workflow id. Every
# runbook's metadata.name (a stricter pattern, workflows/spec.py) and every inventory's name matches it.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
_NAME = re.compile(NAME_PATTERN)
_SHOWN = 80  # characters of a refused value repeated in its error


class NameRefused(InvalidInput):
    """A target or runbook name that does not match NAME_PATTERN, or a file named by one outside its directory;
    the message is one line naming the value."""


def check_name(kind: str, value: Any) -> str:
    """`value` if it is a `kind` ("target", "runbook") name matching NAME_PATTERN; NameRefused otherwise."""
    if isinstance(value, str) and _NAME.fullmatch(value):
        return value
    shown = repr(value[:_SHOWN]) + ("..." if len(value) > _SHOWN else "") if isinstance(value, str) else repr(value)
    raise NameRefused(f"{kind} name {shown} is refused: a {kind} name matches {NAME_PATTERN} (letters, digits, "
                      "'_', '.' and '-', a letter or digit first, at most 128 characters)")


def named_file(directory: Path, kind: str, name: str, suffix: str = ".yaml") -> Path:
    """directory/NAME{suffix} for a checked `kind` name; NameRefused when the name is not one, or when the path
    would leave `directory` (it cannot once the name matches: kept as the last line of defence)."""
    check_name(kind, name)
    path = directory / f"{name}{suffix}"
    base = directory.resolve()
    # Normalised, not resolved through links: a file the operator linked into the directory is theirs to place
    # (the reader refuses what is no regular file); a name may only not lead out of it.
    inside = Path(os.path.normpath(base / f"{name}{suffix}"))
    if inside.parent != base:
        raise NameRefused(f"{kind} name {name!r} is refused: it names a file outside {directory}")
    return path


def _checked(kind: str) -> AfterValidator:
    return AfterValidator(lambda value: check_name(kind, value))


# The name fields of the models that cross Temporal (workflows/contract.py, workflows/readiness.py) and of the
# triggers file: a value that does not match is refused when the model is validated, with check_name's line.
TargetName = Annotated[str, _checked("target"), WithJsonSchema({"type": "string", "pattern": NAME_PATTERN})]
RunbookName = Annotated[str, _checked("runbook"), WithJsonSchema({"type": "string", "pattern": NAME_PATTERN})]

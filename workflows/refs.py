"""`${{ a.b[0].c }}` references: finding them, and resolving them deterministically."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from activities.errors import InvalidInput

__all__ = ["REF", "RefError", "contains_refs", "iter_refs", "lookup", "resolve", "split_path"]

REF = re.compile(r"\$\{\{\s*([^{}]*?)\s*\}\}")
_SEGMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)|\[(\d+)\]|\.")


class RefError(InvalidInput):
    """A reference that does not resolve."""


def split_path(path: str) -> list[str | int]:
    """`steps.snap.outputs.files[0]` -> ['steps', 'snap', 'outputs', 'files', 0]."""
    parts: list[str | int] = []
    pos = 0
    expect_name = True
    while pos < len(path):
        match = _SEGMENT.match(path, pos)
        if not match:
            raise RefError(f"bad reference {path!r} at character {pos + 1}")
        name, index = match.group(1), match.group(2)
        if name is not None:
            if not expect_name:
                raise RefError(f"bad reference {path!r}: missing '.' before {name!r}")
            parts.append(name)
            expect_name = False
        elif index is not None:
            if not parts:
                raise RefError(f"bad reference {path!r}: starts with an index")
            parts.append(int(index))
        else:
            if expect_name:
                raise RefError(f"bad reference {path!r}: empty name")
            expect_name = True
        pos = match.end()
    if not parts or expect_name:
        raise RefError(f"bad reference {path!r}")
    return parts


def iter_refs(value: Any) -> Iterator[str]:
    """Every reference path in a nested structure of dicts, lists and strings."""
    if isinstance(value, str):
        for match in REF.finditer(value):
            yield match.group(1)
    elif isinstance(value, dict):
        for item in value.values():
            yield from iter_refs(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from iter_refs(item)


def contains_refs(value: Any) -> bool:
    return next(iter_refs(value), None) is not None


def lookup(path: str, context: dict[str, Any]) -> Any:
    current: Any = context
    walked: list[str] = []
    for part in split_path(path):
        if isinstance(part, int):
            if not isinstance(current, list) or part >= len(current):
                raise RefError(f"{'.'.join(walked)} has no item [{part}]")
            current = current[part]
            walked.append(f"[{part}]")
            continue
        if not isinstance(current, dict) or part not in current:
            where = ".".join(str(w) for w in walked) or "the context"
            raise RefError(f"{where} has no {part!r}")
        current = current[part]
        walked.append(part)
    return current


def resolve(value: Any, context: dict[str, Any], *, only: set[str] | None = None) -> Any:
    """Replace references; a string that is exactly one reference takes the referenced value's type.

    `only` limits resolution to references whose first segment is in the set, leaving the
    rest in place (parameters and target resolve before start, step outputs during the run).
    """
    if isinstance(value, str):
        whole = REF.fullmatch(value.strip())
        if whole:
            path = whole.group(1)
            if only is not None and split_path(path)[0] not in only:
                return value
            return lookup(path, context)

        def substitute(match: re.Match[str]) -> str:
            path = match.group(1)
            if only is not None and split_path(path)[0] not in only:
                return match.group(0)
            found = lookup(path, context)
            return found if isinstance(found, str) else json.dumps(found, default=str)

        return REF.sub(substitute, value)
    if isinstance(value, dict):
        return {key: resolve(item, context, only=only) for key, item in value.items()}
    if isinstance(value, list):
        return [resolve(item, context, only=only) for item in value]
    return value

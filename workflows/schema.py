"""The runbook JSON Schema, written to runbooks/runbook.schema.json for editors."""

from __future__ import annotations

from typing import Any

from workflows.spec import Runbook

__all__ = ["runbook_json_schema"]


def runbook_json_schema() -> dict[str, Any]:
    schema = Runbook.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "coldstart runbook"
    return schema

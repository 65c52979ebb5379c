"""The one strict model base for what people write (runbooks, inventories, triggers files): an unknown key is an error."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["StrictModel"]


class StrictModel(BaseModel):
    """Unknown keys are refused (a typo never passes as a default); fields are filled by name or by alias."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

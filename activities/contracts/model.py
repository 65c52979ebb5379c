"""The base of the actions' input and output models: each builds its validator on first use, so loading every contract stays cheap."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ContractModel"]


class ContractModel(BaseModel):
    """A pydantic model whose schema is built when it first validates or describes something, not at import:
    `validate` checks a runbook against the few actions it calls, not against all of them."""

    model_config = ConfigDict(defer_build=True)

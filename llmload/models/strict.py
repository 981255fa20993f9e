"""The base of every strict contract: a misspelt key fails loudly (`extra="forbid"`), and no value changes after."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

"""Base class of every typed configuration: unknown keys are errors, values are frozen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Config(BaseModel):
    """Typed config section. Each field carries SI units in its name and a description."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

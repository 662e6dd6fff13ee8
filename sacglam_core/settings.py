"""Typed settings: frozen dataclasses validated by pydantic (types, literals, finite numbers, no unknown keys)."""

from __future__ import annotations

from pydantic import ConfigDict
from pydantic.dataclasses import dataclass

# use_attribute_docstrings: a field's docstring (the string below it) is its description, which
# `python -m sacglam_core.reference` prints in docs/configuration.md.
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True)


def settings(cls):
    """Decorate a settings class: frozen, validated on construction, unknown keys rejected."""
    return dataclass(frozen=True, config=STRICT)(cls)

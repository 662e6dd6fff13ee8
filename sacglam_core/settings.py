"""Typed settings: frozen dataclasses validated by pydantic (types, literals, finite numbers, no unknown keys)."""

from __future__ import annotations

from pydantic import ConfigDict
from pydantic.dataclasses import dataclass

STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


def settings(cls):
    """Decorate a settings class: frozen, validated on construction, unknown keys rejected."""
    return dataclass(frozen=True, config=STRICT)(cls)

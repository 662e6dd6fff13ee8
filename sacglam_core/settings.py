"""Typed settings: frozen dataclasses validated by pydantic (types, literals, no unknown keys)."""

from __future__ import annotations

from pydantic import ConfigDict
from pydantic.dataclasses import dataclass

STRICT = ConfigDict(extra="forbid")


def settings(cls):
    """Decorate a settings class: frozen, validated on construction, unknown keys rejected."""
    return dataclass(frozen=True, config=STRICT)(cls)

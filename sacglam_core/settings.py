"""Typed settings: frozen dataclasses validated by pydantic (types, literals, finite numbers, no unknown keys)."""

from __future__ import annotations

import types
import typing

from pydantic import ConfigDict, field_validator
from pydantic.dataclasses import dataclass

# use_attribute_docstrings: a field's docstring (the string below it) is its description, which
# `python -m sacglam_core.reference` prints in docs/configuration.md.
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True)


def _numeric(annotation) -> bool:
    """Whether a field takes a number and not a boolean (`int`, `float | None`...)."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _numeric(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        return bool not in options and any(_numeric(option) for option in options)
    return annotation in (int, float)


def _refuse_booleans(cls, value, info):
    # pydantic reads true as 1 in a number's place: `gpus_per_node: true` would silently be one GPU
    if isinstance(value, bool) and _numeric(cls.__pydantic_fields__[info.field_name].annotation):
        raise ValueError(f"{str(value).lower()} is not a number")
    return value


def settings(cls):
    """Decorate a settings class: frozen, validated on construction, unknown keys and booleans for numbers
    rejected."""
    cls._refuse_booleans = field_validator("*", mode="before")(classmethod(_refuse_booleans))
    return dataclass(frozen=True, config=STRICT)(cls)

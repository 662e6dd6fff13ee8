"""The configuration reference: every key of a run configuration with its type, default, the paper's value and
its description (the field's docstring), as Markdown generated from the typed configuration.

    python -m sacglam_core.reference > docs/configuration.md
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from typing import Annotated, Literal, Union, get_args, get_origin

import annotated_types
from pydantic.fields import FieldInfo

from sacglam_core.config import RunConfig
from sacglam_core.reports.tables import NOT_COMPARED, paper_config

COMMAND = "python -m sacglam_core.reference > docs/configuration.md"
VARIANTS = {"ppo": "PPO-GLAM", "sac": "SAC-GLAM", "sac_her": "SAC-GLAM+HER"}
# Keys (or prefixes) that one algorithm alone reads; config.coherence_problems rejects the HER keys elsewhere.
ONLY = {"sac.": "sac", "ppo.": "ppo", "her.strategy": "sac", "her.ratio": "sac", "her.aligned_only": "ppo"}
ALGORITHMS = {"sac": "SAC", "ppo": "PPO"}
BOUNDS = {annotated_types.Gt: ">", annotated_types.Ge: ">=", annotated_types.Lt: "<", annotated_types.Le: "<="}

INTRO = f"""\
# Configuration reference

<!-- Generated from the typed configuration (sacglam_core/config.py, sacglam_core/envs/playground.py) by
`{COMMAND}`; edit the fields' docstrings, not this file. -->

Every key of a run configuration, by dotted path. A run's YAML file, read by
`python -m sacglam_core.train --config run.yaml`, nests the keys by section, so that

```yaml
algorithm: sac
model: {{name_or_path: google/flan-t5-base, lora: {{}}, load_in_4bit: true}}
sac: {{critic: {{tau: 0.05}}}}
```

sets `algorithm`, `model.name_or_path`, `model.lora` (with its defaults), `model.load_in_4bit` and
`sac.critic.tau`, and leaves every other key at its default. The experiments in `workflow/config/experiments.yaml`
use the same keys, nested the same way in `defaults`, in an experiment's `settings` and in its `variants`, and as
dotted paths in a `grid` (`sac.critic.input: [obs_action, obs]`). Unknown keys, wrong types, values outside the
constraints and incoherent combinations fail at start, in one error that names every problem.

**Two sets of defaults.** The column `default` is a bare run configuration's (a CPU, no LoRA, no 4-bit: what a
quick run of a tiny model wants). The experiments start from experiments.yaml's `defaults` block instead, the
paper's setting: `google/flan-t5-base`, `model.device: auto`, `model.dtype: auto`, LoRA r 16 and alpha 32,
4-bit weights, 400,000 steps; an experiment's `settings` and `variants` change those.

Columns: **type**, with its constraints; **default**, the value when the key is left out; **paper**, the setting
of the paper's runs (`sacglam_core.reports.tables.paper_config`): Tables 1-3 and Appendix C (Flan-T5-base with
LoRA and 4-bit weights; SAC-GLAM+HER's `sac.alpha_init` 0.05 and `sac.target_entropy` 0.01) and, where the paper
is silent, the first author's code or this project's documented choice. It is given per variant where PPO-GLAM,
SAC-GLAM and SAC-GLAM+HER differ, and is – for keys that are not hyperparameters (where and how a run executes,
its seed, its checkpoints).
"""


@dataclasses.dataclass(frozen=True)
class Section:
    """One settings class at a dotted path ("" for the top level) and its keys (a required or always-present
    section is no key; an optional one, such as `model.lora`, is a key and a section)."""

    path: str
    cls: type
    keys: list[tuple[str, FieldInfo]]


def _section_class(annotation) -> type | None:
    """The settings class that a field's annotation holds (alone or or-None), if any."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


def sections(cls: type = RunConfig, path: str = "") -> list[Section]:
    """The sections of `cls`, depth first in the order of the fields."""
    fields: dict[str, FieldInfo] = cls.__pydantic_fields__
    keys, inner = [], []
    for name, info in fields.items():
        dotted = f"{path}.{name}" if path else name
        section = _section_class(info.annotation)
        if section is None or type(None) in get_args(info.annotation):
            keys.append((dotted, info))
        if section is not None:
            inner += sections(section, dotted)
    return [Section(path, cls, keys), *inner]


def keys() -> dict[str, FieldInfo]:
    """Every key of a run configuration by dotted path."""
    return {dotted: info for section in sections() for dotted, info in section.keys}


def _constraints(metadata) -> list[str]:
    bounds = []
    for item in metadata:
        if isinstance(item, FieldInfo):
            bounds += _constraints(item.metadata)
        elif type(item) in BOUNDS:
            bounds.append(f"{BOUNDS[type(item)]} {getattr(item, type(item).__name__.lower())}")
    return bounds


def type_text(annotation, metadata=()) -> str:
    """A type in words: `int > 0`, `one of `a`, `b``, `float or `null``..."""
    bounds = ", ".join(_constraints(metadata))
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        text = type_text(args[0], args[1:])
    elif origin is Literal:
        text = ("one of " if len(args) > 1 else "") + ", ".join(f"`{value}`" for value in args)
    elif origin in (Union, types.UnionType):
        text = " or ".join(type_text(arg) for arg in args)
    elif annotation is type(None):
        text = "`null`"
    elif origin is tuple:
        text = f"list of {type_text(args[0])}"
    elif _section_class(annotation) is not None:
        text = "section"
    else:
        text = annotation.__name__
    return f"{text} {bounds}" if bounds else text


def yaml_text(value) -> str:
    """A value as it is written in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple | list):
        return "[" + ", ".join(map(yaml_text, value)) + "]"
    if dataclasses.is_dataclass(value):
        changed = {k: v for k, v in dataclasses.asdict(value).items() if v != getattr(type(value)(), k)}
        return "{" + ", ".join(f"{k}: {yaml_text(v)}" for k, v in changed.items()) + "}"
    return str(value)


def default_text(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    return f"`{yaml_text(info.get_default(call_default_factory=True))}`"


def _only(dotted: str) -> str | None:
    """The algorithm that alone reads a key (or a section's keys), if one does."""
    return next((algorithm for prefix, algorithm in ONLY.items() if dotted.startswith(prefix)), None)


def _value(config: RunConfig, dotted: str):
    value = config
    for name in dotted.split("."):
        value = getattr(value, name, None)
    return value


def paper_text(dotted: str) -> str:
    """The paper's value, one per group of variants that share it (those of the algorithm that reads the key)."""
    if dotted.startswith(NOT_COMPARED):
        return "–"
    only = _only(dotted)
    groups: dict[str, list[str]] = {}
    for kind, variant in VARIANTS.items():
        if only is None or paper_config(kind).algorithm == only:
            groups.setdefault(yaml_text(_value(paper_config(kind), dotted)), []).append(variant)
    if len(groups) == 1:
        return f"`{next(iter(groups))}`"
    return "; ".join(f"`{value}` ({', '.join(variants)})" for value, variants in groups.items())


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def table(section: Section) -> str:
    """A section's heading, its class docstring and its keys' table."""
    heading = f"`{section.path}`" if section.path else "Top level"
    lines = [f"## {heading}", "", inspect.cleandoc(section.cls.__doc__ or ""), ""]
    only = _only(section.path + ".")
    if only:
        lines += [f"Read by {ALGORITHMS[only]} runs only (`algorithm: {only}`).", ""]
    lines += ["| key | type | default | paper | description |", "|---|---|---|---|---|"]
    for dotted, info in section.keys:
        description = _cell(info.description or "")
        if _only(dotted) and not only:
            description = f"{ALGORITHMS[_only(dotted)]} only. {description}"
        cells = [f"`{dotted}`", type_text(info.annotation, info.metadata), default_text(info), paper_text(dotted)]
        lines.append("| " + " | ".join([*map(_cell, cells), description]) + " |")
    return "\n".join(lines) + "\n"


def markdown() -> str:
    """The whole reference, as docs/configuration.md holds it."""
    return "\n".join([INTRO, *map(table, sections())])


if __name__ == "__main__":
    print(markdown(), end="")

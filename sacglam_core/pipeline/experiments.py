"""Experiment definitions (configuration, not code) expanded into training runs.

`workflow/config/experiments.yaml` holds `defaults` (settings of every run) and `experiments` (the studies' are in
`workflow/config/studies.yaml`, which takes the same defaults), each with
`seeds`, shared `settings`, and its variants: named `variants`, a `grid` of dotted keys to lists of
values (the cartesian product), or both. A run's settings are defaults <- experiment settings <- variant,
then its seed. Its directory is `<results>/<experiment>/<variant>-<hash>/seed<k>`, the hash taken over
the run's settings, so that a changed variant gets a new directory and a re-run finds finished runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from sacglam_core.config import ConfigError, RunConfig, parse_config
from sacglam_core.envs.goals import GoalType
from sacglam_core.pipeline import yamlfile

EXPERIMENT_KEYS = {"claims", "figures", "seeds", "settings", "variants", "grid"}
FIGURE_KEYS = {"panels", "x", "y", "kind"}
FIGURE_KINDS = {"curves", "goals"}  # success (or `y`) curves; the goal samplers' figure
FIGURE_AXES = {"env_steps", "train_hours", "wall_hours"}


class ExperimentError(ValueError):
    """An experiment definition that cannot be expanded (unknown experiment, bad settings...)."""


@dataclass(frozen=True)
class Run:
    experiment: str
    variant: str  # label used in figures and tables
    seed: int
    directory: Path
    settings: dict  # the full run configuration (with output_dir)

    @cached_property
    def config(self) -> RunConfig:
        return parse_config(self.settings, source=str(self.directory / "run.yaml"))


def merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _dotted(key: str, value) -> dict:
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+=_-]+", "_", label).strip("_")


def settings_hash(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _variants(name: str, spec: dict) -> dict[str, dict]:
    variants = dict(spec.get("variants") or {})
    grid = spec.get("grid") or {}
    if grid:
        keys = list(grid)
        for values in itertools.product(*(grid[k] for k in keys)):
            label = " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(keys, values))
            settings: dict = {}
            for k, v in zip(keys, values):
                settings = merge(settings, _dotted(k, v))
            if label in variants:
                raise ExperimentError(f"experiment {name!r}: the grid's variant {label!r} is also a named variant")
            variants[label] = settings
    if not variants:
        raise ExperimentError(f"experiment {name!r} defines no variants (give `variants:` or `grid:`)")
    return variants


DEFINITION_FILES = ("workflow/config/experiments.yaml", "workflow/config/studies.yaml")
TOP_KEYS = {"defaults", "experiments", "shared"}  # `shared`: YAML anchors that no experiment owns


def load_definitions(path: str | Path, *more: str | Path) -> dict:
    """The definitions in `path`, with the experiments of `more` files added (they take `path`'s defaults), read
    strictly: a duplicate variant, key or experiment name is an error, not an overwrite."""
    definitions: dict = {"defaults": {}, "experiments": {}}
    where: dict[str, Path] = {}
    for i, file in enumerate([path, *more]):
        try:
            content = yamlfile.load(file, "experiment definitions")
        except yamlfile.YamlFileError as error:
            raise ExperimentError(str(error)) from None
        allowed = TOP_KEYS if i == 0 else TOP_KEYS - {"defaults"}
        stray = sorted(set(content) - allowed)
        if stray:
            raise ExperimentError(f"{file}: unknown top-level keys {stray}; allowed: {sorted(allowed)}")
        if not isinstance(content.get("experiments"), dict):
            raise ExperimentError(f"{file} must hold an `experiments:` mapping")
        for name, spec in content["experiments"].items():
            if name in where:
                raise ExperimentError(f"{file}: experiment {name!r} is already defined in {where[name]}")
            if isinstance(spec, dict):
                seeds_of(name, spec, where=f"{file}: ")
            where[name] = Path(file)
            definitions["experiments"][name] = spec
        if i == 0:
            definitions["defaults"] = content.get("defaults") or {}
    return definitions


def seeds_of(name: str, spec: dict, where: str = "") -> list[int]:
    """The experiment's seeds: a list of distinct non-negative integers (default [0]). A seed is part of its run's
    directory name (`seed<k>`), so `"007"` or `true` would name a directory no other spelling finds again."""
    seeds = spec.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds:
        raise ExperimentError(f"{where}experiment {name!r}: seeds must be a non-empty list of integers, got {seeds!r}")
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ExperimentError(f"{where}experiment {name!r}: seed {seed!r} is not a non-negative integer")
    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if repeated:
        raise ExperimentError(f"{where}experiment {name!r}: seeds {seeds} repeat {repeated}")
    return seeds


def check_figures(name: str, spec: dict, variants: list[str]) -> None:
    """The experiment's `figures:` name only known keys, axes and variants (before any training)."""
    figures = spec.get("figures") or {}
    if not isinstance(figures, dict):
        raise ExperimentError(f"experiment {name!r}: `figures` must map figure names to their layout")
    for stem, layout in figures.items():
        where = f"experiment {name!r}, figure {stem!r}"
        layout = layout or {}
        stray = set(layout) - FIGURE_KEYS
        if stray:
            raise ExperimentError(f"{where}: unknown keys {sorted(stray)}; allowed: {sorted(FIGURE_KEYS)}")
        if layout.get("kind", "curves") not in FIGURE_KINDS:
            raise ExperimentError(f"{where}: unknown kind {layout['kind']!r}; allowed: {sorted(FIGURE_KINDS)}")
        axes = set(layout.get("x", ["env_steps"])) - FIGURE_AXES
        if axes:
            raise ExperimentError(f"{where}: unknown x axes {sorted(axes)}; allowed: {sorted(FIGURE_AXES)}")
        for panel, members in (layout.get("panels") or {}).items():
            unknown = [v for v in members or [] if v not in variants]
            if unknown:
                raise ExperimentError(
                    f"{where}, panel {panel!r}: unknown variants {unknown}; the experiment's variants: {variants}"
                )


# -- claims ------------------------------------------------------------------------------------------------
# An experiment's `claims:`, checked by `python -m sacglam_core.reports.claims <experiment>`:
#   learns: [PPO-GLAM, SAC-GLAM]  # final success above the random policy's by `margin` (default 0.15)
#   better: [{x: SAC-GLAM, y: PPO-GLAM, at_least: 0.6}]  # P(x's AUC > y's) over seed pairs >= at_least; with
#     goal_type: grow, the AUC of that goal type's success
#   time: [{x: SAC-GLAM+HER, y: PPO-GLAM, at_most: 2.0}]  # x's mean training time / y's <= at_most
# Read with the definitions, so a misspelt variant or threshold fails before any training.
CLAIM_KEYS = {"learns", "margin", "learns_at_least", "better", "time"}


@dataclass(frozen=True)
class Better:
    x: str
    y: str
    at_least: float
    goal_type: str | None = None  # the AUC of this goal type's success; None: of all goals


@dataclass(frozen=True)
class TimeRatio:
    x: str
    y: str
    at_most: float


@dataclass(frozen=True)
class Claims:
    learns: tuple[str, ...] = ()
    margin: float = 0.15
    learns_at_least: float = 0.8  # the share of seeds that must gain `margin` over their own start (and over random)
    better: tuple[Better, ...] = ()
    time: tuple[TimeRatio, ...] = ()


def _pairs(where: str, raw, threshold: str, low: float, high: float, optional: tuple[str, ...] = ()) -> list[dict]:
    if not isinstance(raw, list):
        raise ExperimentError(f"{where} must be a list of {{x, y, {threshold}}} mappings")
    pairs = []
    for entry in raw:
        required = {"x", "y", threshold}
        if not isinstance(entry, dict) or not required <= set(entry) <= required | set(optional):
            also = f" (optional: {', '.join(optional)})" if optional else ""
            keys = f"x, y and {threshold}{also}"
            raise ExperimentError(f"{where}: each entry needs exactly the keys {keys}, got {entry!r}")
        value = entry[threshold]
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise ExperimentError(f"{where}: {threshold} must be a number in [{low}, {high}], got {value!r}")
        pairs.append({**entry, "x": str(entry["x"]), "y": str(entry["y"]), threshold: float(value)})
    return pairs


def parse_claims(experiment: str, raw, variants: list[str]) -> Claims:
    """The experiment's claims, validated against its variants; no claims is an empty `Claims`."""
    where = f"experiment {experiment!r}, claims"
    if raw is None:
        return Claims()
    if not isinstance(raw, dict):
        raise ExperimentError(f"{where} must be a mapping with keys {sorted(CLAIM_KEYS)}")
    stray = set(raw) - CLAIM_KEYS
    if stray:
        raise ExperimentError(f"{where}: unknown keys {sorted(stray)}; allowed: {sorted(CLAIM_KEYS)}")
    learns = raw.get("learns") or []
    if not isinstance(learns, list):
        raise ExperimentError(f"{where}: learns must be a list of variants")
    margin, share = raw.get("margin", 0.15), raw.get("learns_at_least", 0.8)
    for key, value in (("margin", margin), ("learns_at_least", share)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise ExperimentError(f"{where}: {key} must be a number in [0, 1], got {value!r}")
    better_pairs = _pairs(f"{where}, better", raw.get("better") or [], "at_least", 0.0, 1.0, ("goal_type",))
    better = [Better(**p) for p in better_pairs]
    for claim in better:
        if claim.goal_type is not None and claim.goal_type not in set(GoalType):
            types = [t.value for t in GoalType]
            raise ExperimentError(f"{where}, better: goal_type {claim.goal_type!r} is not one of {types}")
    time = [TimeRatio(**p) for p in _pairs(f"{where}, time", raw.get("time") or [], "at_most", 0.0, 1e6)]
    named = [*learns, *(c.x for c in [*better, *time]), *(c.y for c in [*better, *time])]
    unknown = sorted({str(v) for v in named if v not in variants})
    if unknown:
        raise ExperimentError(f"{where} name unknown variants {unknown}; the experiment's variants: {variants}")
    return Claims(tuple(map(str, learns)), float(margin), float(share), tuple(better), tuple(time))


def expand(
    definitions: dict, names: list[str], results: str | Path, substitutions: dict[str, str] | None = None
) -> list[Run]:
    """Every run of the named experiments, validated as run configurations."""
    experiments = definitions["experiments"]
    unknown = [n for n in names if n not in experiments]
    if unknown:
        raise ExperimentError(f"unknown experiment(s) {unknown}; defined: {sorted(experiments)}")
    runs = []
    for name in names:
        spec = experiments[name]
        stray = set(spec) - EXPERIMENT_KEYS
        if stray:
            raise ExperimentError(
                f"experiment {name!r} has unknown keys {sorted(stray)}; allowed: {sorted(EXPERIMENT_KEYS)}"
            )
        base = merge(definitions.get("defaults") or {}, spec.get("settings") or {})
        seeds = seeds_of(name, spec)
        variants = _variants(name, spec)
        check_figures(name, spec, list(variants))
        parse_claims(name, spec.get("claims"), list(variants))
        for label, variant in variants.items():
            settings = _substitute(merge(base, variant), substitutions or {})
            directory = Path(results) / name / f"{_slug(label)}-{settings_hash(settings)}"
            for seed in seeds:
                run_dir = directory / f"seed{seed}"
                full = merge(settings, {"seed": seed, "output_dir": str(run_dir)})
                try:
                    parse_config(full, source=f"experiment {name!r}, variant {label!r}")
                except ConfigError as error:
                    raise ExperimentError(str(error)) from None
                runs.append(Run(name, label, seed, run_dir, full))
    directories = [run.directory for run in runs]
    clashes = sorted({str(d) for d in directories if directories.count(d) > 1})
    if clashes:
        raise ExperimentError(f"two runs would share the directory {clashes[0]}: their variants' names clash")
    return runs


def _substitute(value, substitutions: dict[str, str]):
    """Fill `{models}`-style placeholders in string settings."""
    if isinstance(value, dict):
        return {k: _substitute(v, substitutions) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, substitutions) for v in value]
    if isinstance(value, str) and "{" in value:
        return value.format(**substitutions)
    return value

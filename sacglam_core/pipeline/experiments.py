"""Experiment definitions (configuration, not code) expanded into training runs.

`workflow/config/experiments.yaml` holds `defaults` (settings of every run) and `experiments`, each with
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
from pathlib import Path

import yaml

from sacglam_core.config import ConfigError, RunConfig, parse_config

EXPERIMENT_KEYS = {"claims", "figures", "seeds", "settings", "variants", "grid"}


class ExperimentError(ValueError):
    """An experiment definition that cannot be expanded (unknown experiment, bad settings...)."""


@dataclass(frozen=True)
class Run:
    experiment: str
    variant: str  # label used in figures and tables
    seed: int
    directory: Path
    settings: dict  # the full run configuration (with output_dir)

    @property
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
            variants[label] = settings
    if not variants:
        raise ExperimentError(f"experiment {name!r} defines no variants (give `variants:` or `grid:`)")
    return variants


def load_definitions(path: str | Path) -> dict:
    path = Path(path)
    try:
        definitions = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ExperimentError(f"cannot read experiment definitions {path}: {error}") from error
    if not isinstance(definitions, dict) or not isinstance(definitions.get("experiments"), dict):
        raise ExperimentError(f"{path} must hold an `experiments:` mapping")
    return definitions


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
        seeds = spec.get("seeds") or [0]
        for label, variant in _variants(name, spec).items():
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

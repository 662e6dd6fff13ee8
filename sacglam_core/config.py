"""The run configuration: one YAML file per training run. Defaults are the paper's Tables 1-3.

    python -m sacglam_core.train --config run.yaml

Unknown keys, wrong types and incoherent combinations fail at start with one `ConfigError`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, field
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import Field, ValidationError, field_validator

from sacglam_core.envs.playground import EnvConfig
from sacglam_core.settings import settings


class ConfigError(ValueError):
    """A run configuration that cannot be used; the message names the file and every problem."""


Positive = Annotated[int, Field(gt=0)]
NonNegative = Annotated[int, Field(ge=0)]
Rate = Annotated[float, Field(gt=0)]  # learning rates, coefficients that must be positive
Fraction = Annotated[float, Field(ge=0, le=1)]  # discounts, lambdas, probabilities
DEVICE = re.compile(r"cpu|cuda|cuda:\d+|auto")


@settings
class LoraSettings:
    """LoRA through peft. The defaults are the first author's (MAGELLAN, magellan/initializer.py: r=16,
    alpha=32, no dropout, T5's attention query and value projections `q` and `v`). `target_modules=None`
    takes peft's default for the architecture, which is exactly that (`q`, `v` for T5; `q_proj`,
    `v_proj` for Llama, Mistral, Qwen, OPT...); `"all-linear"` adapts every linear layer but the output
    head; or name the modules.
    """

    r: Positive = 16
    alpha: Positive = 32
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    target_modules: tuple[str, ...] | str | None = None


@settings
class ModelConfig:
    """Which LLM to load and how.

    `name_or_path` is a hub id (`google/flan-t5-base`) or a local folder. `architecture="auto"` reads it
    from the model's config. `dtype="auto"` computes in bf16 on GPUs that support it natively (compute
    capability 8.0 and later), in fp16 on older GPUs such as the V100 when LoRA is on (the adapters and
    heads that train stay fp32 and the losses go through a GradScaler), and in fp32 otherwise (CPU, or an
    old GPU without LoRA, whose trained weights would be fp16). `load_in_4bit` quantizes to nf4 with
    double quantization, computing in that dtype (QLoRA), and then needs LoRA, since 4-bit weights cannot
    be trained.
    """

    name_or_path: str
    architecture: Literal["auto", "seq2seq", "causal"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = "cpu"
    lora: LoraSettings | None = None
    load_in_4bit: bool = False
    cache_dir: str | None = None

    @property
    def is_local_path(self) -> bool:
        """A folder (existing or to be built), as opposed to a Hugging Face hub id (`org/name`)."""
        name = self.name_or_path
        return name.startswith((".", "/", "~")) or name.count("/") > 1 or Path(name).exists()

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        if not DEVICE.fullmatch(device):
            raise ValueError(f"must be cpu, cuda, cuda:<n> or auto, got {device!r}")
        return device

    def __post_init__(self) -> None:
        if self.load_in_4bit and self.lora is None:
            raise ValueError("model.load_in_4bit needs model.lora: 4-bit weights can only be trained through adapters")
        if self.dtype == "float16" and self.lora is None:
            raise ValueError(
                "model.dtype=float16 needs model.lora: fp16 training keeps the trained adapters in fp32 under a "
                "gradient scaler; without LoRA the weights themselves would train in fp16 (use float32 or bfloat16)"
            )


@settings
class CriticConfig:
    input: Literal["obs_action", "obs", "decoded_action"] = "obs_action"
    weights: Literal["shared", "shared_frozen", "separate"] = "shared"
    hidden_units: Positive = 1024
    hidden_layers: NonNegative = 2
    tau: float = 0.005
    target_lm: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"critic.tau must be in (0, 1], got {self.tau}")


@settings
class SACConfig:
    """Discrete SAC (paper Table 2).

    Warm-up (paper section 2.2): only the critic learns until all three counts are reached. The default is
    the first author's (MAGELLAN, magellan/main.py: `update_policy = warmup_updates < nb_updates`, where
    nb_updates counts update cycles from 0 and its configs set warmup_updates: 10): the first 11 update
    cycles, counted from the first cycle, the one when every rank's buffer first holds a batch.
    `warmup_updates` counts gradient updates and `warmup_steps` environment steps instead.

    `buffer_size` is the run's whole replay capacity: with data parallelism each rank holds its share of
    the transitions (its own environments'), buffer_size // world, the first buffer_size % world ranks one
    more, so that the ranks together hold exactly buffer_size.
    """

    buffer_size: Positive = 100_000
    update_every: Positive = 32  # environment steps between update cycles
    updates_per_cycle: Positive = 2
    batch_size: Positive = 256
    warmup_cycles: NonNegative = 11  # critic-only update cycles at the start (MAGELLAN's warm-up)
    warmup_updates: NonNegative = 0
    warmup_steps: NonNegative = 0
    learning_starts: NonNegative = 0  # environment steps before the first update (and the buffer must hold a batch)
    actor_lr: Rate = 1e-4
    # The actor's learning rate rises linearly from actor_lr / N to actor_lr over its first N updates after the
    # warm-up (0: no ramp, the paper's), so that the policy does not follow a young critic at full speed.
    actor_lr_ramp_updates: NonNegative = 0
    # The actor's loss: "reverse_kl", the paper's E_pi[alpha log pi - Q], or "forward_kl", the cross-entropy from
    # softmax(Q / alpha) to pi (MPO's weighted maximum likelihood). Both are minimised by that Boltzmann policy;
    # the reverse one's gradient vanishes where pi is near one-hot, the forward one's does not.
    actor_loss: Literal["reverse_kl", "forward_kl"] = "reverse_kl"
    critic_lr: Rate = 1e-4
    gamma: Fraction = 0.99
    n_step: Positive = 3
    autotune_alpha: bool = True
    alpha_init: Rate = 0.005
    target_entropy: float = 0.0
    alpha_lr: Rate = 2e-3
    max_grad_norm: Rate | None = None
    critic: CriticConfig = field(default_factory=CriticConfig)


@settings
class PPOConfig:
    """PPO-GLAM (paper Table 1) and its hindsight variants (Appendix G).

    Where the table is silent, GLAM's PPO updater (experiments/train_language_agent.py of
    flowersteam/Grounding_LLMs_with_online_RL): the clipped value loss around the rollout's values with the
    policy's clip radius, weighed by value_coef itself, and advantages used as GAE gives them.
    """

    rollout_steps: Positive = 2048  # transitions collected between updates, all environments together
    epochs: Positive = 16
    minibatch_size: Positive = 256
    lr: Rate = 1e-4
    gamma: Fraction = 0.99
    gae_lambda: Fraction = 0.99
    clip: Rate = 0.2
    entropy_coef: Annotated[float, Field(ge=0)] = 0.01
    value_coef: Annotated[float, Field(ge=0)] = 0.5
    max_grad_norm: Rate = 0.5
    value_loss: Literal["clipped", "mse"] = "clipped"  # see algos/ppo.py
    normalize_advantages: bool = False  # standardise each minibatch's advantages (GLAM does not)
    loss: Literal["clip", "kl"] = "clip"
    kl_coef: Annotated[float, Field(ge=0)] = 0.1  # beta of the KL-penalised loss
    center_clip: bool = False  # clip around the first-epoch ratio of relabelled data, not 1


@settings
class HERConfig:
    """Hindsight relabelling with the social partner's goals (future strategy, paper section 2.3).

    For SAC, `strategy` picks how batches mix relabelled and environment transitions (Appendix E); it and
    `ratio` default to the paper's "ratio" at 50%. For PPO, relabelled trajectories join the rollout and
    `aligned_only` keeps only goals aligned with the original (Appendix G).
    """

    enabled: bool = False
    strategy: Literal["uniform", "ratio", "prior", "prior_ratio"] | None = None
    ratio: Fraction | None = None
    aligned_only: bool = False

    @property
    def sampling(self) -> str:
        return self.strategy or "ratio"

    @property
    def her_fraction(self) -> float:
        return 0.5 if self.ratio is None else self.ratio


@settings
class EvalConfig:
    every_steps: Positive = 10_000
    episodes_per_type: Positive = 32  # train goals, stratified by goal type
    test_episodes: NonNegative = 64
    greedy: bool = False  # sample from the policy (as it acts) or take its most probable action
    seed: int = 12345


@settings
class CheckpointConfig:
    every_updates: Positive = 200
    keep: Positive = 2


@settings
class RunConfig:
    algorithm: Literal["sac", "ppo"]
    model: ModelConfig
    output_dir: str = "."
    seed: NonNegative = 0
    total_steps: Positive = 400_000
    num_envs: Positive = 32
    env: EnvConfig = field(default_factory=EnvConfig)
    sac: SACConfig = field(default_factory=SACConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    her: HERConfig = field(default_factory=HERConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    threads: Positive | None = None  # torch CPU threads (None: torch's default)

    def __post_init__(self) -> None:
        problems = coherence_problems(self)
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def fingerprint(self) -> str:
        """A hash of everything that changes results (not where they are written). A setting added after runs
        existed counts only when it differs from its default, so that adding it never re-runs a finished run."""
        settings_ = {k: v for k, v in asdict(self).items() if k not in ("output_dir", "threads")}
        for (section, key), default in ADDED_LATER.items():
            if settings_[section][key] == default:
                del settings_[section][key]
        return hashlib.sha256(json.dumps(settings_, sort_keys=True, default=str).encode()).hexdigest()[:16]


# Settings added after runs were made with this code, with the default that reproduces those runs.
ADDED_LATER: dict[tuple[str, str], object] = {
    ("sac", "actor_lr_ramp_updates"): 0,
    ("sac", "actor_loss"): "reverse_kl",
}


def coherence_problems(config: RunConfig) -> list[str]:
    problems = []
    her, sac, ppo = config.her, config.sac, config.ppo
    if config.algorithm == "ppo":
        if her.strategy is not None or her.ratio is not None:
            problems.append("her.strategy and her.ratio shape SAC's replay batches; PPO has no replay buffer")
        if not her.enabled and her.aligned_only:
            problems.append("her.aligned_only needs her.enabled")
        if ppo.center_clip and not (her.enabled and ppo.loss == "clip"):
            problems.append(
                "ppo.center_clip needs her.enabled and ppo.loss: clip (it re-centres the clip of relabelled data)"
            )
        if ppo.rollout_steps % config.num_envs:
            problems.append(f"ppo.rollout_steps={ppo.rollout_steps} must be a multiple of num_envs={config.num_envs}")
    else:
        if not her.enabled and (her.strategy is not None or her.ratio is not None):
            problems.append("her.strategy/her.ratio are set but her.enabled is false")
        if her.aligned_only:
            problems.append("her.aligned_only is a PPO variant (Appendix G); SAC relabels with every reported goal")
        if sac.update_every % config.num_envs:
            problems.append(f"sac.update_every={sac.update_every} must be a multiple of num_envs={config.num_envs}")
        if sac.buffer_size < sac.batch_size:
            problems.append(f"sac.buffer_size={sac.buffer_size} is smaller than sac.batch_size={sac.batch_size}")
    return problems


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        lines: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` may be overridden key by key
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, str | int | float | bool) and key in lines:
                raise yaml.MarkedYAMLError(problem=f"key {key!r} appears twice (lines {lines[key]} and {line})")
            lines[key] = line
        return super().construct_mapping(node, deep)


def _yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's multi-line message in one line: what is wrong and where."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem:
        mark = error.problem_mark
        return f"{error.problem} (line {mark.line + 1}, column {mark.column + 1})" if mark else error.problem
    return " ".join(str(error).split())


def load_config(path: str | Path, overrides: dict | None = None) -> RunConfig:
    """Read and validate a YAML run configuration; `overrides` are merged over it (nested dicts)."""
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except OSError as error:
        raise ConfigError(f"cannot read run configuration {path}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"run configuration {path} is not a UTF-8 text file (byte {error.object[error.start]:#04x} at offset "
            f"{error.start}); it must be YAML"
        ) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"run configuration {path} is not valid YAML: {_yaml_problem(error)}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"run configuration {path} must be a mapping of settings, got a YAML {type(raw).__name__}")
    return parse_config(_merge(raw, overrides or {}), source=str(path))


def _problem(error: dict) -> str:
    """One pydantic error as `key.path: what is wrong (got value)`."""
    where = ".".join(map(str, error["loc"]))
    message = error["msg"].removeprefix("Value error, ")
    if not where:  # a problem of the whole configuration (coherence), its message names the keys
        return message
    if error["type"] in ("missing", "value_error") or isinstance(error["input"], dict):
        return f"{where}: {message}"
    return f"{where}: {message} (got {error['input']!r})"


def parse_config(raw: dict, source: str = "<dict>") -> RunConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"run configuration {source} must be a mapping of settings, got {type(raw).__name__}")
    try:
        return RunConfig(**raw)
    except ValidationError as error:
        raise ConfigError(f"invalid run configuration {source}: " + "; ".join(map(_problem, error.errors()))) from None
    except TypeError as error:
        raise ConfigError(f"invalid run configuration {source}: {error}") from None


def dump_config(config: RunConfig) -> str:
    return yaml.safe_dump(json.loads(json.dumps(asdict(config), default=list)), sort_keys=False)


def _merge(base: dict, overrides: dict) -> dict:
    merged = dict(base)
    for key, value in overrides.items():
        merged[key] = (
            _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
        )
    return merged

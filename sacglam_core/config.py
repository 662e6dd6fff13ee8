"""The run configuration: one YAML file per training run. Defaults are the paper's Tables 1-3.

    python -m sacglam_core.train --config run.yaml

Unknown keys, wrong types and incoherent combinations fail at start with one `ConfigError`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, field, fields
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
    """Rank of the adapters' low-rank matrices."""
    alpha: Positive = 32
    """LoRA's scaling numerator: the adapters' output is scaled by alpha / r."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Dropout probability on the adapters' inputs."""
    target_modules: tuple[str, ...] | str | None = None
    """Modules that get adapters: null for peft's default for the architecture (`q`, `v` for T5), `all-linear`,
    or a list of module names."""


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
    """A Hugging Face hub id (`google/flan-t5-base`) or a local model folder."""
    architecture: Literal["auto", "seq2seq", "causal"] = "auto"
    """Encoder-decoder (`seq2seq`) or decoder-only (`causal`); `auto` reads it from the model's config."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Compute dtype of the LLM. `auto`: bfloat16 on GPUs of compute capability 8.0 and later, float16 on older
    GPUs with LoRA, float32 otherwise (CPU, or an older GPU without LoRA). `float16` needs `model.lora`."""
    device: str = "cpu"
    """`cpu`, `cuda`, `cuda:<n>` or `auto` (cuda when a GPU is available). Under torchrun, `cuda` is each
    process's own GPU."""
    lora: LoraSettings | None = None
    """LoRA adapters (the `model.lora` section; `lora: {}` takes its defaults), or null to train every weight of
    the LLM."""
    load_in_4bit: bool = False
    """Quantize the LLM's weights to 4-bit nf4 with double quantization (QLoRA); needs `model.lora`."""
    dequantize_4bit: bool = False
    """With `load_in_4bit`, dequantize the 4-bit weights once, at load, into the compute dtype: the same values as
    4-bit (the paper's quantised weights), multiplied without bitsandbytes' dequantization at every pass (8.6% of an
    H200 update's kernel time, its 4-bit products 3.0%: docs/benchmarks.md), in about 3.9x their memory (Flan-T5-base's
    160M quantized weights: 0.32 GB in bfloat16 against 0.08 GB). The same weights, so it leaves the fingerprint
    alone; acting's fused 4-bit product rounds differently from a dense one."""
    cache_dir: str | None = None
    """Hugging Face cache folder to load from; null: the hub's default (`HF_HUB_CACHE` or `HF_HOME`)."""
    compile: bool | Literal["auto"] = "auto"
    """`torch.compile` each transformer block of the LLM (regional compilation, static shapes): fused kernels, at the
    cost of compiling each block's kinds and shapes at the start of a process (cached where `TORCHINDUCTOR_CACHE_DIR`
    points); fused kernels round differently, so results agree with the eager model's within float tolerance.
    `auto`: on where passes are captured on a GPU (faster there: docs/benchmarks.md), off on a CPU; `auto` and
    `false` make the same fingerprint (`true`, from when compiling was opt-in, another)."""

    capture: bool = True
    """On a GPU, replay each kind of pass and update from a captured CUDA graph (agent/static.py): the same kernels
    on the same numbers, launched with one call instead of tens of thousands (float16's loss scaler included: it
    decides on the device). No effect on a CPU."""
    static_shapes: bool | Literal["auto"] = "auto"
    """Batches in a few fixed shapes (agent/batch.py), padded and masked: what captured graphs and compiled blocks
    replay. `auto`: on a GPU; a CPU runs each batch at its own shapes (7% faster). The same mathematics either way,
    so it leaves the fingerprint alone."""
    tf32: bool = True
    """On a GPU, float32 matrix products (the adapters, heads and float32 runs) run on TF32 tensor cores: several times
    faster, with a 10-bit mantissa on the inputs. `false`: full float32, for comparisons that rounding must not blur
    (node_check's layouts). It changes rounding alone, as compiled kernels do, so it leaves the fingerprint alone."""
    check_host_reads: bool = False
    """Fail a run whose device-only functions (what a GPU captures) read a tensor's value on the host: their first
    calls run under `torch.cuda.set_sync_debug_mode("error")` on a GPU, a dispatch check on a CPU (agent/static.py).
    On in the tests and in the `gpu_smoke` run (not on a CPU with `compile`: torch.compile cannot trace under the
    CPU's check); it changes no result, so it leaves the fingerprint alone."""

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
        if self.dequantize_4bit and not self.load_in_4bit:
            raise ValueError("model.dequantize_4bit needs model.load_in_4bit: it dequantizes the 4-bit weights")
        if self.dtype == "float16" and self.lora is None:
            raise ValueError(
                "model.dtype=float16 needs model.lora: fp16 training keeps the trained adapters in fp32 under a "
                "gradient scaler; without LoRA the weights themselves would train in fp16 (use float32 or bfloat16)"
            )

    def compute_dtype(self, capability: tuple[int, int] | None) -> str:
        """The dtype on a GPU of this compute capability (None: a CPU): `dtype`, or for `auto` float32 on a CPU, bf16
        where it is native (sm_80 and later), else fp16 when the trained weights are fp32 LoRA adapters
        (loss-scaled), else fp32."""
        if self.dtype != "auto":
            return self.dtype
        if capability is None:
            return "float32"
        if tuple(capability) >= (8, 0):
            return "bfloat16"
        return "float16" if self.lora is not None else "float32"


@settings
class CriticConfig:
    """SAC's critic (paper Appendix B): an MLP head on the LLM's hidden states (see agent/critic.py), and its
    target, a Polyak average updated after every gradient update.
    """

    input: Literal["obs_action", "obs", "decoded_action"] = "obs_action"
    """What the MLP reads: `obs_action`, the LLM's last hidden state over prompt + action, one pass per candidate,
    one Q-value (the paper's); `obs`, the prompt's hidden state, one output per action of the vocabulary;
    `decoded_action`, the prompt encoded once and each action decoded, read at the action's last token."""
    weights: Literal["shared", "shared_frozen", "separate"] = "shared"
    """The LLM weights the critic reads: the actor's, trained by the critic's loss too (`shared`); the actor's,
    with gradients stopping at the MLP (`shared_frozen`); or a copy of its own (`separate`, a second adapter
    with LoRA)."""
    hidden_units: Positive = 1024
    """Units of each hidden layer of the MLP head (ReLU)."""
    hidden_layers: NonNegative = 2
    """Hidden layers of the MLP head (0: a linear head)."""
    tau: Annotated[float, Field(gt=0, le=1)] = 0.005
    """Polyak coefficient of the target critic, applied after every gradient update: target += tau * (online -
    target)."""
    target_lm: bool = True
    """The target critic reads a Polyak-averaged copy of the LLM weights the critic reads (an adapter with LoRA);
    false: only the MLP head has a target, over the online LLM weights."""


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
    """Replay capacity of the whole run in n-step transitions, shared out among data-parallel ranks; the oldest
    are overwritten. At least `sac.batch_size`."""
    update_every: Positive = 32
    """Environment steps (all environments together) between update cycles; a multiple of `num_envs`."""
    updates_per_cycle: Positive = 2
    """Gradient updates per update cycle, each on a fresh batch."""
    batch_size: Positive = 256
    """Transitions per gradient update, all ranks together (split evenly among them)."""
    warmup_cycles: NonNegative = 11
    """Critic-only update cycles at the start, counted from the first cycle (MAGELLAN's warm-up)."""
    warmup_updates: NonNegative = 0
    """Critic-only gradient updates at the start; the warm-up lasts until all three warm-up counts are reached."""
    warmup_steps: NonNegative = 0
    """Critic-only environment steps at the start; the warm-up lasts until all three warm-up counts are reached."""
    learning_starts: NonNegative = 0
    """Environment steps before the first update cycle (which also waits until every rank's buffer holds a
    batch)."""
    actor_lr: Rate = 1e-4
    """Adam learning rate of the actor (the LLM's policy weights)."""
    actor_lr_ramp_updates: NonNegative = 0
    """The actor's learning rate rises linearly from actor_lr / N to actor_lr over its first N updates after the
    warm-up (0: no ramp, the paper's), so that the policy does not follow a young critic at full speed."""
    actor_loss: Literal["reverse_kl", "forward_kl"] = "reverse_kl"
    """The actor's loss: `reverse_kl`, the paper's E_pi[alpha log pi - Q], or `forward_kl`, the cross-entropy from
    softmax(Q / alpha) to pi (MPO's weighted maximum likelihood). Both are minimised by that Boltzmann policy;
    the reverse one's gradient vanishes where pi is near one-hot, the forward one's does not."""
    critic_lr: Rate = 1e-4
    """Adam learning rate of the critic (its MLP head and the LLM weights it trains)."""
    gamma: Fraction = 0.99
    """Discount factor of the n-step returns and of the bootstrap."""
    n_step: Positive = 3
    """n of the critic's n-step return targets (1: SAC's one-step targets)."""
    autotune_alpha: bool = True
    """Learn the entropy coefficient alpha towards `sac.target_entropy`; false: alpha stays at `sac.alpha_init`."""
    alpha_init: Rate = 0.005
    """Initial entropy coefficient alpha (its fixed value without autotuning)."""
    target_entropy: float = 0.0
    """Policy entropy in nats that alpha's tuning aims at: alpha rises while the entropy is below it and falls
    while above."""
    alpha_lr: Rate = 2e-3
    """Adam learning rate of log alpha."""
    max_grad_norm: Rate | None = None
    """Clip the norm of the actor's and of the critic's gradients to this; null: no clipping."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The critic (the `sac.critic` section)."""


@settings
class PPOConfig:
    """PPO-GLAM (paper Table 1) and its hindsight variants (Appendix G).

    Where the table is silent, GLAM's PPO updater (experiments/train_language_agent.py of
    flowersteam/Grounding_LLMs_with_online_RL): the clipped value loss around the rollout's values with the
    policy's clip radius, weighed by value_coef itself, and advantages used as GAE gives them.
    """

    rollout_steps: Positive = 2048
    """Transitions collected between updates, all environments together; a multiple of `num_envs`."""
    epochs: Positive = 16
    """Passes over the rollout per update."""
    minibatch_size: Positive = 256
    """Transitions per gradient step: each epoch takes rollout_steps / minibatch_size minibatches (rounded up),
    which hindsight copies make larger."""
    lr: Rate = 1e-4
    """Adam learning rate of the policy (the LLM's weights) and the value head."""
    gamma: Fraction = 0.99
    """Discount factor."""
    gae_lambda: Fraction = 0.99
    """lambda of the generalised advantage estimator."""
    clip: Rate = 0.2
    """Clip radius epsilon of the probability ratio (`ppo.loss: clip`) and of the clipped value loss."""
    entropy_coef: Annotated[float, Field(ge=0)] = 0.01
    """Weight of the entropy bonus in the loss."""
    value_coef: Annotated[float, Field(ge=0)] = 0.5
    """Weight of the value loss in the loss."""
    max_grad_norm: Rate = 0.5
    """Clip the norm of the gradients to this."""
    value_loss: Literal["clipped", "mse"] = "clipped"
    """`clipped` (GLAM's): the larger of the squared errors of the value and of the value clipped to the rollout's
    value -/+ `ppo.clip`; `mse`: the squared error of the value to the return."""
    normalize_advantages: bool = False
    """Standardise each minibatch's advantages (GLAM does not)."""
    loss: Literal["clip", "kl"] = "clip"
    """Policy loss: the clipped surrogate (`clip`, paper eq. 4) or the KL-penalised one (`kl`, eq. 5)."""
    kl_coef: Annotated[float, Field(ge=0)] = 0.1
    """beta, the weight of KL(pi_old || pi) in the KL-penalised loss (`ppo.loss: kl`)."""
    center_clip: bool = False
    """Clip the ratio of relabelled data around its first-epoch value instead of 1; needs `her.enabled` and
    `ppo.loss: clip`."""


@settings
class HERConfig:
    """Hindsight relabelling with the social partner's goals (future strategy, paper section 2.3).

    For SAC, `strategy` picks how batches mix relabelled and environment transitions (Appendix E); it and
    `ratio` default to the paper's "ratio" at 50%. For PPO, relabelled trajectories join the rollout and
    `aligned_only` keeps only goals aligned with the original (Appendix G).
    """

    enabled: bool = False
    """Hindsight relabelling: copies of finished episodes (SAC, into the replay buffer) or of rollout segments
    (PPO, into the rollout) with each goal the social partner reported, ending where it was reached."""
    strategy: Literal["uniform", "ratio", "prior", "prior_ratio"] | None = None
    """How replay batches are sampled: `uniform`, `ratio` (a fixed share of hindsight transitions), `prior` (goal
    types drawn by the environment's goal-type distribution) or `prior_ratio` (both); null: `ratio`. Needs
    `her.enabled`."""
    ratio: Fraction | None = None
    """Share of hindsight transitions in each replay batch under the `ratio` and `prior_ratio` strategies; null:
    0.5. Needs `her.enabled`."""
    aligned_only: bool = False
    """Relabel only with goals aligned with the segment's own goal, its sub-goals (Appendix G.1). Needs
    `her.enabled`."""

    @property
    def sampling(self) -> str:
        return self.strategy or "ratio"

    @property
    def her_fraction(self) -> float:
        return 0.5 if self.ratio is None else self.ratio


@settings
class EvalConfig:
    """Periodic evaluation, one row of metrics.csv each (see evaluation.py): success rates on train goals per goal
    type, overall (weighted by the environment's goal-type distribution) and on the test split.
    """

    every_steps: Positive = 10_000
    """Environment steps between evaluations (also one at step 0 and one at the end)."""
    episodes_per_type: Positive = 176
    """Episodes per evaluation on train goals of each goal type (stratified). 176: a standard error of at most 0.03
    on the weighted success whatever the rates (`evaluation.episodes_for_standard_error`); 32 gave about 0.07."""
    test_episodes: NonNegative = 64
    """Episodes per evaluation on goals of the test split (0: none)."""
    greedy: bool = False
    """Take the policy's most probable action; false: sample from it, as it acts in training."""
    seed: int = 12345
    """Seed of the evaluation's goals and scenes (the same at every evaluation) and of its action sampling."""
    start_rounds: Positive = 1
    """Evaluation rounds at step 0, each sampling with random numbers of its own: the start's success is their mean,
    and `eval_success_se` its standard error (a run's "learns" compares its end with it, not with one draw)."""


@settings
class GoalsConfig:
    """Which goal each training episode pursues (goal_sampling.py); the evaluation always draws uniformly among the
    train goals and the test split, so every sampler is judged on the paper's goals."""

    sampler: Literal["uniform", "discovered", "learning_progress"] = "uniform"
    """`uniform`: the environment draws among its train goals (the paper). `discovered`: uniformly among the goals
    the social partner has described so far and `initial` (IMAGINE). `learning_progress`: among the goals of
    `known`, a bucket by absolute learning progress, a share `epsilon` of buckets drawn uniformly (MAGELLAN)."""
    initial: tuple[str, ...] = ()
    """Goals the agent knows before any description (train goals of the environment)."""
    known: Literal["discovered", "train"] = "discovered"
    """The goals `learning_progress` draws among: `discovered`, those the partner has described so far and
    `initial` (this project's variant); `train`, every train goal of the environment from the start (MAGELLAN's)."""
    buckets: Literal["grammar", "competence"] | dict[str, tuple[str, ...]] = "grammar"
    """Goal buckets of `learning_progress`: `grammar`, goal type x the category of the objects named (MAGELLAN's
    expert buckets); `competence`, the known goals grouped by their success rate into `competence_levels` levels; or
    name -> glob patterns over goal strings (a goal joins the first bucket it matches, `other` if none)."""
    epsilon: Fraction = 0.2
    """Share of `learning_progress`'s draws that pick a bucket of known goals uniformly, whatever its progress
    (MAGELLAN's floor, so that a small bucket is tried as often as a large one); with `epsilon_decay`, the share
    it decays to."""
    epsilon_start: Fraction = 1.0
    """The share of uniform draws that `epsilon_decay` starts from (MAGELLAN's 1)."""
    epsilon_decay: Positive | None = None
    """Time constant of MAGELLAN's decay, in training episodes the sampler has observed (its rank's environments):
    the share of uniform draws is `epsilon + (epsilon_start - epsilon) * exp(-episodes / epsilon_decay)`. null:
    `epsilon` throughout."""
    window: Annotated[int, Field(ge=2)] = 100
    """Recent training outcomes kept per bucket (per goal for `competence` buckets); learning progress compares
    their newer half with their older half."""
    competence_levels: Annotated[int, Field(ge=2)] = 5
    """Success-rate levels of `competence` buckets."""


LEARNING_PROGRESS_SETTINGS = (
    "known",
    "buckets",
    "epsilon",
    "epsilon_start",
    "epsilon_decay",
    "window",
    "competence_levels",
)


@settings
class CheckpointConfig:
    """Checkpoints in `<output_dir>/checkpoints/`, from which a restarted run resumes with the same results."""

    every_updates: Positive = 200
    """Checkpoint each time the update count (SAC: gradient updates, PPO: rollout updates) passes a multiple of
    this; also at the end and when stopped."""
    keep: Positive = 2
    """Newest checkpoints kept; older ones are removed."""
    drill_at_steps: Positive | None = None
    """A requeue drill (the `gpu_smoke` experiment): a run that has not resumed yet checkpoints at this many
    environment steps and exits 75, as at a time limit; the workflow requeues it and it resumes. null: none."""


@settings
class MonitorConfig:
    """What a run shows while it trains (monitor.py); none of it changes results or the fingerprint."""

    progress_every_steps: Positive | None = None
    """Environment steps between progress lines (steps, steps/s, success, ETA) on stderr: trainer.log or the SLURM
    job's output. null: 2% of the run."""
    scalars_every_steps: Positive | None = None
    """Environment steps between training scalars in TensorBoard and W&B (losses, alpha, entropy, Q, training
    success, steps/s); evaluations are written as they happen. null: 0.5% of the run."""
    tensorboard: bool = True
    """TensorBoard event files in `<output_dir>/tensorboard/` (`tensorboard --logdir results`)."""
    wandb: Literal["off", "offline", "online"] = "off"
    """Weights & Biases (`pip install -e '.[wandb]'`): `offline` writes `<output_dir>/wandb/` on compute nodes
    without internet, synced later with `wandb sync`; `online` streams."""
    wandb_project: str = "sacglam"
    """The W&B project of the runs."""
    planner_probe: NonNegative = 256
    """Held-out states labelled by the environment's planner (planner_probe.py) on which each evaluation measures how
    often the policy's most likely action, and SAC's argmax Q, are a best one, and the gaps the critic must resolve:
    the `planner_*` columns of metrics.csv. 0: none."""
    policy_kl_every: NonNegative = 10
    """SAC's updates between two measurements of `policy_kl`, the KL divergence from the policy before an update to
    the policy after it, on that update's batch (the critic's step included, which moves the policy when the critic
    shares its weights, as in the warm-up): two forward passes more each time, without gradients; 0: never. PPO
    measures it at every update, on the rollout's own states (a pass over the rollout, against its epochs of passes),
    unless 0."""


@settings
class RunConfig:
    """One training run: the algorithm, the LLM, the environment and every hyperparameter."""

    algorithm: Literal["sac", "ppo"]
    """`sac` (SAC-GLAM, with HER when `her.enabled`) or `ppo` (PPO-GLAM)."""
    model: ModelConfig
    """The LLM (the `model` section)."""
    output_dir: str = "."
    """Run directory: config.yaml, metrics.csv, checkpoints/ and done.json (the workflow sets it per run)."""
    seed: NonNegative = 0
    """Seed of the environments, the initialisation of the trained heads and adapters, action sampling and batch
    sampling (the workflow sets it from an experiment's `seeds`)."""
    total_steps: Positive = 400_000
    """Environment steps to train for, all environments together."""
    num_envs: Positive = 32
    """Parallel environments, all data-parallel ranks together (split evenly among them)."""
    ranks: Positive | None = None
    """Data-parallel ranks of the run (the paper's 4), each with its share of the environments and of the batches,
    its own replay buffer and random streams; they share the processes evenly (distributed.py). null: one per
    process. 4 on one process runs the paper's four ranks on one GPU, their batches in the same passes."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment (the `env` section)."""
    sac: SACConfig = field(default_factory=SACConfig)
    """SAC's settings (the `sac` section)."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO's settings (the `ppo` section)."""
    her: HERConfig = field(default_factory=HERConfig)
    """Hindsight relabelling (the `her` section)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Periodic evaluation (the `eval` section)."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpointing (the `checkpoint` section)."""
    goals: GoalsConfig = field(default_factory=GoalsConfig)
    """Which goals training episodes pursue (the `goals` section)."""
    threads: Positive | None = None
    """torch CPU threads per process (null: torch's default). Results depend on it, so a run resumes only with
    the same count."""
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    """Progress lines, TensorBoard and W&B (the `monitor` section); the workflow sets it from its own `monitor`."""
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """The process group's backend when a run has several processes: `auto` is nccl on GPUs, gloo on CPUs; gloo
    also reduces CUDA tensors (several processes on one GPU, which NCCL refuses). The same mathematics, so it leaves
    the fingerprint alone."""

    def __post_init__(self) -> None:
        problems = coherence_problems(self)
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def fingerprint(self) -> str:
        """A hash of everything that changes results (not where they are written). A setting added after runs
        existed counts only when it differs from its default, so that adding it never re-runs a finished run."""
        settings_ = {k: v for k, v in asdict(self).items() if k not in ("output_dir", "threads", "monitor", "backend")}
        for how in HOW_KERNELS_RUN:
            del settings_["model"][how]
        # Compiled kernels agree with eager ones within float tolerance; `auto` decides per device, so only `true`
        # counts: it did when compiling was opt-in, and its finished runs keep their fingerprints.
        if settings_["model"]["compile"] is not True:
            del settings_["model"]["compile"]
        for (section, key), default in ADDED_LATER.items():
            where = settings_[section] if section else settings_
            if where[key] == default:
                del where[key]
        for section in ADDED_SECTIONS:
            if not settings_[section]:
                del settings_[section]
        return hashlib.sha256(json.dumps(settings_, sort_keys=True, default=str).encode()).hexdigest()[:16]


# Model settings that change how kernels run, not what they compute (rounding aside): outside the fingerprint
HOW_KERNELS_RUN = ("capture", "static_shapes", "check_host_reads", "tf32", "dequantize_4bit")

# Settings added after runs were made with this code, with the default that reproduces those runs ("": top level).
ADDED_LATER: dict[tuple[str, str], object] = {
    ("sac", "actor_lr_ramp_updates"): 0,
    ("sac", "actor_loss"): "reverse_kl",
    ("", "ranks"): None,
    ("checkpoint", "drill_at_steps"): None,
    ("eval", "start_rounds"): 1,
    **{("goals", f.name): f.default for f in fields(GoalsConfig)},
}
ADDED_SECTIONS = ("goals",)  # sections added after runs existed: left out when all their settings are defaults


def coherence_problems(config: RunConfig) -> list[str]:
    problems = goal_problems(config.goals, config.env)
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


def goal_problems(goals: GoalsConfig, env: EnvConfig) -> list[str]:
    """What the `goals` section asks that the environment's train goals cannot give."""
    from fnmatch import fnmatchcase

    from sacglam_core.envs import catalog

    train = catalog().goals(env.split, env.simplified)
    problems = []
    if goals.sampler == "uniform" and goals.initial:
        problems.append("goals.initial is for the samplers that know goals (discovered, learning_progress)")
    if goals.sampler != "uniform" and env.split != "train":
        does = "draws among the train goals" if goals.known == "train" else "learns the goals the partner describes"
        problems.append(f"goals.sampler {goals.sampler} {does}, train goals only: env.split must be train")
    defaults = GoalsConfig()
    changed = [k for k in LEARNING_PROGRESS_SETTINGS if getattr(goals, k) != getattr(defaults, k)]
    if goals.sampler != "learning_progress" and changed:
        problems.append(f"goals.{', goals.'.join(changed)}: settings of sampler learning_progress, not {goals.sampler}")
    else:
        if goals.buckets != "competence" and "competence_levels" in changed:
            problems.append("goals.competence_levels: a setting of buckets: competence")
        if goals.epsilon_decay is None and "epsilon_start" in changed:
            problems.append("goals.epsilon_start: a setting of goals.epsilon_decay (without it epsilon stays "
                            "goals.epsilon)")  # fmt: skip
        if goals.epsilon_decay is not None and goals.epsilon_start < goals.epsilon:
            problems.append(f"goals.epsilon_start {goals.epsilon_start} is below goals.epsilon {goals.epsilon}: "
                            "epsilon decays from epsilon_start to epsilon")  # fmt: skip
    if goals.known == "train" and goals.initial:
        problems.append("goals.initial: known: train knows every train goal from the start")
    unknown = [g for g in goals.initial if g not in set(train)]
    if unknown:
        problems.append(f"goals.initial: {unknown} are not train goals of this environment")
    if isinstance(goals.buckets, dict):
        if "other" in goals.buckets:
            problems.append("goals.buckets.other: `other` names the goals that no bucket's patterns match")
        taken = {
            next((n for n, ps in goals.buckets.items() if any(fnmatchcase(g, p) for p in ps)), None) for g in train
        }
        for name, patterns in goals.buckets.items():
            if not any(fnmatchcase(g, p) for g in train for p in patterns):
                problems.append(f"goals.buckets.{name}: {list(patterns)} match no train goal of this environment")
            elif name not in taken:
                problems.append(f"goals.buckets.{name}: every goal {list(patterns)} match joins an earlier bucket")
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

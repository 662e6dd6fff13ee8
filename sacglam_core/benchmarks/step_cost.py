"""Cost per environment step at the paper's scale: FLOPs counted on real batches, memory per rank, and
the GPU-hours they imply.

    python -m sacglam_core.benchmarks.step_cost [--fraction-of-peak 0.25] [--batches 4] [--quick] [--padding]

A model of google/flan-t5-base's shape with LoRA (the run configuration's default targets and rank) is
built on torch's meta device: every operator runs with its real shapes and does no arithmetic, so
the project's FLOP counter (benchmarks/flops.py, the one gpu_check and the census use) counts the FLOPs of its
own code (scoring, critics, losses, backward passes, LoRA) at full size in seconds. The batches are real: a
uniformly random policy plays 32 environments of the full goal set; finished episodes fill the replay buffer as
in training (with HER's copies for SAC-GLAM+HER) and updates sample it as in training. Token counts come from the
project's word-level tokenizer (Flan-T5's SentencePiece one needs the Hub), one token per word: a
little fewer than Flan-T5's.

Settings are the paper's (Tables 1-3, Appendix C) on 4 data-parallel ranks: SAC updates every 32 steps x 2
with a global batch of 256 (64 per rank); PPO collects 2,048 steps and runs 16 epochs of minibatches of
256; 768 evaluation episodes every 10,000 steps (176 per goal type and 64 on test goals; `--eval-per-type`).
FLOPs per environment step:
  acting       the policy pass over the environments' prompts (PPO: with its value head)
  critic       SAC's critic updates (the target's passes included)
  actor        SAC's actor and alpha updates; PPO's 16 epochs and the pass that prepares them
  evaluation   one evaluation round's policy passes (the random policy's episodes) spread over 10,000 steps
Each critic input and weights option is counted with a target LM copy (the paper's soft-updated target);
"no target LM" is the one-pass critic as the demo runs it (`target_lm: false`): Q and its target are
read from the policy's own passes, the target through the soft-updated MLP head only.

Memory per rank is estimated, not measured (no GPU here): 4-bit base weights (nf4 with double
quantization: 4.127 bits a weight), trainable weights, gradients and Adam's moments in fp32, and the
peak of the tensors an update creates, alive at once (bf16 activations, fp32 log-softmax), tracked
storage by storage on the meta device. The throughput columns assume a stated fraction of each GPU's
dense peak (V100 SXM2: 125 TFLOP/s fp16; H100 SXM: 989 TFLOP/s bf16), which only a GPU can measure
(benchmarks/gpu_check.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from sacglam_core.agent import CriticConfig, GlamAgent, GlamLM
from sacglam_core.agent.tokens import PromptTokens
from sacglam_core.algos.ppo import PPO, Transition
from sacglam_core.algos.sac import SAC
from sacglam_core.benchmarks import add_threads_argument, pin_threads
from sacglam_core.benchmarks.flops import FlopCounter
from sacglam_core.config import EvalConfig, RunConfig, parse_config
from sacglam_core.device_plan import DevicePlan
from sacglam_core.distributed import Ranks
from sacglam_core.envs import EnvConfig, VectorPlayground
from sacglam_core.envs.playground import ACTION_VOCABULARY
from sacglam_core.evaluation import evaluate, goal_type_prior
from sacglam_core.models.loading import add_lora
from sacglam_core.models.shapes import flan_t5_base_shaped
from sacglam_core.models.tokenizer import build_tokenizer
from sacglam_core.trajectories import Episode, EpisodeRecorder

RANKS = 4  # the paper's 4 LLM instances (Appendix C)
RUN_STEPS = 400_000
PAPER_GPU_HOURS = 80  # per seed, 4 V100 32GB (Appendix C)
EVAL_PER_TYPE = EvalConfig().episodes_per_type
GPUS = {"V100 fp16": (125e12, 4), "H100 bf16": (989e12, 1)}  # dense peak FLOP/s, GPUs per run
NF4_BITS = 4.127  # 4-bit weights with double-quantized absmax constants (QLoRA)
CRITIC_INPUTS = ("obs_action", "obs", "decoded_action")
CRITIC_WEIGHTS = ("shared", "shared_frozen", "separate")
PAPER_CRITIC = ("obs_action", "shared")
ONE_PASS_CRITIC = ("decoded_action", "shared", False)  # Q and its target read from the policy's own passes


@contextmanager
def masks_without_values() -> Iterator[None]:
    """transformers skips the attention mask when no token is padded, which it finds out by reading the
    mask's values; on the meta device there are none, so inside this block it always keeps the mask (the
    same FLOPs either way)."""
    import transformers.masking_utils as masking

    saved = masking._ignore_bidirectional_mask_sdpa, masking._ignore_causal_mask_sdpa
    masking._ignore_bidirectional_mask_sdpa = masking._ignore_causal_mask_sdpa = lambda *args, **kwargs: False
    try:
        yield
    finally:
        masking._ignore_bidirectional_mask_sdpa, masking._ignore_causal_mask_sdpa = saved


class LiveMemory(TorchDispatchMode):
    """The peak bytes of tensors that operators inside the block create and that are alive at once (a
    storage counted once, however many views it has)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._alive: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                if storage._cdata not in self._alive:
                    self._alive.add(storage._cdata)
                    self.live += storage.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._free, storage._cdata, storage.nbytes())
        return out

    def _free(self, key: int, nbytes: int) -> None:
        self._alive.discard(key)
        self.live -= nbytes


@dataclass
class Cost:
    flops: float = 0.0
    peak_bytes: int = 0


def measure(fn: Callable[[], object]) -> Cost:
    with FlopCounter() as flops, LiveMemory() as memory:
        fn()
    return Cost(flops.total, memory.peak)


def paper_config(
    algorithm: str, her: bool, critic: CriticConfig | None = None, eval_per_type: int = EVAL_PER_TYPE
) -> RunConfig:
    """The paper's settings for one rank of 4 (SAC's batch is the per-rank 64 of the global 256)."""
    settings: dict = {
        "algorithm": algorithm,
        "eval": {"episodes_per_type": eval_per_type},
        "model": {"name_or_path": "flan-t5-base-shaped", "dtype": "bfloat16", "lora": {}},
        "num_envs": 32,
        "her": {"enabled": her},
        "sac": {"batch_size": 256 // RANKS},
    }
    if critic is not None:
        settings["sac"]["critic"] = {"input": critic.input, "weights": critic.weights, "target_lm": critic.target_lm}
    return parse_config(settings)


def counting_agent(config: RunConfig, hf_config=None, static: bool = True) -> GlamAgent:
    """The agent of `config` on the meta device: Flan-T5-base's shape, or the transformers config given; with the
    static shapes a GPU run replays (padding included), or each batch's own (`static=False`)."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    sac = config.algorithm == "sac"
    seq2seq = hf_config is None or hf_config.is_encoder_decoder
    architecture = "seq2seq" if seq2seq else "causal"
    with torch.device("meta"):
        if hf_config is None:
            model = flan_t5_base_shaped(torch.bfloat16)
        else:
            model = (AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM).from_config(
                hf_config, dtype=torch.bfloat16
            )
        if config.model.lora is not None:  # 4-bit weights compute in bf16: the same FLOPs
            model = add_lora(model, dataclasses.replace(config.model, load_in_4bit=False), architecture)
        lm = GlamLM(model, build_tokenizer(add_eos=seq2seq), architecture)
        plan = DevicePlan.eager("meta", static_shapes=static)
        return GlamAgent(
            lm, config.sac.critic if sac else None, not sac, ACTION_VOCABULARY, config.env.max_candidates, plan
        )


@dataclass
class Play:
    """A uniformly random policy's finished episodes, and snapshots of the environments' prompts."""

    episodes: list[Episode]
    snapshots: list[tuple[list[list[int]], list[list[int]]]]


def random_play(
    tokens: PromptTokens, vector_steps: int, num_envs: int = 32, seed: int = 0, env: EnvConfig | None = None
) -> Play:
    """`vector_steps` steps of a uniformly random policy in `num_envs` environments (the full goal set by default)."""
    rng = random.Random(seed)
    envs = VectorPlayground(num_envs, env or EnvConfig(), seed=seed)
    obs, infos = envs.reset()
    recorder = EpisodeRecorder(tokens)
    recorder.reset(infos["goal"], obs, infos["possible_actions"])
    play = Play([], [])
    for step in range(vector_steps):
        if step % 25 == 0:
            play.snapshots.append((recorder.prompts(), [c.tolist() for c in recorder.candidates()]))
        choices = [rng.randrange(len(c)) for c in infos["possible_actions"]]
        obs, rewards, terminated, truncated, infos = envs.step(
            [a[k] for a, k in zip(infos["possible_actions"], choices)]
        )
        play.episodes += recorder.step(choices, rewards, terminated, truncated, obs, infos)
    return play


def acting_flops(agent: GlamAgent, play: Play) -> float:
    """FLOPs of choosing one environment's action (with PPO's value head)."""
    ids = [agent.tokens.action(a) for a in ACTION_VOCABULARY]
    value = agent.value_head is not None
    total = prompts = 0

    def act(batch):
        with torch.no_grad():
            _, out = agent.policy(batch, hidden=value)
            if value:
                agent.value(out)

    for prompt_ids, candidates in play.snapshots:
        batch = agent.batch_from_ids(prompt_ids, [[ids[a] for a in c] for c in candidates], candidates)
        total += measure(partial(act, batch)).flops
        prompts += len(prompt_ids)
    return total / prompts


def evaluation_flops(agent: GlamAgent, config: RunConfig) -> float:
    """FLOPs of one evaluation round, per environment step of training (a round every eval.every_steps)."""
    rng = random.Random(0)
    total = 0.0

    def policy(goals, observations, candidates):
        nonlocal total
        with torch.no_grad():
            batch = agent.batch(goals, observations, candidates)
            total += measure(lambda: agent.policy(batch)).flops
        return [rng.randrange(len(c)) for c in candidates]

    evaluate(lambda: policy, config, Ranks())
    return total / config.eval.every_steps


def update_costs(sac: SAC, index: np.ndarray, alpha: torch.Tensor) -> dict[str, Cost]:
    """One update on the rows `index`: its critic's half and its actor's."""
    batches, arrays = sac._batches([index])
    arrays.pop("rank")  # the policy-KL measurement's, not the update's
    arrays["env_steps"] = np.zeros((), dtype=np.float64)  # where a divergence would be recorded: any step

    def critic(b, t):
        return sac._critic_update(b["taken"], b.get("following"), t["reward"], t["discount"], alpha, t["env_steps"])

    def actor(b, t):
        return sac._actor_update(b["current"], alpha, t["env_steps"])

    return {
        "critic": measure(lambda: sac.agent.captured("sac-critic", critic)(batches, arrays)),
        "actor": measure(lambda: sac.agent.captured("sac-actor", actor)(batches, {"env_steps": arrays["env_steps"]})),
    }


def sac_costs(agent: GlamAgent, config: RunConfig, play: Play, ranks: int, batches: int) -> dict[str, Cost]:
    """Per environment step: critic and actor updates; and the peak memory of one update on a rank."""
    sac = SAC(agent, config, Ranks(), goal_type_prior(config.env))
    for episode in play.episodes:
        sac.add(episode)
    her = config.her
    per_step = ranks * config.sac.updates_per_cycle / config.sac.update_every / batches
    costs = {k: Cost() for k in ("critic", "actor")}
    alpha = sac.log_alpha.exp().detach()
    for k in range(batches + 1):
        index = sac.buffers[0].sample(sac.batch_size, her.sampling if her.enabled else "uniform", her.her_fraction)
        measured = update_costs(sac, index, alpha)
        if k == 0:
            continue  # the first update creates Adam's moments: not a steady-state update
        for name, cost in measured.items():
            costs[name].flops += cost.flops * per_step
            costs[name].peak_bytes = max(costs[name].peak_bytes, cost.peak_bytes)
    return costs


def ppo_costs(agent: GlamAgent, config: RunConfig, play: Play, ranks: int) -> Cost:
    """PPO's update per environment step: the pass that gives values and log-probabilities to a rank's
    share of the rollout, then epochs x minibatches of forward+backward."""
    cfg = config.ppo
    ppo = PPO(agent, config, Ranks())
    ids = [agent.tokens.action(a) for a in ACTION_VOCABULARY]
    share = cfg.rollout_steps // ranks
    data, segments = [], []
    for episode in play.episodes:
        if len(data) >= share:
            break
        segments.append(episode)
        goal = agent.tokens.goal(episode.goal)
        for t in range(episode.length):
            n = len(episode.candidates[t])
            log_probs = np.full(n, -np.log(n), dtype=np.float32)
            prompt = agent.tokens.join(goal, episode.observations[t].tolist())
            data.append(
                Transition(prompt, episode.candidates[t], episode.actions[t], -np.log(n), log_probs, 0.0, 0.0, 0.0)
            )

    def prepare():
        with torch.no_grad():
            for segment in segments:
                goal = agent.tokens.goal(segment.goal)
                prompts = [agent.tokens.join(goal, o.tolist()) for o in segment.observations]
                candidates = [[ids[a] for a in c] for c in segment.candidates]
                batch = agent.batch_from_ids(prompts, candidates, [c.tolist() for c in segment.candidates])
                _, out = agent.policy(batch, hidden=True)
                agent.value(out)

    minibatch = data[: cfg.minibatch_size // ranks]
    ppo._minibatch_step([minibatch])  # Adam's moments
    step = measure(lambda: ppo._minibatch_step([minibatch]))
    minibatches = -(-cfg.rollout_steps // cfg.minibatch_size)
    flops = ranks * (measure(prepare).flops + cfg.epochs * minibatches * step.flops) / cfg.rollout_steps
    return Cost(flops, step.peak_bytes)


def static_bytes(agent: GlamAgent) -> int:
    """Weights (the frozen linear layers in 4 bits, as bitsandbytes quantizes them, the rest as stored),
    and fp32 gradients and Adam moments of the trained weights."""
    trainable = [p for p in agent.parameters() if p.requires_grad]
    quantized = {
        id(m.weight)
        for name, m in agent.named_modules()
        if isinstance(m, torch.nn.Linear) and not m.weight.requires_grad and "lm_head" not in name
    }
    weights = sum(p.numel() * (NF4_BITS / 8 if id(p) in quantized else p.element_size()) for p in agent.parameters())
    return int(weights + 3 * 4 * sum(p.numel() for p in trainable))


@dataclass
class StepCost:
    parts: dict[str, float]  # FLOPs per environment step: acting, critic, actor, evaluation
    peak_bytes: int  # estimated peak memory of a rank

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def step_cost(agent: GlamAgent, config: RunConfig, play: Play, ranks: int, batches: int) -> StepCost:
    """What one environment step of the run `config` costs, on `ranks` data-parallel ranks."""
    parts = {"acting": acting_flops(agent, play), "evaluation": evaluation_flops(agent, config)}
    if config.algorithm == "ppo":
        update = ppo_costs(agent, config, play, ranks)
        parts |= {"critic": 0.0, "actor": update.flops}
        return StepCost(parts, static_bytes(agent) + update.peak_bytes)
    costs = sac_costs(agent, config, play, ranks, batches)
    parts |= {"critic": costs["critic"].flops, "actor": costs["actor"].flops}
    peak = max(costs["critic"].peak_bytes, costs["actor"].peak_bytes)
    return StepCost(parts, static_bytes(agent) + peak)


def report_row(label: str, cost: StepCost, fraction: float) -> str:
    cells = [f"{label:<40}"] + [f"{cost.parts[k] / 1e9:>9.1f}" for k in ("acting", "critic", "actor", "evaluation")]
    cells.append(f"{cost.total / 1e9:>9.1f}")
    cells.append(f"{cost.peak_bytes / 2**30:>7.1f}")
    for peak_flops, gpus in GPUS.values():
        rate = gpus * peak_flops * fraction / cost.total
        cells.append(f"{rate:>8.1f} {RUN_STEPS * cost.total / (peak_flops * fraction) / 3600:>7.1f}")
    return " ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fraction-of-peak", type=float, default=0.25, help="of each GPU's dense peak")
    parser.add_argument("--batches", type=int, default=4, help="sampled update batches averaged per setting")
    parser.add_argument("--steps", type=int, default=300, help="vector steps of random play that fill the buffer")
    parser.add_argument("--quick", action="store_true", help="only the paper's critic and the one-pass one")
    parser.add_argument(
        "--padding",
        action="store_true",
        help="each row counted again with each batch's own shapes: what static shapes add",
    )
    parser.add_argument(
        "--eval-per-type", type=int, default=EVAL_PER_TYPE, help="evaluation episodes per goal type (and 64 test)"
    )
    add_threads_argument(parser)
    args = parser.parse_args()
    if not 0 < args.fraction_of_peak <= 1 or min(args.batches, args.steps, args.eval_per_type) < 1:
        parser.error("--fraction-of-peak must be in (0, 1], --batches, --steps and --eval-per-type positive")
    pin_threads(args.threads)
    print("step_cost: Flan-T5-base shape, LoRA, bf16 on the meta device")
    play = random_play(PromptTokens(build_tokenizer(add_eos=True)), args.steps)
    print(
        f"random play: {len(play.episodes)} episodes, mean length {np.mean([e.length for e in play.episodes]):.1f} "
        f"steps; paper settings on {RANKS} ranks; GPUs at {args.fraction_of_peak:.0%} of dense peak"
    )
    print("GFLOP per environment step; memory per rank estimated; steps/s of a run and GPU-hours per 400K steps")
    print(
        f"{'variant / critic input, weights':<40} {'acting':>9} {'critic':>9} {'actor':>9} {'eval':>9} {'total':>9} "
        f"{'GiB/rk':>7} " + " ".join(f"{g:>16}" for g in GPUS)
    )
    print(" " * 98 + " ".join(f"{'st/s':>8} {'GPU-h':>7}" for _ in GPUS))
    settings = [("PPO-GLAM", paper_config("ppo", False, None, args.eval_per_type))]
    critics = [PAPER_CRITIC, ("decoded_action", "shared")] if args.quick else [
        (i, w) for i in CRITIC_INPUTS for w in CRITIC_WEIGHTS
    ]  # fmt: skip
    critics = [(i, w, True) for i, w in critics] + [ONE_PASS_CRITIC]
    for her in (False, True):
        for critic_input, weights, target_lm in critics:
            label = f"{'SAC-GLAM+HER' if her else 'SAC-GLAM'} / {critic_input}, {weights}"
            label += "" if target_lm else ", no target LM"
            critic = CriticConfig(input=critic_input, weights=weights, target_lm=target_lm)
            settings.append((label, paper_config("sac", her, critic, args.eval_per_type)))
    with masks_without_values():
        for label, config in settings:
            cost = step_cost(counting_agent(config), config, play, RANKS, args.batches)
            print(report_row(label, cost, args.fraction_of_peak), flush=True)
            if args.padding:
                own = step_cost(counting_agent(config, static=False), config, play, RANKS, args.batches).total
                print(
                    f"{'':<4}static shapes add {1 - own / cost.total:.1%} of its FLOPs: {cost.total / 1e9:,.0f} GFLOP "
                    f"per step against {own / 1e9:,.0f} with each batch's own shapes (padded to their longest)",
                    flush=True,
                )
            if label == "SAC-GLAM+HER / " + ", ".join(PAPER_CRITIC):
                achieved = RUN_STEPS * cost.total / (PAPER_GPU_HOURS * 3600)
    print(
        f"the paper: {PAPER_GPU_HOURS} GPU-hours per 400K-step seed on V100s "
        f"({RUN_STEPS / (PAPER_GPU_HOURS / 4 * 3600):.1f} env steps/s on 4): for SAC-GLAM+HER with its critic "
        f"that is {achieved / 1e12:.2f} TFLOP/s per GPU, {achieved / GPUS['V100 fp16'][0]:.1%} of a V100 fp16 peak"
    )


if __name__ == "__main__":
    main()

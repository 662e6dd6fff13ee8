"""GLAM scoring throughput: the naive per-(prompt, action) forward against the batched scorer, and the
critic's forward+backward for each critic input, side by side in one run.

    python -m sacglam_core.benchmarks.scoring_throughput [--models-dir resources/models]
    python -m sacglam_core.benchmarks.scoring_throughput --flan-t5-base --device cuda --dtype bfloat16

`--flan-t5-base` times a randomly initialised model of google/flan-t5-base's shape (random weights are
fine for timing; the Hub is not needed).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch

from sacglam_core.agent import CriticConfig, GlamAgent, GlamLM
from sacglam_core.benchmarks import add_threads_argument, pin_threads
from sacglam_core.envs import EnvConfig, VectorPlayground
from sacglam_core.envs.playground import ACTION_VOCABULARY
from sacglam_core.models.shapes import flan_t5_base_shaped
from sacglam_core.models.tokenizer import build_tokenizer


def flan_t5_base_lm(dtype: torch.dtype, device: str) -> GlamLM:
    model = flan_t5_base_shaped().to(device=device, dtype=dtype).eval()
    return GlamLM(model, build_tokenizer(add_eos=True), "seq2seq")


def tiny(models_dir: Path, name: str, device: str) -> GlamLM:
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    path = models_dir / name
    if not path.exists():
        from sacglam_core.tiny.build import build_tiny

        build_tiny(models_dir)
    seq2seq = name == "tiny-t5"
    model = (AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM).from_pretrained(path).to(device).eval()
    return GlamLM(model, AutoTokenizer.from_pretrained(path), "seq2seq" if seq2seq else "causal")


def score_prompt_repeated(lm: GlamLM, batch) -> torch.Tensor:
    """Batched, but the prompt is processed again for every action (no encoder or cache reuse)."""
    from sacglam_core.agent.lm import _token_logp

    model = lm.model
    owner = torch.arange(batch.num_prompts, device=batch.prompt_ids.device).repeat_interleave(batch.slots)
    actions, action_mask = batch.action_ids.flatten(0, 1), batch.action_mask.flatten(0, 1)
    if lm.seq2seq:
        start = torch.full_like(actions[:, :1], model.config.decoder_start_token_id)
        logits = model(
            input_ids=batch.prompt_ids[owner],
            attention_mask=batch.prompt_mask[owner],
            decoder_input_ids=torch.cat([start, actions[:, :-1]], 1),
        ).logits
        return _token_logp(logits, actions, action_mask)
    ids = torch.cat([batch.prompt_ids[owner], actions], 1)
    mask = torch.cat([batch.prompt_mask[owner], action_mask], 1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
    width = actions.shape[1]
    return _token_logp(logits[:, -width - 1 : -1], actions, action_mask)


def timed(fn: Callable[[], object], repeats: int, device: str) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def sample_batch(agent: GlamAgent, prompts: int, seed: int = 0):
    """Prompts and candidates from random play in the full environment (6 objects)."""
    envs = VectorPlayground(prompts, EnvConfig(), seed=seed)
    obs, infos = envs.reset()
    rng = random.Random(seed)
    for _ in range(3):  # step a little so that some agents hold objects (more candidates)
        obs, _, _, _, infos = envs.step([rng.choice(a) for a in infos["possible_actions"]])
    return agent.batch(infos["goal"], obs, infos["possible_actions"])


def report(label: str, seconds: float, prompts: int, actions: int, baseline: float | None = None) -> None:
    ratio = f"   x{baseline / seconds:5.1f} vs naive" if baseline else ""
    rates = f"{prompts / seconds:>9.1f} prompts/s {actions / seconds:>10.1f} actions/s"
    print(f"  {label:<44}{seconds * 1000:>9.1f} ms {rates}{ratio}")


def bench_model(
    lm: GlamLM, label: str, repeats: int, prompts: int, critic_batch: int, naive: bool, dtype: torch.dtype
) -> None:
    device = str(lm.device)
    autocast = torch.autocast(
        device_type=lm.device.type, dtype=dtype, enabled=dtype != torch.float32 and lm.device.type == "cpu"
    )
    size = sum(p.numel() for p in lm.model.parameters())
    print(f"\n{label}: {size:,} parameters, vocab {lm.model.config.vocab_size}, {device}, {dtype}")
    agents = {
        inp: GlamAgent(lm, CriticConfig(input=inp, target_lm=False), action_vocabulary=ACTION_VOCABULARY).to(lm.device)
        for inp in ("obs_action", "decoded_action", "obs")
    }
    agent = agents["obs_action"]
    batch = sample_batch(agent, prompts)
    n_actions = sum(batch.sizes)
    prompt_length = batch.prompt_mask.sum(1).float().mean()
    print(f"  batch: {prompts} prompts (mean length {prompt_length:.0f} tokens), {n_actions} candidate actions")

    def naive_scores():
        with torch.no_grad(), autocast:
            lm.score_naive(batch.prompt_tokens, batch.candidate_tokens)

    def repeated_scores():
        with torch.no_grad(), autocast:
            score_prompt_repeated(lm, batch)

    def batched_scores():
        with torch.no_grad(), autocast:
            lm.score(batch)

    def batched_backward():
        with autocast:
            out = lm.score(batch)
        out.action_logp.sum().backward()

    base = timed(naive_scores, max(1, repeats // 3), device) if naive else None
    if base:
        report("scores, naive (one forward per pair)", base, prompts, n_actions)
    report(
        "scores, batched, prompt repeated per action", timed(repeated_scores, repeats, device), prompts, n_actions, base
    )
    report("scores, batched (prompt encoded once)", timed(batched_scores, repeats, device), prompts, n_actions, base)
    report("scores, batched, forward+backward", timed(batched_backward, repeats, device), prompts, n_actions)

    print("  policy scores + Q of every candidate:")
    for inp, a in agents.items():

        def policy_and_q(a=a):
            with torch.no_grad(), autocast:
                policy, out = a.policy(batch, hidden=a.policy_hidden_needed())
                a.q(batch, policy_pass=out)

        report(f"    critic input {inp}", timed(policy_and_q, repeats, device), prompts, n_actions)

    print(f"  critic forward+backward, batch of {critic_batch} transitions (Q of the taken action):")
    big = sample_batch(agent, critic_batch, seed=1)
    taken = agent.batch_from_ids(big.prompt_tokens, [c[-1:] for c in big.candidate_tokens], [[0]] * critic_batch)
    for inp, a in agents.items():

        def critic_step(a=a):
            with autocast:
                q = a.q(taken)
            ((q[:, 0] - 1.0) ** 2).mean().backward()

        report(f"    critic input {inp}", timed(critic_step, repeats, device), critic_batch, critic_batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models-dir", type=Path, default=Path("resources/models"))
    parser.add_argument("--flan-t5-base", action="store_true", help="time a Flan-T5-base-shaped model instead")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), nargs="+", default=["float32"])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--critic-batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-naive", action="store_true", help="skip the (slow) naive scorer")
    add_threads_argument(parser)
    args = parser.parse_args()
    pin_threads(args.threads)
    torch.manual_seed(0)
    for dtype_name in args.dtype:
        dtype = getattr(torch, dtype_name)
        if args.flan_t5_base:
            # On GPUs the model itself is cast; on CPUs bf16 runs through autocast.
            lm = flan_t5_base_lm(dtype if args.device != "cpu" else torch.float32, args.device)
            bench_model(
                lm,
                "Flan-T5-base shape (random weights)",
                args.repeats,
                args.prompts,
                args.critic_batch,
                not args.no_naive,
                dtype,
            )
        else:
            for name in ("tiny-t5", "tiny-causal"):
                bench_model(
                    tiny(args.models_dir, name, args.device),
                    name,
                    args.repeats,
                    args.prompts,
                    args.critic_batch,
                    not args.no_naive,
                    dtype,
                )


if __name__ == "__main__":
    main()

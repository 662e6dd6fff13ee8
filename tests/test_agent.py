"""The GLAM policy and the critic heads on the tiny models."""

import itertools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from sacglam_core.agent import AgentConfig, CriticConfig, GlamAgent, GlamLM
from sacglam_core.agent.batch import WIDTH_MULTIPLE, Shapes, collate
from sacglam_core.agent.shared_prompt import shared_prompt_attention
from sacglam_core.agent.static import stage
from sacglam_core.config import LoraSettings, ModelConfig, parse_config
from sacglam_core.envs import VectorPlayground
from sacglam_core.envs.playground import ACTION_VOCABULARY


def make_agent(path, critic=None, lora=None, max_candidates=None, **model_options) -> GlamAgent:
    torch.manual_seed(0)
    config = AgentConfig(ModelConfig(path, lora=lora, **model_options), critic=critic, max_candidates=max_candidates)
    return GlamAgent.from_config(config, ACTION_VOCABULARY)


def env_inputs(n=6, seed=0, steps=3):
    import random

    envs = VectorPlayground(n, seed=seed)
    obs, infos = envs.reset()
    rng = random.Random(seed)
    for _ in range(steps):  # some agents now hold objects: more, and more varied, candidates
        obs, _, _, _, infos = envs.step([rng.choice(a) for a in infos["possible_actions"]])
    return infos["goal"], obs, infos["possible_actions"]


@pytest.mark.parametrize("slots", [None, 10], ids=["slots as needed", "static slots"])
def test_batched_scores_equal_naive_scores_and_gradients(tiny_path, slots):
    agent = make_agent(tiny_path, max_candidates=slots, static_shapes=bool(slots))  # a GPU's shapes, or a CPU's
    goals, obs, candidates = env_inputs()
    batch = agent.batch(goals, obs, candidates)
    assert len(set(batch.sizes)) > 1  # variable-length candidate lists
    widest = max(map(len, batch.prompt_tokens))
    assert batch.slots == (slots or max(batch.sizes))
    assert batch.prompt_ids.shape[1] == (-(-widest // WIDTH_MULTIPLE) * WIDTH_MULTIPLE if slots else widest)
    fast = agent.lm.score(batch).action_logp[batch.candidate_mask]
    naive = agent.lm.score_naive(batch.prompt_tokens, batch.candidate_tokens)
    torch.testing.assert_close(fast, naive, atol=1e-4, rtol=1e-4)
    params = agent.lm.parameters_of()
    fast_grads = torch.autograd.grad(fast.sum(), params, allow_unused=True)
    naive_grads = torch.autograd.grad(naive.sum(), params, allow_unused=True)
    for a, b in zip(fast_grads, naive_grads):
        if a is not None or b is not None:
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_policy_is_a_softmax_over_each_prompts_candidates(tiny_path):
    agent = make_agent(tiny_path)
    goals, obs, candidates = env_inputs()
    batch = agent.batch(goals, obs, candidates)
    policy, out = agent.policy(batch)
    torch.testing.assert_close(policy.probs.sum(1), torch.ones(len(goals)))
    for i, actions in enumerate(candidates):
        scores = out.action_logp[i, : len(actions)]
        torch.testing.assert_close(policy.log_probs[i, : len(actions)], torch.log_softmax(scores, 0))
        assert (policy.probs[i, len(actions) :] == 0).all()
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        picks = policy.sample(generator)
        assert all(p < len(a) for p, a in zip(picks.tolist(), candidates))
    choices = agent.act(goals, obs, candidates, greedy=True)
    assert choices == policy.greedy().tolist()


def test_empty_candidate_list_is_rejected():
    with pytest.raises(ValueError, match="at least one candidate"):
        collate([[1, 2]], [[]], 0, False)


def test_a_batch_lies_on_the_device_it_was_built_for():
    """Not only on a GPU: the step-cost benchmark scores on the meta device."""
    host = collate([[1, 2]], [[[3], [4, 5]]], 0, False)
    batch = host.on(stage(host.arrays, "meta").tensors)
    tensors = (batch.prompt_ids, batch.prompt_mask, batch.action_ids, batch.candidate_mask)
    assert {t.device.type for t in tensors} == {"meta"}


def test_a_batch_has_the_runs_static_shape_whatever_it_holds():
    """Prompts padded to a multiple of WIDTH_MULTIPLE, candidates to the run's slots, actions to its widest; an empty
    slot repeats its prompt's first candidate and is masked; the staged tensors hold the host arrays."""
    shapes = Shapes(candidates=3, action_width=4, width_multiple=WIDTH_MULTIPLE)
    host = collate([[1, 2, 3], [4]], [[[5], [6, 7]], [[8]]], 0, False, shapes=shapes)
    assert host.arrays["prompt_ids"].shape == (2, WIDTH_MULTIPLE)
    assert host.arrays["action_ids"].shape == (2, 3, 4)
    assert host.arrays["candidate_mask"].tolist() == [[True, True, False], [True, False, False]]
    assert host.arrays["action_ids"][1, :, 0].tolist() == [8, 8, 8]
    batch = host.on(stage(host.arrays, "cpu").tensors)
    for name, array in host.arrays.items():
        assert getattr(batch, name).numpy().tolist() == array.tolist(), name
    with pytest.raises(ValueError, match="more than the 1 slots"):
        collate([[1]], [[[5], [6]]], 0, False, shapes=Shapes(candidates=1))
    with pytest.raises(ValueError, match="3 tokens, more than the 2"):
        collate([[1]], [[[5, 6, 7]]], 0, False, shapes=Shapes(action_width=2))


@pytest.mark.parametrize("model", ["tiny-t5", "tiny-causal"])
def test_padding_changes_no_score_hidden_state_or_q_value(tiny_models, model):
    """A prompt's scores, hidden states and Q-values are those of the prompt alone, whatever the batch's slots and
    widths (the mathematics of the unpadded rows)."""
    critic = CriticConfig(input="obs_action", hidden_units=32)
    agent = make_agent(str(tiny_models[model]), critic, max_candidates=9)
    goals, obs, candidates = env_inputs(n=4, steps=4)
    with torch.no_grad():
        batch = agent.batch(goals, obs, candidates)
        out, q = agent.lm.score(batch, hidden=True), agent.q(batch)
        for i in range(len(goals)):
            alone = agent.batch(goals[i : i + 1], obs[i : i + 1], candidates[i : i + 1])
            own, own_q = agent.lm.score(alone, hidden=True), agent.q(alone)
            n = len(candidates[i])
            torch.testing.assert_close(out.action_logp[i, :n], own.action_logp[0, :n], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(out.action_hidden[i, :n], own.action_hidden[0, :n], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(out.prompt_hidden[i], own.prompt_hidden[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(q[i, :n], own_q[0, :n], atol=1e-5, rtol=1e-5)


def test_seq2seq_hidden_states_are_those_of_one_full_forward_per_action(tiny_models):
    """The decoded action's state after its last token, the state at the start token, and the paper's critic input
    (the decoder's start-token state over the encoded prompt + action), against the model's own forward on each
    sequence alone."""
    agent = make_agent(str(tiny_models["tiny-t5"]), CriticConfig(hidden_units=32), max_candidates=8)
    goals, obs, candidates = env_inputs(n=3, steps=4)
    model, start = agent.lm.model, agent.lm.model.config.decoder_start_token_id
    with torch.no_grad():
        batch = agent.batch(goals, obs, candidates)
        out, concat = agent.lm.score(batch, hidden=True), agent.lm.concat_hidden(batch)
        for i, (prompt, actions) in enumerate(zip(batch.prompt_tokens, batch.candidate_tokens)):
            for j, action in enumerate(actions):
                decoded = model(
                    input_ids=torch.tensor([prompt]),
                    decoder_input_ids=torch.tensor([[start, *action]]),
                    output_hidden_states=True,
                ).decoder_hidden_states[-1][0]
                torch.testing.assert_close(out.action_hidden[i, j], decoded[-1], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(out.prompt_hidden[i], decoded[0], atol=1e-5, rtol=1e-5)
                whole = model(
                    input_ids=torch.tensor([prompt[:-1] + action + prompt[-1:]]),
                    decoder_input_ids=torch.tensor([[start]]),
                    output_hidden_states=True,
                ).decoder_hidden_states[-1][0, 0]
                torch.testing.assert_close(concat[i, j], whole, atol=1e-5, rtol=1e-5)


def test_a_bart_like_seq2seq_model_scores_as_its_own_forward(tiny_models):
    """Models whose LM head adds a bias (BART, Marian, Pegasus) score as one full forward per action does."""
    from transformers import BartConfig, BartForConditionalGeneration

    tokenizer = make_agent(str(tiny_models["tiny-t5"])).lm.tokenizer
    torch.manual_seed(2)
    config = BartConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        forced_eos_token_id=None,
    )
    model = BartForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_()
    agent = GlamAgent(GlamLM(model, tokenizer, "seq2seq"))
    batch = agent.batch(*env_inputs(n=3))
    with torch.no_grad():
        fast = agent.lm.score(batch).action_logp[batch.candidate_mask]
        naive = agent.lm.score_naive(batch.prompt_tokens, batch.candidate_tokens)
    torch.testing.assert_close(fast, naive, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("lora", [None, LoraSettings(r=4)], ids=["full", "lora"])
@pytest.mark.parametrize(
    "critic_input, weights",
    list(itertools.product(["obs_action", "obs", "decoded_action"], ["shared", "shared_frozen", "separate"])),
)
def test_critic_variants_route_gradients_where_they_should(tiny_models, critic_input, weights, lora):
    agent = make_agent(
        str(tiny_models["tiny-t5"]), CriticConfig(input=critic_input, weights=weights, hidden_units=64), lora
    )
    goals, obs, candidates = env_inputs()
    batch = agent.batch(goals, obs, candidates)
    policy, out = agent.policy(batch, hidden=agent.policy_hidden_needed())
    q = agent.q(batch, policy_pass=out)
    assert q.shape == policy.log_probs.shape and (q[~policy.mask] == 0).all()
    torch.testing.assert_close(q, agent.q(batch, target=True))  # the target starts as a copy
    q.sum().backward()
    lm = agent.lm
    has_grad = lambda params: any(p.grad is not None and p.grad.abs().sum() > 0 for p in params)  # noqa: E731
    assert has_grad(agent.critic.head.parameters())
    assert not has_grad(agent.critic.target_head.parameters())
    actor_weights = lm.parameters_of("default")
    assert has_grad(actor_weights) == (weights == "shared")
    if weights == "separate":
        assert has_grad(lm.parameters_of("critic"))
    assert not has_grad(lm.parameters_of(agent.critic.target_weights))


def test_target_critic_with_lora_is_an_adapter_not_a_copy(tiny_models):
    agent = make_agent(str(tiny_models["tiny-t5"]), CriticConfig(hidden_units=64), LoraSettings(r=4))
    base = sum(p.numel() for n, p in agent.lm.model.named_parameters() if "lora_" not in n)
    total = sum(p.numel() for p in agent.lm.parameters())
    assert len(agent.lm.copies) == 0
    assert total - base == 2 * sum(p.numel() for p in agent.lm.parameters_of("default"))


def test_polyak_update_moves_the_target_by_tau(tiny_models):
    agent = make_agent(str(tiny_models["tiny-causal"]), CriticConfig(hidden_units=64, tau=0.25), LoraSettings(r=4))
    online = agent.lm.parameters_of("default")
    with torch.no_grad():
        for p in online:
            p.add_(1.0)
        agent.critic.head[0].weight.add_(1.0)
    before = [p.clone() for p in agent.lm.parameters_of("critic_target")]
    head_before = agent.critic.target_head[0].weight.clone()
    agent.critic.update_target(agent.lm)
    for b, a, o in zip(before, agent.lm.parameters_of("critic_target"), online):
        torch.testing.assert_close(a, 0.75 * b + 0.25 * o)
    torch.testing.assert_close(
        agent.critic.target_head[0].weight, 0.75 * head_before + 0.25 * agent.critic.head[0].weight
    )


def test_separate_critic_weights_do_not_change_the_policy(tiny_models):
    agent = make_agent(
        str(tiny_models["tiny-t5"]), CriticConfig(weights="separate", hidden_units=64), LoraSettings(r=4)
    )
    batch = agent.batch(*env_inputs())
    with torch.no_grad():
        scores, q = agent.lm.score(batch).action_logp, agent.q(batch)
        for p in agent.lm.parameters_of("critic"):
            p.add_(0.5)
        assert torch.equal(agent.lm.score(batch).action_logp, scores)
        assert not torch.allclose(agent.q(batch), q)


@pytest.mark.parametrize("critic_input", ["decoded_action", "obs"])
def test_q_from_the_policy_pass_equals_a_separate_pass(tiny_path, critic_input):
    agent = make_agent(tiny_path, CriticConfig(input=critic_input, hidden_units=64))
    batch = agent.batch(*env_inputs())
    with torch.no_grad():
        _, out = agent.policy(batch, hidden=True)
        torch.testing.assert_close(agent.q(batch, policy_pass=out), agent.q(batch))


def test_a_causal_lm_reads_prompt_and_action_alike_in_one_pass_or_one_sequence_per_action(tiny_models):
    """For a causal LM the hidden state at an action's last token is the same whether the action is decoded after
    its prompt's cache (`decoded_action`, read from the policy's pass) or read with its prompt as one sequence (the
    paper's `obs_action`): the same critic, one pass instead of one more per candidate."""
    agent = make_agent(str(tiny_models["tiny-causal"]), CriticConfig(hidden_units=32))
    batch = agent.batch(*env_inputs())
    with torch.no_grad():
        _, out = agent.policy(batch, hidden=True)
        torch.testing.assert_close(out.action_hidden, agent.lm.concat_hidden(batch), atol=1e-5, rtol=1e-5)


def test_obs_critic_needs_an_action_vocabulary(tiny_models):
    from sacglam_core.agent import GlamLM
    from sacglam_core.models.loading import load_model, load_tokenizer

    config = ModelConfig(str(tiny_models["tiny-t5"]))
    model, arch = load_model(config)
    with pytest.raises(ValueError, match="action vocabulary"):
        GlamAgent(GlamLM(model, load_tokenizer(config), arch), CriticConfig(input="obs"))


def test_value_head_reads_the_policy_pass(tiny_path):
    agent = GlamAgent.from_config(AgentConfig(ModelConfig(tiny_path), value_head=True))
    batch = agent.batch(*env_inputs())
    policy, out = agent.policy(batch, hidden=agent.policy_hidden_needed())
    assert agent.value(out).shape == (batch.num_prompts,)


def test_bad_critic_options_are_rejected():
    with pytest.raises(ValueError, match="input\n  Input should be 'obs_action', 'obs' or 'decoded_action'"):
        CriticConfig(input="action")
    with pytest.raises(ValueError, match="weights"):
        CriticConfig(weights="copied")
    with pytest.raises(ValueError, match="tau"):
        CriticConfig(tau=0.0)


def scores_states_and_grads(lm, batch):
    out = lm.score(batch, hidden=True)
    loss = out.action_logp.sum() + out.action_hidden.square().mean() + out.prompt_hidden.square().mean()
    return out, torch.autograd.grad(loss, lm.parameters_of())


def assert_shared_prompt_matches_the_cache(lm, batch):
    assert lm.shared_prompt
    new, new_grads = scores_states_and_grads(lm, batch)
    lm.shared_prompt = False  # the cache path: each prompt's keys/values copied once per action
    old, old_grads = scores_states_and_grads(lm, batch)
    for name in ("action_logp", "action_hidden", "prompt_hidden"):
        torch.testing.assert_close(getattr(new, name), getattr(old, name), atol=1e-5, rtol=1e-5)
    for a, b in zip(new_grads, old_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("lora", [None, LoraSettings(r=4)], ids=["full", "lora"])
def test_actions_reading_their_prompts_keys_in_place_match_the_copied_cache(tiny_models, lora):
    agent = make_agent(str(tiny_models["tiny-causal"]), lora=lora)
    goals, obs, candidates = env_inputs(n=8, steps=4)
    batch = agent.batch(goals, obs, candidates)
    assert len(set(batch.sizes)) > 1 and len({len(a) for c in batch.candidate_tokens for a in c}) > 1
    assert_shared_prompt_matches_the_cache(agent.lm, batch)


def test_shared_prompt_attention_with_grouped_query_heads(tiny_models):
    tokenizer = make_agent(str(tiny_models["tiny-causal"])).lm.tokenizer
    torch.manual_seed(1)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=3,
    )
    agent = GlamAgent(GlamLM(LlamaForCausalLM(config), tokenizer, "causal"))
    goals, obs, candidates = env_inputs(n=5, steps=2)
    assert_shared_prompt_matches_the_cache(agent.lm, agent.batch(goals, obs, candidates))


def test_attention_it_does_not_compute_keeps_the_cache_path(tiny_models):
    tokenizer = make_agent(str(tiny_models["tiny-causal"])).lm.tokenizer
    config = MistralConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        sliding_window=8,
        pad_token_id=0,
    )
    lm = GlamLM(MistralForCausalLM(config), tokenizer, "causal")
    assert not lm.shared_prompt  # a sliding window: the prompt's early keys are out of reach
    assert not make_agent(str(tiny_models["tiny-t5"])).lm.shared_prompt


def test_shared_prompt_attention_outside_the_scorer_fails_clearly_and_restores_the_model(tiny_models):
    model = make_agent(str(tiny_models["tiny-causal"])).lm.model
    before = model.config._attn_implementation
    with pytest.raises(ValueError, match="needs the `shared_prompt` keyword"):
        with shared_prompt_attention(model):
            model(input_ids=torch.tensor([[3, 4, 5]]))
    assert model.config._attn_implementation == before


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_the_masks_the_scorer_makes_are_transformers_own(tiny_models, implementation):
    """The scorer hands the model 4D masks, made without reading the 2D mask's values (transformers checks whether
    anything is padded first, which makes a GPU wait at every pass): they must be the masks transformers would make,
    bidirectional and causal after cached tokens, boolean for SDPA and additive for eager attention."""
    from transformers.masking_utils import bidirectional_mask_function, causal_mask_function, eager_mask, sdpa_mask

    lm = make_agent(str(tiny_models["tiny-t5"])).lm
    lm.base_config._attn_implementation = implementation
    make = {"sdpa": sdpa_mask, "eager": eager_mask}[implementation]
    padding = (torch.rand(5, 9, generator=torch.Generator().manual_seed(0)) > 0.3).long()
    padding[:, 0] = 1
    for causal, queries, past in [(False, 9, 0), (True, 9, 0), (True, 6, 3)]:
        ours = lm._mask(padding, queries=queries if causal else 1, causal=causal, past=past)
        theirs = make(
            batch_size=5,
            q_length=queries,
            kv_length=9,
            q_offset=past,
            mask_function=causal_mask_function if causal else bidirectional_mask_function,
            attention_mask=padding.bool(),
            allow_is_causal_skip=False,
            allow_is_bidirectional_skip=False,
            dtype=torch.float32,
        )
        assert torch.equal(ours.expand_as(theirs), theirs), (causal, queries, past)


@pytest.mark.parametrize("model", ["tiny-t5", pytest.param("tiny-causal", marks=pytest.mark.slow)])
def test_a_compiled_model_scores_as_the_eager_one(tiny_models, model):
    """model.compile: the same scores, Q-values and gradients within float tolerance (fused kernels round
    differently), for the seq2seq and the causal LM (its actions attending to their prompt's keys in place; slow:
    compiling takes a minute or two on this CPU)."""
    goals, obs, candidates = env_inputs(n=8, steps=4)
    outputs = []
    for compiled in (False, True):
        agent = make_agent(
            str(tiny_models[model]), critic=CriticConfig(hidden_units=32), lora=LoraSettings(), compile=compiled
        )
        batch = agent.batch(goals, obs, candidates)
        policy, _ = agent.policy(batch)
        q = agent.q(batch)
        grads = torch.autograd.grad(policy.log_probs.sum() + q.sum(), agent.lm.parameters_of())
        outputs.append((policy.log_probs, q, grads))
    (eager_logp, eager_q, eager_grads), (logp, q, grads) = outputs
    torch.testing.assert_close(logp, eager_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(q, eager_q, atol=1e-5, rtol=1e-5)
    for a, b in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_compiling_is_automatic_where_passes_are_captured_and_keeps_finished_runs_fingerprints(tiny_models):
    """`model.compile: auto` compiles the blocks where passes are captured (a GPU) and not on a CPU; `true` compiles
    them anywhere. The checkpoints' keys are the same, so a run resumes whatever its processes compile; `auto` makes
    the fingerprint of `false`, and `true` the one it made when compiling was opt-in (computed by the code of
    0d26e91), so no finished run reads as another configuration."""

    def compiled_blocks(compile) -> tuple[int, list[str]]:
        agent = make_agent(str(tiny_models["tiny-t5"]), lora=LoraSettings(), compile=compile)
        blocks = sum(getattr(m, "_compiled_call_impl", None) is not None for m in agent.lm.model.modules())
        return blocks, sorted(agent.mutable_state_dict())

    (auto, auto_keys), (compiled, keys) = compiled_blocks("auto"), compiled_blocks(True)
    assert auto == 0 and compiled == 4  # the tiny T5's two encoder and two decoder blocks
    assert keys == auto_keys
    fingerprints = {
        c: parse_config({"algorithm": "sac", "model": {"name_or_path": "m", "compile": c}}).fingerprint
        for c in ("auto", True, False)
    }
    assert fingerprints == {"auto": "6ac7a3f769cab144", True: "8f681a7d1af52e3d", False: "6ac7a3f769cab144"}


def test_static_widths_only_grow_and_each_kind_apart():
    """With static shapes a batch is as wide as the widest of its kind so far (a run's width combinations all
    appear early); without, each batch is as wide as its own longest row."""
    shapes = Shapes(candidates=2, action_width=2, width_multiple=WIDTH_MULTIPLE)

    def widths(prompt_tokens: int, shapes: Shapes) -> tuple[int, int]:
        host = collate([[1] * prompt_tokens], [[[5]]], 0, False, shapes=shapes, concat=lambda p, a: p + a)
        return host.arrays["prompt_ids"].shape[1], host.arrays["concat_ids"].shape[2]

    m = WIDTH_MULTIPLE
    assert widths(3, shapes) == (m, m)
    assert widths(m, shapes) == (m, 2 * m)  # the prompt + action row needs one more token
    assert widths(2 * m + 1, shapes) == (3 * m, 3 * m)
    assert widths(1, shapes) == (3 * m, 3 * m)
    assert widths(1, Shapes(width_multiple=m)) == (m, m)


def test_sampling_follows_the_policy_and_ignores_empty_slots():
    """Draws land on each candidate as often as its probability says, never on an empty slot, and the same generator
    state draws the same candidates whatever the number of empty slots (one uniform number per prompt)."""
    from sacglam_core.agent.policy import CandidateDistribution

    probs = torch.tensor([[0.1, 0.2, 0.7], [0.5, 0.5, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    policy = CandidateDistribution(probs.log().masked_fill(~mask, 0.0), mask)
    draws = torch.stack([policy.sample(torch.Generator().manual_seed(i)) for i in range(4000)])
    assert (draws[:, 1] < 2).all()
    frequencies = torch.stack([(draws == k).float().mean(0) for k in range(3)], 1)
    torch.testing.assert_close(frequencies, probs, atol=0.03, rtol=0)
    wider = CandidateDistribution(
        torch.cat([policy.log_probs, torch.zeros(2, 4)], 1), torch.cat([mask, torch.zeros(2, 4, dtype=torch.bool)], 1)
    )
    for seed in range(20):
        generator = torch.Generator().manual_seed(seed)
        assert torch.equal(policy.sample(generator), wider.sample(torch.Generator().manual_seed(seed)))

"""The GLAM agent: an LLM policy over candidate actions, with a SAC critic or a PPO value head."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from sacglam_core.agent.batch import CandidateBatch
from sacglam_core.agent.critic import Critic, ValueHead
from sacglam_core.agent.lm import GlamLM, LMOutput
from sacglam_core.agent.policy import CandidateDistribution
from sacglam_core.agent.tokens import PromptTokens
from sacglam_core.config import CriticConfig, ModelConfig
from sacglam_core.models.loading import load_model, load_tokenizer, resolve_dtype


@dataclass(frozen=True)
class AgentConfig:
    model: ModelConfig
    critic: CriticConfig | None = None  # SAC
    value_head: bool = False  # PPO


class GlamAgent(nn.Module):
    def __init__(
        self,
        lm: GlamLM,
        critic: CriticConfig | None = None,
        value_head: bool = False,
        action_vocabulary: Sequence[str] | None = None,
        compute_dtype: str = "float32",
    ) -> None:
        super().__init__()
        self.lm = lm
        self.compute_dtype = compute_dtype  # the LLM's (resolved) model.dtype: float16 calls for loss scaling
        self.tokens = PromptTokens(lm.tokenizer)
        self.action_index = {a: i for i, a in enumerate(action_vocabulary or ())}
        self.critic = Critic(lm, critic, len(self.action_index)) if critic else None
        self.value_head = ValueHead(lm) if value_head else None

    @classmethod
    def from_config(cls, config: AgentConfig, action_vocabulary: Sequence[str] | None = None) -> GlamAgent:
        model_config = dataclasses.replace(config.model, dtype=resolve_dtype(config.model))
        model, architecture = load_model(model_config)
        lm = GlamLM(model, load_tokenizer(model_config), architecture)
        agent = cls(lm, config.critic, config.value_head, action_vocabulary, model_config.dtype).to(lm.device)
        if model_config.compile:
            lm.compile_stacks()  # after the critic's weight sets exist: they are compiled too
        return agent

    # -- checkpoints -----------------------------------------------------------------------------
    def mutable_state_dict(self) -> dict[str, torch.Tensor]:
        """Everything training changes: with LoRA, the adapters and heads (not the frozen base model)."""
        state = self.state_dict()
        if not self.lm.lora:
            return state
        return {k: v for k, v in state.items() if not k.startswith("lm.model.") or "lora_" in k}

    def load_mutable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing, unexpected = self.load_state_dict(state, strict=False)
        stray = [k for k in missing if k in self.mutable_state_dict()] + list(unexpected)
        if stray:
            raise ValueError(f"checkpoint does not fit this agent: {stray[:5]}{' ...' if len(stray) > 5 else ''}")

    # -- batches ---------------------------------------------------------------------------------
    def batch(
        self, goals: Sequence[str], observations: Sequence[str], candidates: Sequence[Sequence[str]]
    ) -> CandidateBatch:
        prompts = [self.tokens.prompt(g, o) for g, o in zip(goals, observations)]
        return self.batch_from_ids(
            prompts, [self.tokens.actions(list(c)) for c in candidates], self._indices(candidates)
        )

    def batch_from_ids(
        self, prompts: list[list[int]], candidates: list[list[list[int]]], action_index=None
    ) -> CandidateBatch:
        return self.lm.collate(prompts, candidates, action_index)

    def _indices(self, candidates: Sequence[Sequence[str]]) -> list[list[int]] | None:
        if not self.action_index:
            return None
        return [[self.action_index.get(a, -1) for a in actions] for actions in candidates]

    # -- model outputs ---------------------------------------------------------------------------
    def policy(self, batch: CandidateBatch, hidden: bool = False) -> tuple[CandidateDistribution, LMOutput]:
        out = self.lm.score(batch, hidden=hidden)
        return CandidateDistribution.from_scores(out.action_logp, batch), out

    def policy_hidden_needed(self) -> bool:
        """Whether a policy pass should also return hidden states (value head, or a critic that shares it)."""
        return self.value_head is not None or (self.critic is not None and self.critic.reads_policy_pass())

    def q(self, batch: CandidateBatch, target: bool = False, policy_pass: LMOutput | None = None) -> torch.Tensor:
        return self.critic(self.lm, batch, target=target, policy_pass=policy_pass)

    def value(self, policy_pass: LMOutput) -> torch.Tensor:
        return self.value_head(policy_pass)

    @torch.no_grad()
    def act(
        self,
        goals: Sequence[str],
        observations: Sequence[str],
        candidates: Sequence[Sequence[str]],
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> list[int]:
        """The index, in each environment's candidate list, of the chosen action."""
        batch = self.batch(goals, observations, candidates)
        policy, _ = self.policy(batch)
        choice = policy.greedy() if greedy else policy.sample(generator)
        return choice.tolist()

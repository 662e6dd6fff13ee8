"""Critic heads (paper, Appendix B) and the PPO value head: MLPs on top of the LLM's hidden states.

Inputs (`CriticConfig.input`):
- `obs_action`, the paper's choice: the LLM reads prompt + action, one sequence per action, and the
  MLP maps the decoder's last hidden state to one Q-value.
- `obs`: the LLM reads the prompt only; the MLP has one output per action of a fixed vocabulary.
- `decoded_action` (beyond the paper): the prompt is encoded once, each action decoded, and the MLP
  reads the hidden state at the action's last token. The policy's own forward pass then yields both
  the scores and Q for every candidate.

Weights (`CriticConfig.weights`): `shared` with the actor, gradients flowing into the LLM; `shared_frozen`,
gradients stopping at the MLP; `separate`, a copy of the LLM's weights for the critic (a second LoRA
adapter when LoRA is on). The target critic is a Polyak average of the MLP and, with `target_lm`, of the
LLM weights the critic reads (again an adapter, not a copy of the LLM, when LoRA is on).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from sacglam_core.agent.batch import CandidateBatch
from sacglam_core.agent.lm import DEFAULT, GlamLM, LMOutput, polyak
from sacglam_core.config import CriticConfig

CRITIC_WEIGHTS = "critic"
TARGET_WEIGHTS = "critic_target"


def mlp(in_features: int, hidden_units: int, hidden_layers: int, out_features: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(hidden_layers):
        layers += [nn.Linear(in_features, hidden_units), nn.ReLU()]
        in_features = hidden_units
    return nn.Sequential(*layers, nn.Linear(in_features, out_features))


class Critic(nn.Module):
    """Q(o, g, a) for every candidate of a batch, online or target."""

    def __init__(self, lm: GlamLM, config: CriticConfig, num_actions: int | None = None) -> None:
        super().__init__()
        if config.input == "obs" and not num_actions:
            raise ValueError("critic.input='obs' needs the size of the action vocabulary")
        self.config = config
        out = num_actions if config.input == "obs" else 1
        self.head = mlp(lm.hidden_size, config.hidden_units, config.hidden_layers, out)
        self.target_head = copy.deepcopy(self.head).requires_grad_(False)
        self.weights = DEFAULT
        if config.weights == "separate":
            lm.add_weights(CRITIC_WEIGHTS)
            self.weights = CRITIC_WEIGHTS
        self.target_weights = self.weights
        if config.target_lm:
            lm.add_weights(TARGET_WEIGHTS, source=self.weights, trainable=False)
            self.target_weights = TARGET_WEIGHTS

    @property
    def dtype(self) -> torch.dtype:
        """The heads' dtype, in which Q-values and their targets are computed (fp32 when the LLM computes in 16
        bits)."""
        return self.head[0].weight.dtype

    def reads_policy_pass(self, target: bool = False) -> bool:
        """Whether Q (online, or target) can be read from the hidden states of a policy pass, with no LLM
        pass of its own: its LLM weights are the policy's and its input is the prompt or the decoded action."""
        weights = self.target_weights if target else self.weights
        return weights == DEFAULT and self.config.input in ("obs", "decoded_action")

    def trainable_lm_parameters(self, lm: GlamLM) -> list[nn.Parameter]:
        """LLM weights that the critic loss trains (none when gradients stop at the MLP)."""
        return [] if self.config.weights == "shared_frozen" else lm.parameters_of(self.weights)

    def forward(
        self, lm: GlamLM, batch: CandidateBatch, target: bool = False, policy_pass: LMOutput | None = None
    ) -> torch.Tensor:
        """Q-values [B, C], 0 in empty candidate slots.

        `policy_pass`, a policy forward with hidden states, is read instead of a pass of its own when
        `reads_policy_pass(target)`.
        """
        head = self.target_head if target else self.head
        if policy_pass is not None and self.reads_policy_pass(target):
            features = policy_pass
        else:
            with lm.using(self.target_weights if target else self.weights):
                features = (
                    lm.concat_hidden(batch) if self.config.input == "obs_action" else lm.score(batch, hidden=True)
                )
        if isinstance(features, LMOutput):
            features = features.prompt_hidden if self.config.input == "obs" else features.action_hidden
        if self.config.weights == "shared_frozen":
            features = features.detach()
        values = head(features.to(self.dtype))
        if self.config.input == "obs":
            if not batch.indexed:
                raise ValueError("critic.input='obs' needs every candidate's index in the action vocabulary")
            values = values.gather(1, batch.action_index)
        else:
            values = values.squeeze(-1)
        return values.masked_fill(~batch.candidate_mask, 0.0)

    @torch.no_grad()
    def update_target(self, lm: GlamLM) -> None:
        polyak(list(self.head.parameters()), list(self.target_head.parameters()), self.config.tau)
        if self.target_weights != self.weights:
            lm.polyak(self.weights, self.target_weights, self.config.tau)


class ValueHead(nn.Module):
    """PPO's V(o, g): an MLP on the hidden state that sees the prompt alone (from the policy's pass)."""

    def __init__(self, lm: GlamLM, hidden_units: int = 1024, hidden_layers: int = 2) -> None:
        super().__init__()
        self.head = mlp(lm.hidden_size, hidden_units, hidden_layers, 1)

    def forward(self, policy_pass: LMOutput) -> torch.Tensor:
        return self.head(policy_pass.prompt_hidden.to(self.head[0].weight.dtype)).squeeze(-1)

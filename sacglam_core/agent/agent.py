"""The GLAM agent: an LLM policy over candidate actions, with a SAC critic or a PPO value head."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from sacglam_core.agent.batch import WIDTH_MULTIPLE, CandidateBatch, HostBatch, Shapes
from sacglam_core.agent.critic import Critic, ValueHead
from sacglam_core.agent.lm import GlamLM, LMOutput
from sacglam_core.agent.policy import CandidateDistribution
from sacglam_core.agent.static import Graphs, Outputs, stage
from sacglam_core.agent.tokens import PromptTokens
from sacglam_core.config import CriticConfig, ModelConfig, RunConfig
from sacglam_core.device_plan import DevicePlan
from sacglam_core.models.hub import network_attempts
from sacglam_core.models.loading import hub_commit, load_model, load_tokenizer


@dataclass(frozen=True)
class AgentConfig:
    model: ModelConfig
    critic: CriticConfig | None = None  # SAC
    value_head: bool = False  # PPO
    max_candidates: int | None = None  # the environment's largest candidate set: every batch's candidate slots
    plan: DevicePlan | None = None  # None: a process of its own (DevicePlan.of_model)

    @classmethod
    def of_run(cls, config: RunConfig, plan: DevicePlan | None = None) -> AgentConfig:
        """The agent a run trains (or evaluates): SAC's critic or PPO's value head, batches in its static shapes."""
        sac = config.algorithm == "sac"
        return cls(config.model, config.sac.critic if sac else None, not sac, config.env.max_candidates, plan)


@dataclass(frozen=True)
class ModelSource:
    """Where the model was read from: a hub model's commit in its cache (None for a local folder), and the network
    connections loading it started to make (none when it was read offline)."""

    commit: str | None
    network: tuple[str, ...]


class GlamAgent(nn.Module):
    def __init__(
        self,
        lm: GlamLM,
        critic: CriticConfig | None = None,
        value_head: bool = False,
        action_vocabulary: Sequence[str] | None = None,
        max_candidates: int | None = None,
        plan: DevicePlan | None = None,
    ) -> None:
        """`plan` (device_plan.py) says how the agent computes: its dtype, static shapes and captured graphs; None is
        an eager float32 agent on the LLM's device, each batch at its own shapes."""
        super().__init__()
        self.lm = lm
        self.plan = plan or DevicePlan.eager(str(lm.device))
        self.tokens = PromptTokens(lm.tokenizer)
        self.action_index = {a: i for i, a in enumerate(action_vocabulary or ())}
        widest = max((len(self.tokens.action(a)) for a in self.action_index), default=None)
        lm.shapes = Shapes(max_candidates, widest, WIDTH_MULTIPLE) if self.plan.static_shapes else Shapes()
        self.critic = Critic(lm, critic, len(self.action_index)) if critic else None
        self.value_head = ValueHead(lm) if value_head else None
        self.graphs = Graphs(lm.device, self.plan.capture, self.plan.host_reads_checked)
        self._acting_scores = self.captured("act", self._scores)
        self.source: ModelSource | None = None  # where from_config read the model

    @classmethod
    def from_config(cls, config: AgentConfig, action_vocabulary: Sequence[str] | None = None) -> GlamAgent:
        plan = config.plan or DevicePlan.of_model(config.model)
        model_config = plan.for_model(config.model)
        with network_attempts() as network:
            model, architecture = load_model(model_config)
            lm = GlamLM(model, load_tokenizer(model_config), architecture)
        agent = cls(lm, config.critic, config.value_head, action_vocabulary, config.max_candidates, plan).to(lm.device)
        agent.source = ModelSource(hub_commit(model_config), tuple(network))
        if plan.compile:
            lm.compile_blocks()  # after the critic's weight sets exist: they are compiled too
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
        """A batch on the device, with the critic's prompt + action rows when it reads them."""
        return self.lm.batch(prompts, candidates, action_index, concat=self.reads_concat)

    def collate(
        self, prompts: list[list[int]], candidates: list[list[list[int]]], action_index=None, slots: int | None = None
    ) -> HostBatch:
        """A batch's arrays on the host, for `run`."""
        return self.lm.collate(prompts, candidates, action_index, concat=self.reads_concat, slots=slots)

    @property
    def reads_concat(self) -> bool:
        """Whether the critic reads prompt + action sequences (the paper's critic)."""
        return self.critic is not None and self.critic.config.input == "obs_action"

    def _indices(self, candidates: Sequence[Sequence[str]]) -> list[list[int]] | None:
        if not self.action_index:
            return None
        return [[self.action_index.get(a, -1) for a in actions] for actions in candidates]

    def captured(
        self, kind: str, fn: Callable[[dict[str, CandidateBatch], dict[str, torch.Tensor]], Outputs]
    ) -> Callable[..., Outputs]:
        """`fn(batches, tensors)`, a plain function of device tensors, wrapped once: called with host batches and
        arrays, it stages them in one copy and runs `fn` on the device, replayed from a captured CUDA graph on a GPU
        (agent/static.py), one per kind and shapes. A decision made on the host (warm-up) chooses which wrapped
        function runs; none is taken inside one."""

        def call(batches: dict[str, HostBatch], arrays: dict[str, np.ndarray] | None = None) -> Outputs:
            arrays = arrays or {}
            named = {f"{name}.{key}": a for name, host in batches.items() for key, a in host.arrays.items()}
            staged = stage(named | arrays, self.lm.device)

            def on_device(tensors: dict[str, torch.Tensor]) -> Outputs:
                on = {n: host.on({k: tensors[f"{n}.{k}"] for k in host.arrays}) for n, host in batches.items()}
                return fn(on, {key: tensors[key] for key in arrays})

            key = (kind, tuple((name, tuple(t.shape)) for name, t in staged.tensors.items()))
            return self.graphs.run(key, on_device, staged)

        return call

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
        prompts = [self.tokens.prompt(g, o) for g, o in zip(goals, observations)]
        host = self.lm.collate(prompts, [self.tokens.actions(list(c)) for c in candidates], self._indices(candidates))
        policy = self.acting_policy(host)
        choice = policy.greedy() if greedy else policy.sample(generator)
        return choice.tolist()

    @torch.no_grad()
    def _scores(self, batches: dict[str, CandidateBatch], _) -> Outputs:
        policy, _ = self.policy(batches["states"])
        return {"log_probs": policy.log_probs, "mask": policy.mask}

    def acting_policy(self, host: HostBatch) -> CandidateDistribution:
        """The policy over a batch's candidates, without gradients (a captured pass on a GPU, its rows padded to a
        few counts and dropped after the pass)."""

        prompts = len(host.prompt_tokens)
        host = host.padded(self.lm.shapes.rows(prompts)).without_concat()
        out = self._acting_scores({"states": host})
        return CandidateDistribution(out["log_probs"][:prompts], out["mask"][:prompts])

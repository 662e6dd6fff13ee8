"""The GLAM policy: a softmax over each prompt's candidate actions of their summed token log-probs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sacglam_core.agent.batch import CandidateBatch


@dataclass
class CandidateDistribution:
    """pi(a | o, g) over each prompt's candidates (paper eq. 2), laid out [B, C] (C candidate slots).

    `log_probs` is 0 where a prompt has no candidate, so sums over the last axis are safe.
    """

    log_probs: torch.Tensor
    mask: torch.Tensor

    @classmethod
    def from_scores(cls, action_logp: torch.Tensor, batch: CandidateBatch) -> CandidateDistribution:
        mask = batch.candidate_mask
        log_probs = torch.log_softmax(action_logp.masked_fill(~mask, float("-inf")), 1)
        return cls(log_probs.masked_fill(~mask, 0.0), mask)

    @property
    def probs(self) -> torch.Tensor:
        return self.log_probs.exp() * self.mask

    def entropy(self) -> torch.Tensor:
        return -(self.probs * self.log_probs).sum(1)

    def kl(self, other: CandidateDistribution) -> torch.Tensor:
        """KL(self || other) per prompt, over the same candidates."""
        return (self.probs * (self.log_probs - other.log_probs)).sum(1)

    def sample(self, generator: torch.Generator | list[torch.Generator] | None = None) -> torch.Tensor:
        """One candidate column per prompt, drawn and returned where `generator` lives (the trainer's and the
        evaluation's are CPU generators, so a run draws the same actions on a GPU as on a CPU, and the host has
        its choices without a second read). One uniform number per prompt against the cumulative probabilities:
        the draw does not depend on how many empty slots pad the candidates (`torch.multinomial` draws one number
        per column). A list of generators draws equal consecutive shares of the prompts, one each (each data-parallel
        rank's environments with the rank's own)."""
        generators = generator if isinstance(generator, list) else [generator]
        device = generators[0].device if generators[0] is not None else self.mask.device
        probs = self.probs.to(device, torch.float64)
        cumulative = probs.cumsum(1)
        share = len(probs) // len(generators)
        uniform = torch.cat([torch.rand(share, 1, generator=g, device=device, dtype=torch.float64) for g in generators])
        choice = (cumulative < uniform * cumulative[:, -1:]).sum(1)
        return torch.minimum(choice, self.mask.to(device).sum(1) - 1)  # never an empty slot, whatever the rounding

    def greedy(self) -> torch.Tensor:
        return self.log_probs.masked_fill(~self.mask, float("-inf")).argmax(1)

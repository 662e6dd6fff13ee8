"""Batches of prompts, each with its own variable-length list of candidate actions, as token ids."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class CandidateBatch:
    """B prompts and A candidate actions in total; `owner[j]` is the prompt of action j.

    Prompts are padded on the left for causal LMs (so their last token is aligned) and on the right for
    seq2seq models; actions are padded on the right. `action_index` holds each action's index in a fixed
    action vocabulary, for critics with one output per action (-1 where unknown).
    """

    prompt_ids: torch.Tensor  # [B, Lp]
    prompt_mask: torch.Tensor  # [B, Lp]
    action_ids: torch.Tensor  # [A, La]
    action_mask: torch.Tensor  # [A, La]
    owner: torch.Tensor  # [A]
    counts: torch.Tensor  # [B] candidates per prompt
    action_index: torch.Tensor  # [A]
    prompt_tokens: list[list[int]]
    action_tokens: list[list[int]]
    # Kept on the host too: reading them from the tensors would wait for the GPU.
    sizes: list[int]  # candidates per prompt
    indexed: bool  # whether every action has its index in the action vocabulary

    @property
    def num_prompts(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def max_candidates(self) -> int:
        return max(self.sizes)

    def owners(self) -> list[int]:
        """`owner` on the host."""
        return [i for i, n in enumerate(self.sizes) for _ in range(n)]

    def to(self, device: torch.device | str) -> CandidateBatch:
        for name in ("prompt_ids", "prompt_mask", "action_ids", "action_mask", "owner", "counts", "action_index"):
            setattr(self, name, getattr(self, name).to(device))
        return self

    def slots(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, column) of every action in a padded [B, max_candidates] layout."""
        starts = torch.cumsum(self.counts, 0) - self.counts
        column = torch.arange(len(self.owner), device=self.owner.device) - starts[self.owner]
        return self.owner, column

    def pad(self, values: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """Per-action values [A, ...] laid out as [B, max_candidates, ...]."""
        out = values.new_full((self.num_prompts, self.max_candidates, *values.shape[1:]), fill)
        row, column = self.slots()
        return out.index_put((row, column), values)

    def candidate_mask(self) -> torch.Tensor:
        """[B, max_candidates]: True where a candidate exists."""
        return torch.arange(self.max_candidates, device=self.counts.device)[None, :] < self.counts[:, None]


def pad_rows(rows: list[list[int]], value: int, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad token lists to one width; returns ids and the attention mask."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    width = int(lengths.max())
    columns = np.arange(width)[None, :]
    mask = columns >= (width - lengths)[:, None] if left else columns < lengths[:, None]
    ids = np.full((len(rows), width), value, dtype=np.int64)
    ids[mask] = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
    return torch.from_numpy(ids), torch.from_numpy(mask.astype(np.int64))


def collate(
    prompts: list[list[int]],
    candidates: list[list[list[int]]],
    pad_id: int,
    left_pad_prompts: bool,
    action_index: list[list[int]] | None = None,
) -> CandidateBatch:
    """Build a batch from token ids: one prompt and its candidate actions per entry."""
    if len(prompts) != len(candidates):
        raise ValueError(f"{len(prompts)} prompts but {len(candidates)} candidate lists")
    if any(len(c) == 0 for c in candidates):
        raise ValueError("every prompt needs at least one candidate action")
    prompt_ids, prompt_mask = pad_rows(prompts, pad_id, left=left_pad_prompts)
    flat = [a for actions in candidates for a in actions]
    action_ids, action_mask = pad_rows(flat, pad_id)
    sizes = [len(c) for c in candidates]
    counts = torch.tensor(sizes, dtype=torch.long)
    owner = torch.repeat_interleave(torch.arange(len(prompts)), counts)
    indices = [i for idx in action_index for i in idx] if action_index else [-1] * len(flat)
    index = torch.tensor(indices, dtype=torch.long)
    return CandidateBatch(
        prompt_ids, prompt_mask, action_ids, action_mask, owner, counts, index, prompts, flat, sizes, min(indices) >= 0
    )

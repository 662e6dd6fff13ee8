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


def pad_rows(rows: list[list[int]], value: int, left: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Pad token lists to one width; returns ids and the attention mask (int64 arrays)."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    width = int(lengths.max())
    columns = np.arange(width)[None, :]
    mask = columns >= (width - lengths)[:, None] if left else columns < lengths[:, None]
    ids = np.full((len(rows), width), value, dtype=np.int64)
    ids[mask] = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
    return ids, mask.astype(np.int64)


def to_device(arrays: list[np.ndarray], device: torch.device | str) -> list[torch.Tensor]:
    """int64 arrays as tensors on `device`, in one copy: each copy to a GPU is a call and a wait of its own."""
    flat = torch.from_numpy(np.concatenate([a.ravel() for a in arrays]))
    if torch.device(device).type == "cuda":
        flat = flat.pin_memory().to(device, non_blocking=True)  # pinned: the copy need not wait for the host
    else:
        flat = flat.to(device)
    return [part.view(a.shape) for part, a in zip(flat.split([a.size for a in arrays]), arrays)]


def collate(
    prompts: list[list[int]],
    candidates: list[list[list[int]]],
    pad_id: int,
    left_pad_prompts: bool,
    action_index: list[list[int]] | None = None,
    device: torch.device | str = "cpu",
) -> CandidateBatch:
    """Build a batch on `device` from token ids: one prompt and its candidate actions per entry."""
    if len(prompts) != len(candidates):
        raise ValueError(f"{len(prompts)} prompts but {len(candidates)} candidate lists")
    if any(len(c) == 0 for c in candidates):
        raise ValueError("every prompt needs at least one candidate action")
    flat = [a for actions in candidates for a in actions]
    sizes = [len(c) for c in candidates]
    indices = [i for idx in action_index for i in idx] if action_index else [-1] * len(flat)
    tensors = to_device(
        [
            *pad_rows(prompts, pad_id, left=left_pad_prompts),
            *pad_rows(flat, pad_id),
            np.repeat(np.arange(len(prompts)), sizes),
            np.asarray(sizes, dtype=np.int64),
            np.asarray(indices, dtype=np.int64),
        ],
        device,
    )
    return CandidateBatch(*tensors, prompts, flat, sizes, min(indices) >= 0)

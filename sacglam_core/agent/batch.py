"""Batches of prompts with their candidate actions, as token ids laid out in static shapes.

A batch holds B prompts and, for each, `Shapes.candidates` slots of candidate actions (the environment's most),
each action padded to `Shapes.action_width` tokens (the action vocabulary's longest) and each prompt to a width
rounded up to a multiple of `WIDTH_MULTIPLE` and never narrower than the process's widest so far: a run's passes
see a few shapes, all of them early, so that one captured CUDA graph (and one compiled block) serves every call of
a shape from then on (agent/static.py). Padding is masked, so the mathematics is that of the unpadded
rows. An empty slot repeats its prompt's first candidate, so that every sequence a pass reads is a real one (no
fully masked attention row, no non-finite value to mask later); `candidate_mask` leaves it out of every softmax,
expectation and mean. Rows are padded the same way: a batch padded to a fixed number of prompts repeats its first one
and marks the copies in `real`, which every loss, target and statistic reads (`torch.where(real, value, 0)`, or a
weight of 0), so that no result rests on what a copy's other values happen to be.

Batches are assembled on the host in numpy (`HostBatch`) and reach the device in one copy (`static.Staging`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

WIDTH_MULTIPLE = 8  # prompt widths are rounded up to a multiple of this: a few shapes, at most 7 tokens of padding


def round_up(n: int, multiple: int = WIDTH_MULTIPLE) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class Shapes:
    """The static sizes of a run's batches, which a GPU's captured graphs replay; None takes each batch's own, what
    a CPU runs fastest (no padding beyond the batch's own longest)."""

    candidates: int | None = None
    """Candidate slots per prompt: the environment's largest candidate set (`EnvConfig.max_candidates`)."""
    action_width: int | None = None
    """Tokens per action: the longest action of the action vocabulary."""
    width_multiple: int = 1
    """Prompt widths are rounded up to a multiple of this (WIDTH_MULTIPLE for captured graphs)."""
    widest: dict[str, int] = field(default_factory=dict, compare=False)
    """With static shapes, the widest prompt and prompt + action rows so far: widths only grow, so that a
    run's combinations of widths stop appearing once its longest prompts have (each new one is a capture, and
    with `model.compile` a compilation, inside the steady loop)."""

    @property
    def static(self) -> bool:
        """Whether batches take a few fixed shapes, rows too: acting batches are padded to a power of two (`rows`),
        SAC's s_{t+n} rows to its whole batch, PPO's minibatches to quarters."""
        return self.candidates is not None

    def rows(self, prompts: int) -> int:
        """The rows of an acting batch of `prompts` prompts: with static shapes the next power of two, since an
        evaluation plays its episodes together and its batches shrink as they end (a few shapes, not one per
        count)."""
        return 1 << (prompts - 1).bit_length() if self.static else prompts

    def width(self, kind: str, longest: int) -> int:
        """The width of a batch of `kind` ("prompt" or "concat") whose longest row has `longest` tokens."""
        width = round_up(longest, self.width_multiple)
        if self.static:
            width = self.widest[kind] = max(width, self.widest.get(kind, 0))
        return width


@dataclass
class CandidateBatch:
    """B prompts, each with C candidate slots, on a device. Prompts are padded on the left for causal LMs (so that
    their last token is aligned) and on the right for seq2seq models; actions on the right. `action_index` is each
    action's index in a fixed action vocabulary, for critics with one output per action (-1 where unknown).
    `concat_ids` (the paper's critic) holds each prompt + action as one sequence, padded like the prompts."""

    prompt_ids: torch.Tensor  # [B, Lp]
    prompt_mask: torch.Tensor  # [B, Lp] 0/1
    action_ids: torch.Tensor  # [B, C, La]
    action_mask: torch.Tensor  # [B, C, La] 0/1
    candidate_mask: torch.Tensor  # [B, C] bool: a real candidate (not an empty slot)
    real: torch.Tensor  # [B] bool: a real prompt (not a copy that pads the batch to a fixed number of rows)
    action_index: torch.Tensor  # [B, C]
    concat_ids: torch.Tensor | None  # [B, C, Lc]
    concat_mask: torch.Tensor | None  # [B, C, Lc] 0/1
    # Kept on the host too: reading them from the tensors would wait for the GPU.
    prompt_tokens: list[list[int]]
    candidate_tokens: list[list[list[int]]]
    indexed: bool  # whether every action has its index in the action vocabulary

    @property
    def num_prompts(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def slots(self) -> int:
        """Candidate slots per prompt (C)."""
        return self.action_ids.shape[1]

    @property
    def sizes(self) -> list[int]:
        """Candidates per prompt."""
        return [len(c) for c in self.candidate_tokens]


@dataclass
class HostBatch:
    """A batch's arrays on the host, before they are staged on the device."""

    arrays: dict[str, np.ndarray]
    prompt_tokens: list[list[int]]
    candidate_tokens: list[list[list[int]]]
    indexed: bool

    @property
    def sizes(self) -> list[int]:
        """Candidates per prompt."""
        return [len(c) for c in self.candidate_tokens]

    def padded(self, rows: int) -> HostBatch:
        """The batch with copies of its first prompt (and its candidates) appended up to `rows` prompts, marked not
        `real`: whatever a pass computes on them, the losses and statistics read only the real rows."""
        extra = rows - len(self.prompt_tokens)
        if extra <= 0:
            return self
        arrays = padded_rows(self.arrays, rows)
        arrays["real"][-extra:] = False
        return HostBatch(
            arrays,
            self.prompt_tokens + self.prompt_tokens[:1] * extra,
            self.candidate_tokens + self.candidate_tokens[:1] * extra,
            self.indexed,
        )

    def without_concat(self) -> HostBatch:
        """The batch without the paper's critic's prompt + action rows (for a pass of the policy alone)."""
        arrays = {k: a for k, a in self.arrays.items() if not k.startswith("concat_")}
        return HostBatch(arrays, self.prompt_tokens, self.candidate_tokens, self.indexed)

    def on(self, tensors: dict[str, torch.Tensor]) -> CandidateBatch:
        """The batch over `tensors`, the staged copies of `arrays` (same names)."""
        concat = "concat_ids" in tensors
        return CandidateBatch(
            tensors["prompt_ids"],
            tensors["prompt_mask"],
            tensors["action_ids"],
            tensors["action_mask"],
            tensors["candidate_mask"],
            tensors["real"],
            tensors["action_index"],
            tensors["concat_ids"] if concat else None,
            tensors["concat_mask"] if concat else None,
            self.prompt_tokens,
            self.candidate_tokens,
            self.indexed,
        )


def padded_rows(arrays: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """Per-row arrays with copies of their first row appended up to `rows`: the rows that `HostBatch.padded` adds."""
    return {k: np.concatenate([a, np.repeat(a[:1], rows - len(a), 0)]) for k, a in arrays.items()}


def rows_for(count: int, multiple: int) -> int:
    """`count` rounded up to a multiple of `multiple`: a few static shapes."""
    return count + (-count % multiple)


def pad_rows(rows: list[list[int]], value: int, width: int, left: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Token lists padded to `width`; returns ids and the attention mask (int64 arrays)."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    columns = np.arange(width)[None, :]
    mask = columns >= (width - lengths)[:, None] if left else columns < lengths[:, None]
    ids = np.full((len(rows), width), value, dtype=np.int64)
    ids[mask] = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
    return ids, mask.astype(np.int64)


def collate(
    prompts: list[list[int]],
    candidates: list[list[list[int]]],
    pad_id: int,
    left_pad_prompts: bool,
    action_index: list[list[int]] | None = None,
    shapes: Shapes = Shapes(),
    concat: Callable[[list[int], list[int]], list[int]] | None = None,
    slots: int | None = None,
) -> HostBatch:
    """A batch's arrays from token ids: one prompt and its candidate actions per entry; with `concat` (how a prompt
    and an action make one sequence), the critic's prompt + action rows too. `slots` overrides the shapes'
    candidate slots (1 for batches of taken actions)."""
    if len(prompts) != len(candidates):
        raise ValueError(f"{len(prompts)} prompts but {len(candidates)} candidate lists")
    if any(len(c) == 0 for c in candidates):
        raise ValueError("every prompt needs at least one candidate action")
    sizes = [len(c) for c in candidates]
    slots = slots or shapes.candidates or max(sizes)
    if max(sizes) > slots:
        raise ValueError(f"a prompt has {max(sizes)} candidates, more than the {slots} slots of this run's batches")
    longest = max(len(a) for c in candidates for a in c)
    action_width = shapes.action_width or longest
    if longest > action_width:
        raise ValueError(f"an action has {longest} tokens, more than the {action_width} of this run's batches")
    filled = [c + [c[0]] * (slots - len(c)) for c in candidates]  # empty slots repeat the first candidate
    flat = [a for actions in filled for a in actions]
    batch, count = len(prompts), len(flat)
    indices = action_index or [[-1] * n for n in sizes]
    index = np.asarray([idx + [idx[0]] * (slots - len(idx)) for idx in indices], dtype=np.int64)
    width = shapes.width("prompt", max(map(len, prompts)))
    arrays = dict(zip(("prompt_ids", "prompt_mask"), pad_rows(prompts, pad_id, width, left_pad_prompts)))
    actions, action_mask = pad_rows(flat, pad_id, action_width)
    arrays |= {
        "action_ids": actions.reshape(batch, slots, action_width),
        "action_mask": action_mask.reshape(batch, slots, action_width),
        "candidate_mask": np.arange(slots)[None, :] < np.asarray(sizes)[:, None],
        "real": np.ones(batch, dtype=bool),
        "action_index": index,
    }
    if concat is not None:
        rows = [concat(prompts[i // slots], a) for i, a in zip(range(count), flat)]
        ids, mask = pad_rows(rows, pad_id, shapes.width("concat", max(map(len, rows))), left_pad_prompts)
        arrays |= {"concat_ids": ids.reshape(batch, slots, -1), "concat_mask": mask.reshape(batch, slots, -1)}
    return HostBatch(arrays, prompts, candidates, bool(action_index) and int(index.min()) >= 0)

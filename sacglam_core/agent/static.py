"""Static shapes on a device: a call's host arrays staged in one copy, and calls replayed from captured CUDA graphs.

On a GPU an eager update of SAC-GLAM launches tens of thousands of kernels, each costing the host more time than
the GPU spends on it. A CUDA graph records a function's kernels once and replays them all with one call, reading
its inputs and writing its outputs where they were at capture: `Graphs.run` keeps, for each key (a kind of call
and the layout of its inputs), a graph, its input buffer and its outputs. A key's first `WARMUP` calls run eagerly
on a side stream (they create cuBLAS handles and the optimizers' state, which a capture may not allocate); its next
call is captured and replayed, and every later one copies its inputs into the graph's buffer and replays it. Every
call is a real one: the same kernels on the same numbers, eager or replayed.

What a captured function may do: only device work on its inputs and on tensors that outlive it (weights, optimizer
state, learning rates held as tensors). Host reads (`.item()`, `.tolist()`), copies from the host, Python decisions
on tensor values and shape changes would be frozen at capture; batches therefore have static shapes (batch.py),
and a decision made on the host (warm-up, which statistics to measure) chooses which function runs: each is wrapped
once, where it is built (`GlamAgent.captured`). With `check_host_reads` a key's last eager call fails on a host read
(`torch.cuda.set_sync_debug_mode("error")` on a GPU, `NoHostReads` on a CPU) instead of freezing it; its first is left
unchecked, since it may compile blocks for new shapes and compilation reads the host (inductor's pattern set-up).

Collectives are never captured. A function that starts one (the gradient all-reduce of a run with several processes,
`distributed.outside_graphs`) is captured as pieces: the capture ends where the collective starts, that piece is
replayed, the collective runs, and the next piece's capture begins. A replay runs the pieces in their order with
the collectives between them, so processes that capture at different updates (each widens its own prompts) still
meet at every collective, eager, captured or replayed, whatever the backend.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sacglam_core.distributed import Collective, collectives_to

WARMUP = 2  # eager calls of a key before its capture
Outputs = dict[str, torch.Tensor]


class HostReadError(RuntimeError):
    """A tensor's value was read on the host where only device work may run."""


class NoHostReads(TorchDispatchMode):
    """Fails on a read of a tensor's value by the host (`.item()`, `bool()`, `float()`): on a GPU it would wait for
    the device, and inside a captured graph its value would be frozen at capture. The CPU's counterpart of
    `torch.cuda.set_sync_debug_mode("error")`, which a GPU uses; `.tolist()` and `.numpy()` on a CPU tensor read its
    memory without dispatch and escape it."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            raise HostReadError(f"a tensor's value read on the host ({func}) inside device-only work")
        return func(*args, **(kwargs or {}))


@dataclass
class Staged:
    """A call's inputs on the device: one flat byte buffer and named views into it."""

    flat: torch.Tensor
    tensors: dict[str, torch.Tensor]

    def clone(self) -> Staged:
        flat = self.flat.clone()
        return Staged(flat, _views(flat, {k: (t.shape, t.dtype) for k, t in self.tensors.items()}))


def _layout(specs: dict[str, tuple[torch.Size, torch.dtype]]) -> tuple[dict[str, tuple[int, int]], int]:
    """Each array's byte range in the flat buffer (8-byte aligned) and the buffer's size."""
    offsets, end = {}, 0
    for name, (shape, dtype) in specs.items():
        size = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        offsets[name] = (end, size)
        end += -(-size // 8) * 8
    return offsets, end


def _views(flat: torch.Tensor, specs: dict[str, tuple[torch.Size, torch.dtype]]) -> dict[str, torch.Tensor]:
    offsets, _ = _layout(specs)
    return {
        name: flat[start : start + size].view(dtype).view(shape)
        for (name, (shape, dtype)), (start, size) in zip(specs.items(), offsets.values())
    }


def stage(arrays: dict[str, np.ndarray], device: torch.device | str) -> Staged:
    """Host arrays on `device` in one copy: written into one pinned buffer, copied without making the host wait.

    The pinned buffer comes from torch's caching host allocator, which gives it out again only once this copy has
    read it."""
    device = torch.device(device)
    specs = {k: (torch.Size(a.shape), torch.from_numpy(np.empty(0, a.dtype)).dtype) for k, a in arrays.items()}
    offsets, size = _layout(specs)
    if device.type == "meta":  # FLOP counting on shapes alone (benchmarks/step_cost.py)
        return Staged(flat := torch.empty(size, dtype=torch.uint8, device=device), _views(flat, specs))
    host = torch.empty(size, dtype=torch.uint8, pin_memory=device.type == "cuda")
    buffer = host.numpy()
    for array, (start, nbytes) in zip(arrays.values(), offsets.values()):
        buffer[start : start + nbytes] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    flat = host.to(device, non_blocking=True) if device.type == "cuda" else host
    return Staged(flat, _views(flat, specs))


@dataclass
class _Entry:
    calls: int = 0
    pieces: list[torch.cuda.CUDAGraph] = field(default_factory=list)  # captured; a collective after each but the last
    collectives: list[Collective] = field(default_factory=list)
    inputs: Staged | None = None
    outputs: Outputs = field(default_factory=dict)

    def replay(self) -> None:
        for piece, collective in itertools.zip_longest(self.pieces, self.collectives):
            piece.replay()
            if collective is not None:
                collective()


class Graphs:
    """Calls replayed from CUDA graphs, one per key (in pieces where it starts collectives); eager calls where
    `enabled` is false (the device plan's `capture`)."""

    def __init__(self, device: torch.device | str, enabled: bool = True, check_host_reads: bool = False) -> None:
        self.device = torch.device(device)
        if enabled and self.device.type != "cuda":
            raise ValueError(f"captured graphs need a CUDA device, not {self.device}")
        self.enabled, self.check_host_reads = enabled, check_host_reads
        self._eager_calls: dict[Hashable, int] = {}  # uncaptured, with check_host_reads: each key's calls
        self.seconds = 0.0  # spent capturing
        self._entries: dict[Hashable, _Entry] = {}
        if self.enabled:
            self._pool = torch.cuda.graph_pool_handle()  # one memory pool for every graph: they never run at once
            self._side = torch.cuda.Stream(self.device)

    @property
    def kinds(self) -> int:
        """How many keys (kinds of call in their shapes) have been met; 0 where nothing is captured."""
        return len(self._entries)

    @property
    def captured(self) -> int:
        """How many graphs have been captured (a function cut by collectives counts once)."""
        return sum(bool(entry.pieces) for entry in self._entries.values())

    def run(self, key: Hashable, fn: Callable[[dict[str, torch.Tensor]], Outputs], inputs: Staged) -> Outputs:
        """`fn(inputs.tensors)`: eagerly, or replayed from the graph of `key` (its outputs copied out, since the
        next replay overwrites them)."""
        if not self.enabled:
            if not self.check_host_reads:  # nothing to count: a CPU run's keys (one per shape) are not kept
                return fn(inputs.tensors)
            calls = self._eager_calls[key] = min(self._eager_calls.get(key, 0) + 1, WARMUP + 1)
            with self._checked() if calls == WARMUP else contextlib.nullcontext():
                return fn(inputs.tensors)
        entry = self._entries.setdefault(key, _Entry())
        if entry.calls < WARMUP:
            entry.calls += 1
            current = torch.cuda.current_stream(self.device)
            self._side.wait_stream(current)
            with torch.cuda.stream(self._side), self._checked() if entry.calls == WARMUP else contextlib.nullcontext():
                outputs = fn(inputs.tensors)
            current.wait_stream(self._side)
            return outputs
        if not entry.pieces:
            started = time.perf_counter()
            entry.inputs = inputs.clone()  # the graph's input buffer, holding this call's inputs
            entry.outputs = self._capture(entry, fn)
            self.seconds += time.perf_counter() - started
        else:
            entry.inputs.flat.copy_(inputs.flat, non_blocking=True)
            entry.replay()
        return {name: value.clone() for name, value in entry.outputs.items()}

    @contextlib.contextmanager
    def _checked(self):
        """With `check_host_reads`, a host read fails loudly instead of being frozen into a graph: on a GPU under
        torch's sync debug mode, on a CPU under `NoHostReads`."""
        if not self.check_host_reads:
            yield
        elif self.device.type == "cuda":
            previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("error")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        else:
            with NoHostReads():
                yield

    def _capture(self, entry: _Entry, fn: Callable[[dict[str, torch.Tensor]], Outputs]) -> Outputs:
        """`fn` on the entry's inputs captured in pieces, cut where it starts a collective, each piece replayed once
        captured and each collective run after its piece: this call's work done, in the order of every replay."""
        piece: torch.cuda.graph | None = None

        def begin() -> None:
            nonlocal piece
            # thread_local: other threads (NCCL's watchdog polling its events, gloo's workers) may call CUDA while
            # a piece is captured; the capturing thread alone must not
            piece = torch.cuda.graph(torch.cuda.CUDAGraph(), pool=self._pool, capture_error_mode="thread_local")
            piece.__enter__()

        def end() -> None:
            nonlocal piece
            captured, piece = piece, None
            captured.__exit__(None, None, None)
            entry.pieces.append(captured.cuda_graph)
            captured.cuda_graph.replay()

        def between(collective: Collective) -> None:
            end()
            collective()
            entry.collectives.append(collective)
            begin()

        begin()
        try:
            with collectives_to(between):
                outputs = fn(entry.inputs.tensors)
            end()
        except BaseException:
            if piece is not None:  # end the broken capture and leave its stream; the error raised is fn's own
                with contextlib.suppress(Exception):
                    piece.cuda_graph.capture_end()
                piece.stream_ctx.__exit__(None, None, None)
            entry.pieces.clear()
            entry.collectives.clear()
            raise
        return outputs

"""FLOPs counted as the device runs them: one counter for gpu_check, step_cost and the census.

torch's `FlopCounterMode` counts the operators it has formulas for and nothing else: bitsandbytes' 4-bit product
(`torch.ops.bitsandbytes.gemm_4bit`, a custom op that a 4-bit layer runs without grad) counted as zero, so a 4-bit
run's FLOPs were undercounted (about 3.5x at Flan-T5-base's shape). This counter sits at the dispatcher, below
autograd and modules, and counts every matrix product, attention and convolution that torch has a formula for, the
CPU's fused attention, and the custom ops the project's path runs, each in the dtype it computes in (a 4-bit
product in its compute dtype, the one its weights are dequantised to). Under autograd a 4-bit product is a
dequantisation and an aten product, counted as such; dequantisation itself is element-wise and not counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count, shape_wrapper


def _fused_4bit_flops(a: torch.Tensor, _b: torch.Tensor, shape_b: list[int], *args, out_val=None, **kwargs) -> int:
    return 2 * a.numel() * shape_b[0]  # a: [..., K] by the dequantised weights [N, K]


FORMULAS: dict[str, Callable[..., int]] = {
    **{str(op): formula for op, formula in flop_registry.items()},
    "aten._scaled_dot_product_flash_attention_for_cpu": shape_wrapper(
        lambda query, key, value, *args, out_shape=None, **kwargs: sdpa_flop_count(query, key, value)
    ),
    "aten._scaled_dot_product_flash_attention_for_cpu_backward": shape_wrapper(
        lambda grad, query, key, value, *args, out_shape=None, **kwargs: sdpa_backward_flop_count(
            grad, query, key, value
        )
    ),
    "bitsandbytes.gemm_4bit": _fused_4bit_flops,
    "bitsandbytes.gemv_4bit": _fused_4bit_flops,
}


class FlopCounter(TorchDispatchMode):
    """Adds up the FLOPs of the operators in `FORMULAS` by the dtype of their first tensor operand. Compiled blocks
    cannot run under a dispatch mode: count them eagerly (`torch.compiler.set_stance("force_eager")`)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_dtype: Counter[torch.dtype] = Counter()
        self.by_operator: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.by_dtype.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func.overloadpacket)
        formula = FORMULAS.get(name)
        if formula is not None:
            dtype = next(leaf.dtype for leaf in tree_leaves(args) if isinstance(leaf, torch.Tensor))
            flops = formula(*args, **kwargs, out_val=out)
            self.by_dtype[dtype] += flops
            self.by_operator[name] += flops
        return out


def count_flops(fn: Callable[[], object]) -> FlopCounter:
    """The FLOPs `fn()` runs (its backward too, when it calls one)."""
    with FlopCounter() as counter:
        fn()
    return counter

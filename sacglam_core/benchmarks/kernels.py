"""What a profiled window's GPU kernels do: their time by kind, and the most expensive kernels.

Kinds are read from kernel names (cuBLAS, CUTLASS, bitsandbytes, flash attention and Triton's generated names,
which carry the operators they fuse), the first matching kind in `KINDS` order. LoRA's products carry no mark of
LoRA: under bfloat16 or float16 they are the float32 ones (with the critic heads'), counted apart; in a float32 run
every product is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

# (kind, substrings of a lower-cased kernel name); the first kind that matches wins, so the specific come first
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("4-bit products", ("gemm_4bit", "gemv_4bit", "4bit_inference")),
    ("4-bit dequantisation", ("dequantize", "dequant")),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("softmax / log-softmax", ("softmax", "logsumexp")),
    ("norms", ("norm", "rsqrt")),
    # float32 inputs (TF32 or not): under a 16-bit dtype only the LoRA adapters' and the critic heads' products
    ("float32 products (LoRA, heads)", ("f32f32_tf32f32", "f32f32_f32f32", "s1688gemm", "sgemm")),
    ("matrix products", ("gemm", "xmma", "cutlass", "cublas", "wgmma", "sm90_", "sm80_", "triton_tem_", "splitk")),
    ("copies", ("copy", "memcpy", "memset", "catarray", "cat_", "index", "gather", "scatter", "fill")),
    ("element-wise and reductions", ("elementwise", "triton_poi", "triton_red", "triton_per", "vectorized", "reduce")),
)
OTHER = "other"


def kind_of(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, marks in KINDS if any(mark in lowered for mark in marks)), OTHER)


@dataclass(frozen=True)
class KernelTable:
    """Per kind: ms per `per` (an update, or an environment step) and share of kernel time; the `top` kernels by
    time: name, calls and ms per `per`, share."""

    per: str
    kinds: dict[str, tuple[float, float]]
    top: list[tuple[str, float, float, float]]

    def lines(self) -> list[str]:
        width = max((len(name) for name, *_ in self.top), default=0)
        out = [f"  {kind:<30} {ms:8.2f} ms / {self.per} {share:6.1%}" for kind, (ms, share) in self.kinds.items()]
        out.append(f"  the most expensive kernels (calls / {self.per}, ms / {self.per}, share):")
        out += [f"    {name[:100]:<{min(width, 100)}} {calls:8.1f} {ms:8.2f} {share:6.1%}" for name, calls, ms, share in
                self.top]  # fmt: skip
        return out


def kernel_table(kernels: Iterable[tuple[str, float]], count: int, per: str = "update", top: int = 10) -> KernelTable:
    """From (kernel name, its device time in microseconds) of each kernel launched in a window of `count` `per`s."""
    time_by_name: Counter[str] = Counter()
    calls_by_name: Counter[str] = Counter()
    for name, microseconds in kernels:
        time_by_name[name] += microseconds
        calls_by_name[name] += 1
    total = sum(time_by_name.values()) or 1.0
    per_count = max(count, 1)
    by_kind: Counter[str] = Counter()
    for name, microseconds in time_by_name.items():
        by_kind[kind_of(name)] += microseconds
    kinds = {kind: (us / 1e3 / per_count, us / total) for kind, us in by_kind.most_common()}
    expensive = [
        (name, calls_by_name[name] / per_count, us / 1e3 / per_count, us / total)
        for name, us in time_by_name.most_common(top)
    ]
    return KernelTable(per, kinds, expensive)

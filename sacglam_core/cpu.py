"""The CPU a run computes on: its name, and its kernels pinned to one instruction set.

torch, MKL and oneDNN pick their kernels for the CPU at hand (AVX-512 where it exists, AVX2 otherwise), and the
two round float reductions differently. Pinned to AVX2, which every x86-64 server of the last decade has, a CPU run
gives the same bytes on every Intel CPU with AVX2; MKL honours its AVX2 branch on Intel processors only (on AMD
it falls back to its automatic branch), so an AMD and an Intel CPU agree only as statistics. That is why the
demo's pre-trained models are shipped rather than trained at set-up (docs/prior.md).
"""

from __future__ import annotations

import os
import platform

KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def pin_kernels() -> str:
    """Pin x86-64 kernels to AVX2 (a variable the user set wins) and return the capability torch uses.

    Call before the process's first tensor operation: torch reads its variable once, then keeps its choice.
    """
    if platform.machine().lower() in ("x86_64", "amd64"):
        for name, value in KERNELS.items():
            os.environ.setdefault(name, value)
    import torch

    return torch.backends.cpu.get_cpu_capability()


def cpu_name() -> str:
    """The CPU's model name, from /proc/cpuinfo where there is one."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            names = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or platform.machine()

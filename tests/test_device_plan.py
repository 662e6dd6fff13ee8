"""The device plan: what a run computes with, decided once from its settings, its processes and the device."""

import pytest
import torch

from sacglam_core import device_plan
from sacglam_core.config import ConfigError, LoraSettings, ModelConfig
from sacglam_core.device_plan import DevicePlan


@pytest.fixture
def gpu(monkeypatch):
    """One GPU of a given compute capability, as torch would report it (this machine has none)."""

    def fake(capability: tuple[int, int], name: str = "Tesla V100-SXM2-32GB", triton: bool = True) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        monkeypatch.setattr(device_plan, "_triton_supports", lambda device: triton)

    return fake


@pytest.mark.parametrize(
    "capability, lora, expected",
    [
        ((7, 0), True, "float16"),
        ((7, 5), True, "float16"),
        ((7, 0), False, "float32"),
        ((8, 0), True, "bfloat16"),
        ((8, 6), False, "bfloat16"),
        ((9, 0), True, "bfloat16"),
    ],  # fmt: skip
)
def test_auto_dtype_follows_the_gpus_compute_capability(gpu, capability, lora, expected):
    """V100 (sm_70) has no native bf16: fp16 there, with LoRA (fp32 adapters under a GradScaler)."""
    gpu(capability)
    plan = DevicePlan.of_model(ModelConfig("x", device="cuda", lora=LoraSettings() if lora else None))
    assert plan.dtype == expected and plan.loss_scaling == (expected == "float16")
    assert plan.device == "cuda:0" and plan.capability == capability


def test_bfloat16_is_never_chosen_below_sm_80(gpu):
    gpu((7, 0))
    with pytest.raises(ConfigError, match="bfloat16 needs a GPU of compute capability 8.0 or later; cuda:0 is sm_70"):
        DevicePlan.of_model(ModelConfig("x", device="cuda", dtype="bfloat16", lora=LoraSettings()))
    gpu((8, 0))
    assert DevicePlan.of_model(ModelConfig("x", device="cuda", dtype="bfloat16")).dtype == "bfloat16"


def test_on_a_cpu_auto_is_float32_eager_at_each_batchs_shapes_and_explicit_choices_stay():
    plan = DevicePlan.of_model(ModelConfig("x", device="auto", lora=LoraSettings()))
    assert (plan.device, plan.dtype, plan.loss_scaling) == ("cpu", "float32", False)
    assert not (plan.static_shapes or plan.capture or plan.compile)
    assert plan.line == "device plan: cpu, float32, shapes per batch, eager, not compiled; one process"
    chosen = ModelConfig("x", dtype="float16", lora=LoraSettings(), static_shapes=True, compile=True)
    plan = DevicePlan.of_model(chosen, processes=2)
    assert (plan.dtype, plan.loss_scaling, plan.static_shapes, plan.compile) == ("float16", True, True, True)
    assert (plan.backend, plan.collectives) == ("gloo", "in the update")
    with pytest.raises(ValueError, match="dtype=float16 needs model.lora"):
        ModelConfig("x", dtype="float16")


def test_on_a_gpu_passes_are_static_captured_and_compiled_where_torch_can_compile_for_it(gpu):
    gpu((7, 0), triton=True)
    plan = DevicePlan.of_model(ModelConfig("x", device="cuda", lora=LoraSettings()), processes=4)
    assert (plan.static_shapes, plan.capture, plan.compile) == (True, True, True)
    assert (plan.backend, plan.collectives) == ("nccl", "between graphs")
    assert plan.line == (
        "device plan: cuda:0 (Tesla V100-SXM2-32GB, sm_70), float16 with loss scaling, static shapes, captured, "
        "compiled; 4 processes over nccl, collectives between graphs"
    )
    gpu((7, 0), triton=False)  # torch's rule (torch.utils._triton.has_triton) says no: auto does not compile
    assert not DevicePlan.of_model(ModelConfig("x", device="cuda", lora=LoraSettings())).compile
    eager = DevicePlan.of_model(ModelConfig("x", device="cuda", capture=False), processes=2, backend="gloo")
    assert (eager.capture, eager.compile, eager.backend, eager.collectives) == (False, False, "gloo", "in the update")
    # each batch at its own shapes: a graph (and a compilation) per shape would never stop; so neither
    per_batch = DevicePlan.of_model(ModelConfig("x", device="cuda", static_shapes=False))
    assert (per_batch.static_shapes, per_batch.capture, per_batch.compile) == (False, False, False)


def test_tf32_is_the_plans_on_a_gpu_and_reaches_the_loader(gpu):
    """float32 products run on TF32 on a GPU from sm_80 on unless `model.tf32` is off (exact float32, for
    comparisons); a CPU and a V100 have no TF32. The loader reads the plan's choice from the model settings the plan
    hands it."""
    assert not DevicePlan.of_model(ModelConfig("x")).tf32
    gpu((9, 0), name="NVIDIA H200")
    on = DevicePlan.of_model(ModelConfig("x", device="cuda", dtype="float32"))
    off = DevicePlan.of_model(ModelConfig("x", device="cuda", dtype="float32", tf32=False))
    assert (on.tf32, off.tf32) == (True, False)
    assert off.summary.endswith("compiled, float32 products without TF32; one process")
    assert (on.for_model(ModelConfig("x")).tf32, off.for_model(ModelConfig("x")).tf32) == (True, False)
    gpu((7, 0))  # a V100 has no TF32 tensor cores: nothing to turn on, and the line says nothing of it
    v100 = DevicePlan.of_model(ModelConfig("x", device="cuda", dtype="float32"))
    assert not v100.tf32 and "TF32" not in v100.summary


def test_the_compile_rule_is_torchs_own(monkeypatch):
    """`auto` compiles where torch.utils._triton.has_triton says Triton can compile for the device."""
    import contextlib

    import torch.utils._triton as triton

    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    for answer in (True, False):
        monkeypatch.setattr(triton, "has_triton", lambda answer=answer: answer)
        assert device_plan._triton_supports("cuda:0") is answer


def test_nccl_on_a_cpu_and_a_gpu_the_machine_lacks_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="backend: nccl needs a GPU; this process computes on cpu"):
        DevicePlan.of_model(ModelConfig("x"), processes=2, backend="nccl")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="model.device: cuda:1 is not available"):
            DevicePlan.of_model(ModelConfig("x", device="cuda:1"))


def test_the_plan_leaves_the_fingerprint_alone():
    from sacglam_core.config import parse_config

    base = {"algorithm": "sac", "model": {"name_or_path": "x"}}
    plain = parse_config(base)
    for changed in (
        {"backend": "gloo"},
        {"model": {"name_or_path": "x", "static_shapes": True}},
        {"model": {"name_or_path": "x", "capture": False}},
        {"model": {"name_or_path": "x", "tf32": False}},
    ):
        assert parse_config({**base, **changed}).fingerprint == plain.fingerprint

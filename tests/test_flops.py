"""The FLOP counter (benchmarks/flops.py): a 4-bit run's products counted as the device runs them."""

import pytest
import torch

from sacglam_core.agent import AgentConfig, CriticConfig, GlamAgent
from sacglam_core.benchmarks.flops import count_flops
from sacglam_core.config import LoraSettings, ModelConfig
from sacglam_core.envs import VectorPlayground
from sacglam_core.envs.playground import ACTION_VOCABULARY

pytest.importorskip("bitsandbytes")


def policy_flops(model, load_in_4bit: bool, backward: bool):
    torch.manual_seed(0)
    config = ModelConfig(str(model), dtype="bfloat16", device="cpu", lora=LoraSettings(), load_in_4bit=load_in_4bit)
    agent = GlamAgent.from_config(AgentConfig(model=config, critic=CriticConfig()), ACTION_VOCABULARY)
    _, infos = VectorPlayground(4, seed=0).reset()
    batch = agent.batch(infos["goal"], [""] * 4, infos["possible_actions"])

    def step() -> None:
        with torch.set_grad_enabled(backward):
            _, out = agent.policy(batch)
            if backward:
                out.action_logp.sum().backward()

    return count_flops(step)


@pytest.mark.parametrize("backward", [False, True], ids=["acting", "forward+backward"])
def test_a_4bit_model_counts_the_same_products_as_its_dense_twin(tiny_models, backward):
    """Without grad a 4-bit layer runs bitsandbytes' fused product (a custom op torch's counter counts as zero); with
    grad a dequantisation and an aten product. Either way the products are the dense model's, in bfloat16."""
    four_bit = policy_flops(tiny_models["tiny-t5"], load_in_4bit=True, backward=backward)
    dense = policy_flops(tiny_models["tiny-t5"], load_in_4bit=False, backward=backward)
    assert four_bit.total == dense.total > 0
    assert four_bit.by_dtype == dense.by_dtype
    if not backward:
        assert four_bit.by_operator["bitsandbytes.gemm_4bit"] + four_bit.by_operator["bitsandbytes.gemv_4bit"] > 0

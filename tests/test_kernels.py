"""gpu_check's kernel table (benchmarks/kernels.py): kernel time by kind from the names a GPU profile records."""

import pytest

from sacglam_core.benchmarks.kernels import OTHER, kernel_table, kind_of

NAMES = {  # names as CUDA profiles of this project's runs record them, by kind
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel__5x_cublas": (
        "matrix products"
    ),
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(Params)": (
        "matrix products"
    ),
    "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x64x32_warpgroupsize1x1x1_execute_segment_k_off_kernel": (
        "float32 products (LoRA, heads)"
    ),  # as an H200 profile of SAC-GLAM+HER in bfloat16 recorded them (LoRA's products on TF32)
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x64_16x6_tn_align4>(cutlass_80_tensorop_s1688gemm)": (
        "float32 products (LoRA, heads)"
    ),
    "void kgemm_4bit_inference_naive<__nv_bfloat16, 128, 16>(int, int, int, __nv_bfloat16*)": "4-bit products",
    "void kDequantizeBlockwise<__nv_bfloat16, 512, 64, 8, 2>(float*, unsigned char*, float*, __nv_bfloat16*)": (
        "4-bit dequantisation"
    ),
    "triton_red_fused__log_softmax_gather_sub_3": "softmax / log-softmax",
    "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>(float*)": (
        "softmax / log-softmax"
    ),
    "triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0": "norms",
    "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>(Flash_fwd_params)": "attention",
    "Memcpy DtoD (Device -> Device)": "copies",
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 3, 64, 64>(float*)": "copies",
    "triton_poi_fused_add_mul_tanh_2": "element-wise and reductions",
    "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float>>(int, float*)": (
        "element-wise and reductions"
    ),
}


@pytest.mark.parametrize("name", list(NAMES))
def test_each_kind_of_kernel_is_recognised_by_its_name(name):
    assert kind_of(name) == NAMES[name]


def test_an_unknown_kernel_is_other_and_still_counted():
    table = kernel_table([("mystery_kernel", 30.0), ("triton_poi_fused_add_0", 10.0)], count=2)
    assert table.kinds == {OTHER: (0.015, 0.75), "element-wise and reductions": (0.005, 0.25)}


def test_the_table_gives_time_per_update_by_kind_and_the_most_expensive_kernels():
    gemm, add = list(NAMES)[0], "triton_poi_fused_add_mul_tanh_2"
    dequant = next(name for name, kind in NAMES.items() if kind == "4-bit dequantisation")
    launched = [(gemm, 400.0)] * 4 + [(dequant, 50.0)] * 8 + [(add, 10.0)] * 20
    table = kernel_table(launched, count=2, top=2)
    assert table.kinds["matrix products"] == pytest.approx((0.8, 1600 / 2200))
    assert table.kinds["4-bit dequantisation"] == pytest.approx((0.2, 400 / 2200))
    assert list(table.kinds) == ["matrix products", "4-bit dequantisation", "element-wise and reductions"]
    assert [(name, calls) for name, calls, _, _ in table.top] == [(gemm, 2.0), (dequant, 4.0)]
    assert any("ms / update" in line for line in table.lines())

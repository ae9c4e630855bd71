"""benchmarks/profile_e2e_cnn.py: the kinds it sorts kernels into by name (names as H200 profiles show them), the
bound it derives, and a --smoke run on the CPU (tiny ResNet-18, eager: no device kernels, so every time is 0)."""
from __future__ import annotations

import pytest
import torch

from _bench_script import load_bench_script


@pytest.fixture(scope="module")
def prof():
    return load_bench_script("profile_e2e_cnn")


@pytest.mark.parametrize("name, want", [
    ("void bie_bconv::(anonymous namespace)::pack_padded<__nv_bfloat16, true>(__nv_bfloat16 const*, long)", "bie"),
    ("void bie_int::quantize_vec_kernel<__nv_bfloat16, 8, signed char>(__nv_bfloat16 const*, long)", "bie"),
    ("_ZN7cutlass13device_kernelINS_4conv6kernel13ConvUniversalINS1_16ConvProblemShapeILNS1_8OperatorE0ELi", "bie"),
    ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc>", "cuDNN conv"),
    ("_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22Impl", "cuDNN conv"),
    ("sm90_xmma_wgrad_indexed_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", "cuDNN conv"),
    ("void precomputed_convolve_sgemm<__nv_bfloat16, 128, 6, 7, 3, 3, 5, 1, false>(int, int, int)", "cuDNN conv"),
    ("nvjet_sm90_tst_24x64_64x16_4x2_h_bz_bias_TNN", "cuBLAS"),
    ("triton_poi_fused__to_copy_add_convolution_relu_12", "inductor"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous", "optimizer"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::Tensor", "copies"),
    ("Memset (Device)", "copies"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<long, at::native::func_wrapper_t", "other"),
])
def test_kernel_kinds(prof, name, want):
    assert prof.kind(name) == want


def test_bound_is_float_over_the_time_without_bie(prof):
    def times(total, bie):
        t = {k: 0.0 for k in prof.KINDS}
        t.update(bie=bie, other=total - bie, total=total)
        return t
    rows = [dict(variant="float", train=times(8000, 0), infer=times(2300, 0)),
            dict(variant="binary", train=times(12000, 2000), infer=times(2400, 1000))]
    prof.bounds(rows)
    b = rows[1]
    assert b["infer"]["vs_float"] == pytest.approx(2300 / 2400)
    assert b["infer"]["bound"] == pytest.approx(2300 / 1400)
    assert b["train"]["bound"] == pytest.approx(8000 / 10000)
    assert rows[0]["infer"]["bound"] == pytest.approx(1.0)


def test_smoke_run(prof, tmp_path):
    md = tmp_path / "p.md"
    rows = prof.main(["--smoke", "--variants", "float,binary", "--kernels", "5", "--md", str(md)])
    assert [r["variant"] for r in rows] == ["float", "binary"]
    text = md.read_text()
    assert "| binary | inference batch |" in text and "| float | training step |" in text
    for r in rows:
        assert set(prof.KINDS) | {"total"} <= set(r["infer"]) and r["train"]["total"] >= 0


def test_largest_kernels_listed(prof):
    """--kernels N: the N largest kernels by name with their launches per step and kind, largest first."""
    class Event:
        def __init__(self, name, us):
            self.name, self.device_time_total = name, us
            self.device_type = torch.autograd.DeviceType.CUDA

    class Prof:
        def events(self):
            return [Event("triton_poi_fused_relu_1", 30.0), Event("bie_bconv::pack_padded", 10.0),
                    Event("triton_poi_fused_relu_1", 30.0), Event("Memset (Device)", 2.0)]

    t = prof.kernel_times(Prof(), per=2, top=2)
    assert t["total"] == pytest.approx(36.0) and t["inductor"] == pytest.approx(30.0)
    assert t["kernels"] == [[30.0, 1.0, "inductor", "triton_poi_fused_relu_1"],
                            [5.0, 0.5, "bie", "bie_bconv::pack_padded"]]

"""bie-backend-cuda: the layers' bound inference calls (each kernel's ``bind``) compute what the registered kernel
computes, bit for bit, on fresh inputs of the bound signature: first and later calls, act-order permutations,
float32 inputs converted to the compute dtype, inputs that are views, shifts and scales of the binary layers.
The kernels themselves are checked against the reference in test_cuda_backend.py."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("bie_backend_cuda") is None,
                                 reason="bie-backend-cuda is not installed"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

WQ_KERNELS = ("wq_gemm_thin", "wq_gemm_wgmma", "wq_gemm_wgmma_rows", "wq_gemm_skinny", "wq_gemm_mma", "wq_gemm_dense")


def _wq_args(bits, gs, k, n, m, act_order, bias, dtype, seed):
    from bie_core import MPQLinear
    torch.manual_seed(seed)
    layer = MPQLinear(k, n, bits=bits, group_size=gs, bias=bias, dtype=torch.float16)
    layer.qweight.random_(-2**31, 2**31 - 1)
    layer.zeros.random_(-2**31, 2**31 - 1)
    with torch.no_grad():
        layer.scales.uniform_(0.01, 0.1)
        if bias:
            layer.bias.normal_()
    layer = layer.cuda()
    g_idx = None
    if act_order:   # uniform groups once sorted: the fragment layouts' permutation
        g_idx = (torch.arange(k) // (k if gs == -1 else gs)).to(torch.int32)[torch.randperm(k)].cuda()
    x = torch.randn(m, k, device="cuda").to(dtype)
    return (x, layer.qweight, layer.scales, layer.zeros, g_idx, layer.bias, bits, gs, "gptq")


@pytest.mark.parametrize("kernel", WQ_KERNELS)
@pytest.mark.parametrize("bits, gs, k, n, m, act_order, bias, dtype", [
    (4, 128, 256, 200, 1, False, True, torch.float16), (4, 32, 512, 136, 3, True, False, torch.bfloat16),
    (2, 64, 256, 64, 8, False, True, torch.float32), (8, -1, 128, 48, 16, False, True, torch.bfloat16),
    (3, 32, 192, 40, 5, True, True, torch.float16), (4, 128, 1024, 256, 40, False, True, torch.bfloat16),
    (4, 64, 256, 128, 300, False, False, torch.float16)])
def test_wq_gemm_bind_computes_what_the_kernel_does(kernel, bits, gs, k, n, m, act_order, bias, dtype):
    from bie_backend_cuda import weight_only as cw
    fn, bind = getattr(cw, kernel), getattr(cw, "bind_" + kernel)
    args = _wq_args(bits, gs, k, n, m, act_order, bias, dtype, seed=bits * 131 + m)
    prepared = cw.prepare(*args[1:5])
    try:
        expect = fn(*args, prepared=prepared)
    except RuntimeError as exc:   # a kernel that does not compute this case (rows, bits, groups) says so
        pytest.skip(f"{kernel} does not take this case: {str(exc).splitlines()[0]}")
    call = bind(*args, prepared=prepared)
    if kernel == "wq_gemm_dense" and bits == 3:   # (3-bit codes dequantize through their layout, unbound)
        assert call is None
        return
    assert call is not None, f"{kernel}: no bound call for a plain contiguous input"
    assert torch.equal(call(*args), expect)
    if getattr(call, "any_rank", False):   # the rows of a (batch, tokens, K) input; the output in its shape
        y3 = call(args[0].reshape(1, m, k), *args[1:])
        assert y3.shape == (1, m, n) and torch.equal(y3.reshape(m, n), expect), f"{kernel}: 3-D input"
    base = torch.randn(m, k + 3, device="cuda").to(dtype)
    for xx in (args[0], torch.randn(m, k, device="cuda").to(dtype), base[:, 3:].contiguous(),
               torch.randn(m * k + 1, device="cuda").to(dtype)[1:].view(m, k)):   # the last one: not 16-byte aligned
        a = (xx,) + args[1:]
        assert torch.equal(call(*a), fn(*a, prepared=prepared)), f"{kernel}: bound call differs"


def test_wq_gemm_bind_leaves_strided_inputs_to_the_kernel():
    from bie_backend_cuda import weight_only as cw
    args = _wq_args(4, 128, 256, 64, 2, False, True, torch.float16, seed=3)
    x = torch.randn(256, 2, device="cuda", dtype=torch.float16).t()
    assert cw.bind_wq_gemm_thin(x, *args[1:], prepared=cw.prepare(*args[1:5])) is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 5, 16])
def test_mpq_linear_eager_inference_takes_the_bound_call(dtype, m):
    import bie_core
    from bie_core import MPQLinear
    torch.manual_seed(m)
    layer = MPQLinear.from_float(nn.Linear(512, 384), bits=4, group_size=128, dtype=torch.float16).cuda().eval()
    x = torch.randn(m, 512, device="cuda").to(dtype)
    with torch.no_grad():
        full = layer._forward(x)
    for _ in range(3):
        with torch.inference_mode():
            y = layer(x)
        assert torch.equal(y, full)
    assert layer._lean is not None
    with torch.inference_mode():
        chosen = bie_core.explain(layer, x).chosen()
    assert chosen["wq_gemm"].startswith("cuda:")



def _any_rank_layer(kind: str, k: int, n: int):
    from bie_core import BinaryLinear, MBWQLinear, MPQLinear, QLinear
    torch.manual_seed(len(kind) + k)
    if kind.startswith("mpq"):
        act_order = kind == "mpq-act-order"   # (GPTQ with calibration inputs orders the rows)
        layer = MPQLinear.from_float(nn.Linear(k, n), bits=4, group_size=32 if act_order else 128,
                                     act_order=act_order, calibration=torch.randn(64, k) if act_order else None,
                                     dtype=torch.bfloat16, backend="cuda").cuda().eval()
        assert layer.act_order == act_order
        return layer
    if kind == "mbwq":
        return MBWQLinear.from_float(nn.Linear(k, n), bits={4: 0.5, 2: 0.5}, group_size=32, dtype=torch.bfloat16,
                                     backend="cuda").cuda().eval()
    x = torch.randn(4, k, device="cuda", dtype=torch.bfloat16)
    if kind == "qlinear":
        layer = QLinear(k, n, 8, 8, bias=True, backend="cuda").to(device="cuda", dtype=torch.bfloat16)
        layer(x.requires_grad_())
    else:
        layer = BinaryLinear(k, n, bias=True, backend="cuda").to(device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            layer.act_shift.normal_(0, 0.3)
            layer(x)
    return layer.eval()


@pytest.mark.parametrize("kind", ["mpq", "mpq-act-order", "mbwq", "qlinear", "binary"])
@pytest.mark.parametrize("lead", [(1, 1), (2, 3), (1, 8), (4, 8), (2, 1, 2)])
def test_layers_hand_model_activations_to_the_kernel_as_they_are(kind, lead):
    """A model's (batch, tokens, features) activations go to the kernel's bound call as they are (the library takes
    the rows of the last dimension and returns the output in the input's shape, csrc/bie_cuda.cpp rows_of): the
    bound call is the kernel's own, with no views made in Python, and its result is that of the same layer on the
    2-D rows bit for bit; a strided input of that shape takes the rows' path and gives the same result."""
    k, n = 256, 136
    layer = _any_rank_layer(kind, k, n)
    x = torch.randn(lead + (k,), device="cuda", dtype=torch.bfloat16)
    if kind == "qlinear" and x.numel() // k > 8:
        pytest.skip("more than 8 rows: past the one-launch GEMVs, kernels of 2-D operands")
    with torch.inference_mode():
        rows = layer(x.reshape(-1, k)).reshape(lead + (n,))
        for _ in range(3):
            y = layer(x)
            assert y.shape == lead + (n,) and torch.equal(y, rows), (kind, lead)
    call = layer._lean.call
    assert getattr(call, "any_rank", False) and not hasattr(call, "rows"), f"{kind}: the input was viewed in Python"
    xt = x.transpose(0, -2).contiguous().transpose(0, -2)   # the same values, strided where both dims > 1
    if not xt.is_contiguous():
        with torch.inference_mode():
            assert torch.equal(layer(xt), rows)
            assert hasattr(layer._lean.call, "rows")

def _binary_layer(k, n, dtype, shift, packed, seed):
    from bie_core import BinaryLinear
    torch.manual_seed(seed)
    layer = BinaryLinear(k, n, bias=True).to(device="cuda", dtype=dtype).eval()
    with torch.no_grad():
        layer.act_shift.normal_(0, 0.3 if shift else 0.0)
        layer(torch.randn(4, k, device="cuda", dtype=dtype))   # sets the activation scale
    if packed:
        layer.pack()
    return layer


@pytest.mark.parametrize("kernel", ["binary_linear_tc", "binary_linear_wgmma"])
@pytest.mark.parametrize("k, n, m", [(128, 64, 1), (1024, 256, 7), (100, 24, 3), (4096, 512, 400)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shift", [False, True])
def test_binary_linear_bind_computes_what_the_kernel_does(kernel, k, n, m, dtype, shift):
    from bie_backend_cuda import binary as cb
    fn, bind = {"binary_linear_tc": (cb.binary_linear, cb.bind_binary_linear),
                "binary_linear_wgmma": (cb.binary_linear_wgmma, cb.bind_binary_linear_wgmma)}[kernel]
    layer = _binary_layer(k, n, dtype, shift, packed=True, seed=k + m)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    # near the shift, so that the rounding of x + shift decides bits
    x = x * 1e-3 - layer.act_shift.detach().to(dtype) if shift else x
    args = (x, layer.act_shift, layer.weight_bits, k, layer.act_scale, layer.weight_scale, layer.bias, dtype)
    prepared = cb.prepare_weight(layer.weight_bits)
    try:
        expect = fn(*args, prepared=prepared)
    except (RuntimeError, ValueError) as exc:
        pytest.skip(f"{kernel} does not take this case: {str(exc).splitlines()[0]}")
    call = bind(*args, prepared=prepared)
    if kernel == "binary_linear_wgmma" and prepared.image is None:
        assert call is None
        return
    assert call is not None
    assert torch.equal(call(*args), expect)
    for xx in (torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(m, k + 1, device="cuda", dtype=dtype)[:, 1:]
               .contiguous()):
        a = (xx,) + args[1:]
        assert torch.equal(call(*a), fn(*a, prepared=prepared)), f"{kernel}: bound call differs"


@pytest.mark.parametrize("packed", [False, True])
def test_binary_linear_eager_inference_matches_the_full_path(packed):
    layer = _binary_layer(256, 96, torch.bfloat16, True, packed, seed=5)
    x = torch.randn(3, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        full = layer._forward(x)
    for _ in range(3):
        with torch.inference_mode():
            assert torch.equal(layer(x), full)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("geom", [(16, 32, 3, 1, 1, 1, 0.0), (64, 64, 3, 2, 1, 1, -1.0), (8, 24, 1, 1, 0, 1, 1.0),
                                  (35, 40, 3, 1, 2, 2, 0.0)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_binary_conv2d_bind_computes_what_the_kernel_does(dtype, geom, channels_last):
    from bie_backend_cuda import binary as cb
    from bie_core.ops._common import randbits
    from bie_core.ops.binary import packed_len
    c, o, k, stride, pad, dil, pad_value = geom
    gen = torch.Generator().manual_seed(c * 7 + o)
    w = randbits((o, packed_len(c * k * k)), device="cuda", gen=gen, k=c * k * k)
    x = torch.randn(2, c, 11, 9, device="cuda", dtype=dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    scale = torch.rand(o, device="cuda") + 0.5
    bias = torch.randn(o, device="cuda")
    args = (x, w, [k, k], [stride, stride], [pad, pad], [dil, dil], 1, pad_value, scale, bias, dtype)
    prepared = cb.prepare_conv(w)
    call = cb.bind_binary_conv2d(*args, prepared=prepared)
    for xx in (x, torch.randn_like(x)):
        a = (xx,) + args[1:]
        assert torch.equal(call(*a), cb.binary_conv2d(*a, prepared=prepared))

"""The bound plans of the native CPU backend's fused module (csrc/fused_plans.cpp):
``IntLinearPlan`` and ``IntConvPlan`` (the activation quantization and the
integer GEMM / conv in one call, offered by the bound ``int_gemm`` /
``int_conv2d`` as ``fuse_quantized_input``) and ``WqPlan`` (the bound
``wq_gemm`` / ``mbwq_gemm``). Each is checked bit for bit against the
reference on fresh random inputs, odd shapes, every float dtype and bit width;
then the layers that use them (QLinear, QConv2d, MPQLinear, MBWQLinear) against
their full path, and what must make them bind again."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import bie_core
from bie_core import Capability, QConv2d, QLinear, explain
from bie_core.plugins import BackendDescriptor, hookimpl
from bie_core.layers.weight_only import MBWQLinear

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _native():
    from bie_backend_cpu import native
    st = native.status()
    if not st.active or st.fused != "active":
        pytest.skip("native CPU kernels or their fused module are off or not built")
    from bie_backend_cpu.native import kernels as nk
    return nk


def _ref():
    from bie_backend_cpu.reference import integer as ri
    return ri


# ------------------------------------------------------------- IntLinearPlan
@pytest.mark.parametrize("m, k, n", [(1, 64, 64), (3, 37, 19), (7, 1, 5), (2, 130, 33)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_bits, w_bits", [(8, 8), (4, 4), (4, 8), (8, 4)])
def test_int_linear_plan_is_the_reference(m, k, n, dtype, a_bits, w_bits):
    nk, ri = _native(), _ref()
    g = torch.Generator().manual_seed(m * 1000 + k * 10 + n + a_bits)
    hw = 1 << (w_bits - 1)
    b = torch.randint(-hw, hw, (n, k), dtype=torch.int8, generator=g)
    prepared = nk.prepare(b)
    for trial, (scale, bias, shift) in enumerate([(torch.rand((), generator=g) + 0.1, torch.randn(n, generator=g), True),
                                                  (torch.rand(n, generator=g) + 0.1, None, False),
                                                  (None, torch.randn(n, generator=g).to(dtype), True)]):
        x = (torch.randn(m, k, generator=g) * 3).to(dtype)
        sa = (torch.rand((), generator=g) * 0.2 + 0.01).to(dtype if trial == 2 else torch.float32)
        sh = (torch.randn(k, generator=g) * 0.5).to(torch.float32 if trial else dtype) if shift else None
        quant = nk.bind_quantize_int(x, sa, a_bits, sh, None)
        qa = quant(x, sa, a_bits, sh, None)
        gemm = nk.bind_int_gemm(qa, b, a_bits, w_bits, scale, bias, dtype, prepared=prepared)
        plan = gemm.fuse_quantized_input(quant, sa, a_bits, sh, scale, bias)
        assert plan is not None
        for xx in (x, (torch.randn(m, k, generator=g) * 50).to(dtype), (torch.randn(k, m, generator=g)).to(dtype).t()):
            want = ri.int_gemm(ri.quantize_int(xx, sa, a_bits, sh), b, a_bits, w_bits, scale, bias, dtype)
            got = plan(xx)
            assert got.dtype == dtype and got.shape == (m, n) and torch.equal(got, want)
        # any rank: the rows of the last dim, the output in the input's shape
        assert plan.any_rank and torch.equal(plan(x.reshape(1, m, k)), plan(x).reshape(1, m, n))
        if m > 1:
            assert torch.equal(plan(x[0]), plan(x)[0])


def test_int_linear_plan_declines_and_refuses():
    nk = _native()
    b = torch.randint(-128, 128, (8, 16), dtype=torch.int8)
    x = torch.randn(2, 16)
    sa = torch.tensor(0.1)
    quant = nk.bind_quantize_int(x, sa, 8, None, None)
    qa = quant(x, sa, 8, None, None)
    prepared = nk.prepare(b)
    assert not hasattr(nk.bind_int_gemm(qa, b, 8, 8, None, None, None, prepared=prepared), "fuse_quantized_input")
    gemm = nk.bind_int_gemm(qa, b, 8, 8, sa, None, torch.float32, prepared=prepared)
    assert gemm.fuse_quantized_input(lambda *a: None, sa, 8, None, sa, None) is None     # not the native quantize
    assert gemm.fuse_quantized_input(quant, torch.rand(16), 8, None, sa, None) is None   # a vector activation scale
    assert gemm.fuse_quantized_input(quant, sa, 8, torch.zeros(5), sa, None) is None    # a shift of the wrong size
    plan = gemm.fuse_quantized_input(quant, sa, 8, None, sa, None)
    with pytest.raises(ValueError, match="int_linear plan.*dtype"):
        plan(x.double())
    with pytest.raises(ValueError, match=r"int_linear plan.*\(M, 16\)"):
        plan(torch.randn(2, 15))


# --------------------------------------------------------------- IntConvPlan
@pytest.mark.parametrize("n, c, o, hw, k, stride, padding, dilation, groups", [
    (1, 16, 16, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1), 1), (2, 3, 5, (7, 9), (3, 2), (2, 1), (0, 1), (1, 2), 1),
    (1, 6, 4, (5, 5), (1, 1), (1, 1), (0, 0), (1, 1), 2), (3, 8, 8, (6, 5), (3, 3), (1, 2), (2, 1), (2, 1), 4)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("channels_last", [False, True])
def test_int_conv_plan_is_the_reference(n, c, o, hw, k, stride, padding, dilation, groups, dtype, bits,
                                        channels_last):
    nk, ri = _native(), _ref()
    if nk._lib.bie_int_layout() == nk.INT_ROWS:
        pytest.skip("no native conv at the portable ISA level")
    g = torch.Generator().manual_seed(n * 100 + c * 10 + o + bits)
    hb = 1 << (bits - 1)
    w = torch.randint(-hb, hb, (o, c // groups) + k, dtype=torch.int8, generator=g)
    prepared = nk.prepare(w)
    geom = (list(stride), list(padding), list(dilation), groups)
    for scale, bias in ((torch.rand((), generator=g) + 0.1, torch.randn(o, generator=g)),
                        (torch.rand(o, generator=g) + 0.1, None), (None, None)):
        x = (torch.randn((n, c) + hw, generator=g) * 3).to(dtype)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        sa = torch.rand((), generator=g) * 0.2 + 0.01
        shift = torch.randn(c, generator=g) * 0.5
        xs = x + shift.to(dtype).view(1, -1, 1, 1)
        quant = nk.bind_quantize_int(xs, sa, bits, None, None)
        qa = quant(xs, sa, bits, None, None)
        conv = nk.bind_int_conv2d(qa, w, bits, bits, *geom, scale, bias, dtype, prepared=prepared)
        plan = conv.fuse_quantized_input(quant, sa, bits, shift, scale, bias)
        assert plan is not None
        for xx in (x, (torch.randn((n, c) + hw, generator=g) * 40).to(dtype)):
            want = ri.int_conv2d(ri.quantize_int(xx + shift.to(dtype).view(1, -1, 1, 1), sa, bits), w, bits, bits,
                                 *geom, scale, bias, dtype)
            got = plan(xx)
            assert got.dtype == dtype and got.shape == want.shape and torch.equal(got, want)
            assert torch.equal(conv(qa, w, bits, bits, *geom, scale, bias, dtype),
                               ri.int_conv2d(qa, w, bits, bits, *geom, scale, bias, dtype))


# ------------------------------------------------------------------- WqPlan
def _mbwq(k, n, dtype, seed, bits=None):
    torch.manual_seed(seed)
    return MBWQLinear.from_float(nn.Linear(k, n, bias=True), bits=bits or {4: 0.5, 2: 0.5}, group_size=32,
                                 dtype=dtype).eval()


@pytest.mark.parametrize("k, n, m, bits", [(64, 64, 1, None), (96, 19, 3, {8: 0.3, 3: 0.3, 2: 0.4}),
                                           (128, 33, 7, {6: 0.5, 4: 0.5}), (64, 16, 96, {5: 1.0})])
@pytest.mark.parametrize("dtype", DTYPES)
def test_mbwq_bind_is_the_kernel(k, n, m, bits, dtype):
    _native()
    from bie_backend_cpu.native import kernels_mbwq as nm
    from bie_backend_cpu.reference import weight_only as rw
    layer = _mbwq(k, n, dtype, k + n + m, bits)
    with torch.no_grad():
        layer.channel_scale.uniform_(0.5, 1.5)
    args = (layer.qweight, layer.scales, layer.zeros, layer.q_perm, layer.channel_scale, layer.bias,
            list(layer.group_bits), list(layer.group_rows))
    x = torch.randn(m, k).to(dtype)
    prepared = nm.prepare(*args[:4])
    call = nm.bind_mbwq_gemm(x, *args, prepared=prepared)
    assert call is not None
    for xx in (x, torch.randn(m, k).to(dtype) * 7, torch.randn(k, m).to(dtype).t()):
        want = nm.mbwq_gemm(xx, *args, prepared=prepared)
        got = call(xx, *args)
        assert got.dtype == dtype and torch.equal(got, want)
        if dtype == torch.float32:
            torch.testing.assert_close(got, rw.mbwq_gemm(xx, *args), rtol=1e-4, atol=1e-4)
    # another channel scale than the bound one: the kernel itself (not the bound values)
    cs2 = layer.channel_scale * 2
    a2 = args[:4] + (cs2,) + args[5:]
    assert torch.equal(call(x, *a2), nm.mbwq_gemm(x, *a2, prepared=prepared))
    with torch.no_grad():
        layer.channel_scale.mul_(0.5)                     # the bound one changed in place
    assert torch.equal(call(x, *args), nm.mbwq_gemm(x, *args, prepared=prepared))


@pytest.mark.parametrize("which", ["mpq", "mbwq"])
def test_wq_plans_hand_non_finite_results_to_the_exact_path(which):
    _native()
    from bie_backend_cpu.native import kernels_mbwq as nm
    from bie_backend_cpu.native import kernels_wq as nw
    from bie_backend_cpu.reference import weight_only as rw
    torch.manual_seed(11)
    if which == "mpq":
        layer = bie_core.MPQLinear.from_float(nn.Linear(64, 16), bits=4, group_size=32).eval()
        args = (layer.qweight, layer.scales, layer.zeros, None, layer.bias, 4, 32, "gptq")
        mod, bind, ref = nw, nw.bind_wq_gemm, rw.wq_gemm
        prepared = nw.prepare(*args[:4])
    else:
        layer = _mbwq(64, 16, torch.float32, 3)
        args = (layer.qweight, layer.scales, layer.zeros, layer.q_perm, layer.channel_scale, layer.bias,
                list(layer.group_bits), list(layer.group_rows))
        mod, bind, ref = nm, nm.bind_mbwq_gemm, rw.mbwq_gemm
        prepared = nm.prepare(*args[:4])
    x = torch.randn(3, 64)
    call = bind(x, *args, prepared=prepared)
    fn = mod.wq_gemm if which == "mpq" else mod.mbwq_gemm
    for xx in (x.clone().fill_(3e38), torch.where(torch.rand(3, 64) < 0.1, torch.tensor(float("nan")), x),
               torch.cat([x[:2], torch.full((1, 64), 1e38)])):
        got = call(xx, *args)
        torch.testing.assert_close(got, fn(xx, *args, prepared=prepared), rtol=0, atol=0, equal_nan=True)
        r = ref(xx, *args)
        assert torch.equal(torch.isfinite(got), torch.isfinite(r))


# --------------------------------------------------------------- the layers
def _lean(layer, x):
    with torch.inference_mode():
        y = layer(x)
    assert layer._lean is not None, "the bound inference path was not taken"
    return y


def _grad_path(layer, x):
    return layer(x.clone().requires_grad_()).detach()


@pytest.mark.parametrize("w_bits, a_bits", [(8, 8), (4, 4), (4, 8)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("packed, per_channel", [(False, False), (True, True)])
def test_qconv2d_eval_is_its_training_forward(w_bits, a_bits, dtype, packed, per_channel):
    torch.manual_seed(w_bits * 3 + a_bits)
    layer = QConv2d(6, 10, 3, stride=(1, 2), padding=1, groups=2, bias=True, w_bits=w_bits, a_bits=a_bits,
                    per_channel=per_channel, dtype=dtype)
    x = torch.randn(2, 6, 7, 9).to(dtype)
    layer(x)                                              # initialises both scales
    if packed:
        layer.pack()
    layer.eval()
    for xx in (x, torch.randn(2, 6, 7, 9).to(dtype), x.contiguous(memory_format=torch.channels_last), x[0]):
        want = _grad_path(layer, xx)
        y = _lean(layer, xx)
        assert y.shape == want.shape and torch.equal(y, want)
    with torch.inference_mode():
        rep = explain(layer, x)
    assert set(rep.chosen()) == {"quantize_int", "int_conv2d"}


def test_qconv2d_bound_call_follows_every_change():
    torch.manual_seed(4)
    layer = QConv2d(4, 6, 3, padding=1, bias=True)
    x = torch.randn(1, 4, 6, 6)
    layer(x)
    layer.eval()
    _lean(layer, x)
    lc = layer._lean
    _lean(layer, x)
    assert layer._lean is lc
    for change in (lambda: layer.weight.mul_(-1), lambda: layer.act_scale.mul_(1.7),
                   lambda: layer.act_shift.add_(0.3), lambda: layer.bias.add_(1.0),
                   lambda: layer.weight_scale.mul_(0.5)):
        with torch.no_grad():
            change()
        y = _lean(layer, x)
        assert layer._lean is not lc and torch.equal(y, _grad_path(layer, x))
        lc = layer._lean
    other = QConv2d(4, 6, 3, padding=1, bias=True)
    other(x)
    layer.load_state_dict(other.state_dict())
    assert torch.equal(_lean(layer, x), _grad_path(other.eval(), x))
    _lean(layer, torch.randn(3, 4, 5, 5))                 # another input shape: bound again
    with pytest.raises(ValueError, match="QConv2d.*channels"):
        with torch.inference_mode():
            layer(torch.randn(1, 5, 6, 6))


def test_qconv2d_takes_a_preferred_kernel_without_a_plan(fresh_bie):
    """A higher-priority int_conv2d kernel with no bind: the bound path calls it (no fused plan around it)."""
    from bie_backend_cpu.reference import integer as ri
    calls = []

    def conv(*args):
        calls.append(1)
        return ri.int_conv2d(*args)

    class P:
        @hookimpl
        def bie_register_kernels(self, registry):
            registry.register("int_conv2d", conv, name="plain", priority=900,
                              capability=Capability(devices=("cpu",)))
    bie_core.register_backend(BackendDescriptor("plainconv", "1.0", ("cpu",), load=P))
    torch.manual_seed(6)
    layer = QConv2d(4, 6, 3, padding=1, bias=True)
    x = torch.randn(1, 4, 6, 6)
    layer(x)
    layer.eval()
    calls.clear()
    y = _lean(layer, x)
    _lean(layer, x)
    assert len(calls) >= 2
    with torch.inference_mode():
        assert explain(layer, x).chosen()["int_conv2d"] == "plainconv:plain"
    assert torch.equal(y, _grad_path(layer, x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_qlinear_fused_eval_is_its_training_forward(dtype):
    torch.manual_seed(8)
    for w_bits, a_bits, per_channel in ((8, 8, False), (4, 4, True), (8, 4, True)):
        layer = QLinear(37, 19, w_bits, a_bits, bias=True, per_channel=per_channel, dtype=dtype)
        x = torch.randn(5, 37).to(dtype)
        layer(x)
        layer.eval()
        for xx in (x, torch.randn(2, 3, 37).to(dtype) * 9, torch.randn(1, 37).to(dtype)):
            assert torch.equal(_lean(layer, xx), _grad_path(layer, xx))
        with torch.no_grad():
            layer.act_scale.mul_(2.0)
        assert torch.equal(_lean(layer, x), _grad_path(layer, x))


def test_isa_level_change_binds_again():
    _native()
    from bie_backend_cpu import native
    levels = native.available_levels()
    if len(levels) < 2:
        pytest.skip("one ISA level only")
    torch.manual_seed(9)
    lin, conv = QLinear(40, 12, bias=True), QConv2d(4, 6, 3, padding=1, bias=True)
    x, xc = torch.randn(2, 40), torch.randn(1, 4, 5, 5)
    lin(x), conv(xc)
    lin.eval(), conv.eval()
    want = _lean(lin, x), _lean(conv, xc)
    try:
        for lvl in levels:
            native.set_level(lvl)
            assert torch.equal(_lean(lin, x), want[0]) and torch.equal(_lean(conv, xc), want[1])
    finally:
        native.set_level(None)


def test_plans_threaded_and_without_the_gil():
    """Sizes past the GIL-release threshold, on 2 threads: the same results as the reference."""
    nk, ri = _native(), _ref()
    from bie_backend_cpu.native import kernels_wq as nw
    from bie_backend_cpu.reference import weight_only as rw
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.Generator().manual_seed(21)
        m, k, n = 33, 300, 70
        b = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
        x, sa, sh = torch.randn(m, k, generator=g) * 4, torch.tensor(0.03), torch.randn(k, generator=g)
        quant = nk.bind_quantize_int(x, sa, 8, sh, None)
        gemm = nk.bind_int_gemm(quant(x, sa, 8, sh, None), b, 8, 8, sa, None, torch.float32, prepared=nk.prepare(b))
        plan = gemm.fuse_quantized_input(quant, sa, 8, sh, sa, None)
        assert torch.equal(plan(x), ri.int_gemm(ri.quantize_int(x, sa, 8, sh), b, 8, 8, sa, None, torch.float32))
        if nk._lib.bie_int_layout() != nk.INT_ROWS:
            w = torch.randint(-8, 8, (24, 16, 3, 3), dtype=torch.int8, generator=g)
            xc, shc = torch.randn(2, 16, 12, 12, generator=g), torch.randn(16, generator=g)
            xs = xc + shc.view(1, -1, 1, 1)
            q2 = nk.bind_quantize_int(xs, sa, 4, None, None)
            geom = ([1, 1], [1, 1], [1, 1], 1)
            conv = nk.bind_int_conv2d(q2(xs, sa, 4, None, None), w, 4, 4, *geom, sa, None, torch.float32,
                                      prepared=nk.prepare(w))
            p2 = conv.fuse_quantized_input(q2, sa, 4, shc, sa, None)
            assert torch.equal(p2(xc), ri.int_conv2d(ri.quantize_int(xs, sa, 4), w, 4, 4, *geom, sa, None,
                                                     torch.float32))
        layer = bie_core.MPQLinear.from_float(nn.Linear(512, 96), bits=4, group_size=128).eval()
        x = torch.randn(64, 512, generator=g)
        args = (x, layer.qweight, layer.scales, layer.zeros, None, layer.bias, 4, 128, "gptq")
        prepared = nw.prepare(*args[1:5])
        call = nw.bind_wq_gemm(*args, prepared=prepared)
        assert torch.equal(call(*args), nw.wq_gemm(*args, prepared=prepared))
        torch.testing.assert_close(call(*args), rw.wq_gemm(*args), rtol=1e-4, atol=1e-4)
    finally:
        torch.set_num_threads(threads)


def test_qconv2d_bad_unbatched_input_is_refused_by_the_layer():
    layer = QConv2d(4, 6, 3, padding=1)
    layer(torch.randn(1, 4, 6, 6))
    layer.eval()
    with pytest.raises(ValueError, match=r"QConv2d.*5 channels; expected 4"):
        with torch.inference_mode():
            layer(torch.randn(5, 6, 6))
    with pytest.raises(ValueError, match="QConv2d.*too small"):
        with torch.inference_mode():
            layer(torch.randn(4, 1, 1)[:, :0])


# ------------------------------------------------------------ BinaryConvPlan
@pytest.mark.parametrize("n, c, o, hw, k, stride, padding, dilation, groups", [
    (1, 16, 16, (8, 8), (3, 3), (1, 1), (1, 1), (1, 1), 1), (2, 3, 5, (7, 9), (3, 2), (2, 1), (0, 1), (1, 2), 1),
    (1, 130, 4, (5, 5), (1, 1), (1, 1), (0, 0), (1, 1), 2), (3, 8, 8, (6, 5), (3, 3), (1, 2), (2, 1), (2, 1), 4)])
@pytest.mark.parametrize("dtype", DTYPES + (torch.int8,))
@pytest.mark.parametrize("pad_value", [-1.0, 0.0, 1.0])
def test_binary_conv_plan_is_the_reference(n, c, o, hw, k, stride, padding, dilation, groups, dtype, pad_value):
    nk = _native()
    from bie_backend_cpu.reference import binary as rb
    g = torch.Generator().manual_seed(n * 100 + c + o + int(pad_value))
    kk = c // groups * k[0] * k[1]
    w = rb.pack_signs(torch.randn(o, kk, generator=g))
    prepared = nk.prepare(w)
    geom = (list(k), list(stride), list(padding), list(dilation), groups, pad_value)
    out_dtype = torch.float32 if dtype == torch.int8 else dtype
    for scale, bias, od in ((torch.rand((), generator=g) + 0.1, torch.randn(o, generator=g), out_dtype),
                            (torch.rand(o, generator=g) + 0.1, None, torch.float32), (None, None, None)):
        x = (torch.randn((n, c) + hw, generator=g) * 3).to(dtype) if dtype != torch.int8 else \
            torch.randint(-3, 3, (n, c) + hw, dtype=torch.int8, generator=g)
        call = nk.bind_binary_conv2d(x, w, *geom, scale, bias, od, prepared=prepared)
        assert call is not None
        for xx in (x, x.contiguous(memory_format=torch.channels_last), x.transpose(2, 3).contiguous().transpose(2, 3)):
            want = rb.binary_conv2d(xx, w, *geom, scale, bias, od)
            got = call(xx, w, *geom, scale, bias, od)
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


def test_binary_conv_bind_takes_the_kernel_for_other_epilogues():
    nk = _native()
    from bie_backend_cpu.reference import binary as rb
    g = torch.Generator().manual_seed(3)
    w = rb.pack_signs(torch.randn(6, 4 * 9, generator=g))
    x = torch.randn(1, 4, 5, 5, generator=g)
    geom = ([3, 3], [1, 1], [1, 1], [1, 1], 1, -1.0)
    scale, bias = torch.tensor(0.3), torch.randn(6, generator=g)
    call = nk.bind_binary_conv2d(x, w, *geom, scale, bias, torch.float32, prepared=nk.prepare(w))
    for s2, b2 in ((scale * 2, bias), (scale, bias + 1)):
        assert torch.equal(call(x, w, *geom, s2, b2, torch.float32), rb.binary_conv2d(x, w, *geom, s2, b2, torch.float32))
    bias.add_(1.0)                                        # the bound bias changed in place
    assert torch.equal(call(x, w, *geom, scale, bias, torch.float32),
                       rb.binary_conv2d(x, w, *geom, scale, bias, torch.float32))
    assert nk.bind_binary_conv2d(x, w, *geom[:5], 0.5, scale, bias, torch.float32) is None   # a pad value it refuses


# ------------------------------------------------------------ DynLinearPlan
SCHEMES = (("per_tensor_affine", False), ("per_tensor_affine", True), ("per_token_symmetric", False))


def _dyn_plan(x, w, ws, bias, scheme, rr):
    _native()
    from bie_backend_cpu.native import kernels as nk
    from bie_backend_cpu.native import kernels_dynamic as nd
    if nk._lib.bie_int_layout() == nk.INT_ROWS:
        pytest.skip("the portable level has no dynamic plan (the reference serves)")
    call = nd.bind_dynamic_int8_linear(x, w, ws, bias, scheme, rr, prepared=nk.prepare(w))
    assert call is not None
    return call


def _dyn_inputs(m, k, g, dtype):
    """Random rows, then the edges of the scale rules (torch's zero-point rule, the small-scale rule, one
    sign, ties of the per-token division, a strided and a transposed view)."""
    yield (torch.randn(m, k, generator=g) * 3 + 0.4).to(dtype)
    yield (torch.randn(m, k, generator=g) * 5e3).to(dtype)
    yield torch.zeros(m, k, dtype=dtype)
    yield (torch.rand(m, k, generator=g) + 0.5).to(dtype)
    yield (-torch.rand(m, k, generator=g) - 0.5).to(dtype)
    yield (torch.randn(m, k, generator=g) * 1e-6).to(dtype)
    yield (torch.rand(m, k, generator=g) * 1e-6).to(dtype)
    yield (torch.randint(-254, 255, (m, k), generator=g).float() / 8).to(dtype)
    yield (torch.randn(m, k + 3, generator=g)).to(dtype)[:, 1:k + 1]
    yield (torch.randn(k, m, generator=g)).to(dtype).t()


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (1, 7, 5), (3, 33, 17), (16, 130, 64), (5, 1000, 257),
                                     (300, 37, 19), (2, 8191, 9)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dynamic_plan_is_the_reference(m, k, n, dtype):
    from bie_backend_cpu.reference import dynamic as rd
    g = torch.Generator().manual_seed(m * 7919 + k * 31 + n)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    for i, (scheme, rr) in enumerate(SCHEMES):
        ws = torch.rand(n if i != 1 else 1, generator=g) * 0.02 + 1e-3
        bias = None if i == 2 else torch.randn(n, generator=g).to(dtype if i else torch.float32)
        x0 = torch.randn(m, k, generator=g).to(dtype)
        call = _dyn_plan(x0, w, ws, bias, scheme, rr)
        for x in _dyn_inputs(m, k, g, dtype):
            want = rd.dynamic_int8_linear(x, w, ws, bias, scheme, rr)
            got = call.input_plan(x, True)
            assert got.dtype == dtype and got.shape == (m, n) and torch.equal(got, want), (scheme, rr)
            assert torch.equal(call(x, w, ws, bias, scheme, rr), want)


@pytest.mark.parametrize("scheme, rr", SCHEMES)
def test_dynamic_plan_non_finite_inputs(scheme, rr):
    """With ``check`` the plan declines (None: the layer raises its error); without, the op's NaN outputs."""
    from bie_backend_cpu.reference import dynamic as rd
    g = torch.Generator().manual_seed(3)
    m, k, n = 4, 40, 9
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    ws, bias = torch.rand(n, generator=g) * 0.01 + 1e-3, torch.randn(n, generator=g)
    call = _dyn_plan(torch.randn(m, k), w, ws, bias, scheme, rr)
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = torch.randn(m, k, generator=g)
        x[2, 5] = bad
        assert call.input_plan(x, True) is None
        got, want = call.input_plan(x, False), rd.dynamic_int8_linear(x, w, ws, bias, scheme, rr)
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        assert got[2].isnan().all() and (torch.isfinite(got[[0, 1, 3]]).all() if scheme == "per_token_symmetric"
                                         else got.isnan().all())
    x = torch.randn(m, k, generator=g)
    assert torch.equal(call.input_plan(x, True), rd.dynamic_int8_linear(x, w, ws, bias, scheme, rr))


def test_dynamic_plan_takes_the_kernel_for_other_epilogues_and_refuses_bad_input():
    from bie_backend_cpu.reference import dynamic as rd
    g = torch.Generator().manual_seed(4)
    w = torch.randint(-127, 128, (12, 30), dtype=torch.int8, generator=g)
    ws, bias = torch.rand(12, generator=g) * 0.01 + 1e-3, torch.randn(12, generator=g)
    x = torch.randn(3, 30, generator=g)
    call = _dyn_plan(x, w, ws, bias, "per_tensor_affine", False)
    other = torch.randn(12, generator=g)
    assert torch.equal(call(x, w, ws, other, "per_tensor_affine", False),
                       rd.dynamic_int8_linear(x, w, ws, other, "per_tensor_affine", False))
    bias.add_(1.0)                                   # changed in place: the kernel, with the new values
    assert torch.equal(call(x, w, ws, bias, "per_tensor_affine", False),
                       rd.dynamic_int8_linear(x, w, ws, bias, "per_tensor_affine", False))
    with pytest.raises(ValueError, match="dynamic_int8_linear plan.*dtype"):
        call.input_plan(x.double())
    with pytest.raises(ValueError, match=r"dynamic_int8_linear plan.*\(M, 30\)"):
        call.input_plan(torch.randn(3, 31))


def _dyn_layer(scheme, rr, dtype, per_channel=True, bias=True, k=37, n=19, seed=0):
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias).to(dtype)
    return bie_core.DynamicQLinear.from_float(lin, per_channel=per_channel, act_scheme=scheme,
                                              reduce_range=rr).eval()


@pytest.mark.parametrize("scheme, rr", SCHEMES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_dynamic_layer_eval_is_its_training_forward(scheme, rr, dtype):
    _native()
    for per_channel, bias in ((True, True), (False, False)):
        layer = _dyn_layer(scheme, rr, dtype, per_channel, bias)
        for xx in (torch.randn(5, 37).to(dtype), torch.randn(2, 3, 37).to(dtype) * 9, torch.randn(37).to(dtype),
                   torch.randn(1, 37).to(dtype), torch.randn(40, 37).to(dtype)[::2]):
            want = _grad_path(layer, xx)
            y = _lean(layer, xx)
            assert type(layer._lean.call).__name__ == "DynLinearPlan"
            assert y.shape == want.shape and y.dtype == dtype and torch.equal(y, want)
            with torch.no_grad():                     # grad mode on, nothing needing a gradient: bound too
                assert torch.equal(layer(xx), want)
    with torch.inference_mode():
        assert explain(layer, xx).chosen() == {"dynamic_int8_linear": "cpu:native.dynamic_int8_linear"}


def test_dynamic_layer_bound_call_follows_every_change():
    _native()
    layer = _dyn_layer("per_tensor_affine", False, torch.float32, seed=5)
    x = torch.randn(4, 37)
    _lean(layer, x)
    lc = layer._lean
    _lean(layer, x)
    assert layer._lean is lc
    for change in (lambda: layer.qweight.neg_(), lambda: layer.weight_scale.mul_(1.5),
                   lambda: layer.bias.add_(1.0), lambda: setattr(layer, "act_scheme", "per_token_symmetric")):
        with torch.no_grad():
            change()
        want = _grad_path(layer, x)
        y = _lean(layer, x)
        assert layer._lean is not lc and torch.equal(y, want)
        lc = layer._lean
    other = _dyn_layer("per_tensor_affine", False, torch.float32, seed=6)
    layer.act_scheme = "per_tensor_affine"
    layer.load_state_dict(other.state_dict())
    layer._lean = None
    assert torch.equal(_lean(layer, x), _grad_path(other, x))
    x[1, 3] = float("nan")                            # non-finite input: the documented error, from the bound path
    with pytest.raises(ValueError, match=r"DynamicQLinear\(37, 19\): the input has 1 non-finite"):
        with torch.inference_mode():
            layer(x)
    layer.check_finite = False
    with torch.inference_mode():
        assert layer(x).isnan().all()
    with pytest.raises(ValueError, match=r"DynamicQLinear\(37, 19\): input of shape \(2, 36\)"):
        with torch.inference_mode():
            layer(torch.randn(2, 36))
    with bie_core.use_backend("cpu:reference.dynamic_int8_linear"):       # another preference: bound again, the reference's call
        with torch.inference_mode():
            y = layer(torch.randn(3, 37))
        assert type(layer._lean.call).__name__ != "DynLinearPlan" and y.shape == (3, 19)


def test_dynamic_layer_copies_moves_and_grad_leave_no_bound_call():
    import copy
    import pickle
    _native()
    layer = _dyn_layer("per_token_symmetric", False, torch.float32, seed=7)
    x = torch.randn(3, 37)
    want = _lean(layer, x)
    for clone in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert clone._lean is None and clone.act_scheme == "per_token_symmetric"
        assert torch.equal(_lean(clone, x), want)
    layer.to(torch.float32)
    assert layer._lean is None
    xg = x.clone().requires_grad_()
    layer(xg).sum().backward()                        # the training path: the autograd Function, no bound call
    assert layer._lean is None and xg.grad is not None


def test_dynamic_layer_at_every_isa_level():
    _native()
    from bie_backend_cpu import native
    from bie_backend_cpu.reference import dynamic as rd
    layer = _dyn_layer("per_tensor_affine", True, torch.bfloat16, seed=8)
    x = torch.randn(6, 37).to(torch.bfloat16)
    want = rd.dynamic_int8_linear(x, layer.qweight, layer.weight_scale, layer.bias, "per_tensor_affine", True)
    try:
        for lvl in native.available_levels():
            native.set_level(lvl)
            assert torch.equal(_lean(layer, x), want), lvl
            plan = type(layer._lean.call).__name__ == "DynLinearPlan"
            assert plan == (lvl != "portable"), lvl     # the portable level: the reference, through the kernel
    finally:
        native.set_level(None)

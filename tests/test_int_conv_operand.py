"""The codes of a QConv2d's input written with PyTorch ops (``ops.quantize_operand``) and the compiled QConv2d
forward that makes them in its graph (``INT_OPERAND_DTYPES``): the codes equal ``quantize_int``'s bit for bit (ties,
near-ties, the code range, NaN, infinities, signed zeros, subnormals; float32 and bfloat16), also as Inductor
compiles them fused behind the float32 value of the kernel before; the compiled layer's route where a native kernel
serves int_conv2d (CPU: bie-backend-cpu's), equal to the eager layer, and not taken elsewhere (float16, or a dtype
``INT_OPERAND_DTYPES`` leaves out: by default the CPU takes it for bfloat16 inputs only)."""
import os
import sys

import pytest
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from _compiled_graph import graph_code  # noqa: E402

import bie_core  # noqa: E402
import bie_core.layers.integer as layer_integer  # noqa: E402
from bie_core import dispatch, ops  # noqa: E402
from bie_core.ops.integer import _round_bf16_bits, quantize_operand  # noqa: E402


def _edge_x(shape, scale: float, gen) -> torch.Tensor:
    """Values on the rounding ties of v / scale and next to them, beyond the code range, and the special ones."""
    x = torch.randn(shape, generator=gen) * 40 * scale
    flat = x.view(-1)
    n = flat.numel()
    idx = torch.randperm(n, generator=gen)
    k = torch.randint(-140, 140, (n,), generator=gen).float()
    ties = idx[: n // 4]
    flat[ties] = ((k[ties] + 0.5) * scale)
    near = idx[n // 4: n // 2]
    flat[near] = torch.nextafter((k[near] + 0.5) * scale, torch.tensor(float("inf")))
    special = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-40, -1e-40, 3e38, -3e38])
    flat[idx[n // 2: n // 2 + special.numel()]] = special[: min(special.numel(), n - n // 2)]
    return x


def _reference_codes(x, shift, scale, bits):
    """quantize_int on the (N, H, W, C) view: the shift is one value per element of the last dim there."""
    xl = x.permute(0, 2, 3, 1).contiguous()
    return ops.quantize_int(xl, scale, bits, shift).permute(0, 3, 1, 2)


def test_round_bf16_bits_is_the_conversion():
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-(1 << 31), (1 << 31) - 1, (1 << 16,), generator=gen, dtype=torch.int64).to(torch.int32)
    edges = torch.tensor([0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF,
                          0x00000001, 0x00008000, 0x00018000, 0x3F808000, 0x3F818000, 0x3F807FFF],
                         dtype=torch.int64).to(torch.int32)
    for b in (bits, edges, edges | torch.tensor(-(1 << 31), dtype=torch.int32)):
        v = b.view(torch.float32)
        want = v.to(torch.bfloat16).float()
        got = _round_bf16_bits(v)
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan)
        assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("with_shift", [False, True])
def test_codes_equal_quantize_int(dtype, bits, with_shift):
    gen = torch.Generator().manual_seed(bits * 10 + with_shift + (dtype is torch.bfloat16) * 100)
    for scale in (0.0371, 1.0, 3.0e-3):
        s = torch.tensor(scale)
        x = _edge_x((2, 16, 7, 5), scale, gen).to(dtype)
        shift = (torch.randn(16, generator=gen) * 0.4 * scale) if with_shift else None
        got = quantize_operand(x, shift, s, bits)
        assert got.dtype == torch.int8
        assert torch.equal(got, _reference_codes(x, shift, s, bits))
        xl = x.contiguous(memory_format=torch.channels_last)
        gl = quantize_operand(xl, shift, s, bits)
        assert gl.is_contiguous(memory_format=torch.channels_last) and torch.equal(gl, got)
    # a bfloat16 scale parameter: the op divides by its float32 value
    if dtype is torch.bfloat16:
        sb = torch.tensor(0.0371, dtype=torch.bfloat16)
        assert torch.equal(quantize_operand(x, None, sb, bits), _reference_codes(x, None, sb, bits))


def test_compiled_codes_equal_the_op_on_the_stored_value():
    """Inductor fuses the codes into the kernel of a BatchNorm-like affine and ReLU in bfloat16: they are the codes
    of that kernel's bfloat16 output, as the same kernel compiled alone stores it (its float32 value rounded, and the
    shift's add rounded, as the op rounds them)."""
    gen = torch.Generator().manual_seed(3)
    c = 32
    a = (torch.rand(c, generator=gen) + 0.5).to(torch.bfloat16).view(1, c, 1, 1)
    b = (torch.randn(c, generator=gen) * 0.3).to(torch.bfloat16).view(1, c, 1, 1)
    shift = (torch.randn(c, generator=gen) * 0.05)
    s = torch.tensor(0.0123)

    def before(x):
        return torch.relu(x * a + b)

    def route(x):
        return quantize_operand(before(x), shift, s, 8)

    torch._dynamo.reset()
    stored = torch.compile(before, fullgraph=True)
    fused = torch.compile(route, fullgraph=True)
    for shape in ((2, c, 9, 9), (1, c, 13, 6)):
        x = (torch.randn(shape, generator=gen) * 2).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
        assert torch.equal(fused(x), _reference_codes(stored(x), shift, s, 8))


# ------------------------------------------------------------------ the compiled layer's route
class _Block(nn.Module):
    """Two QConv2d with a BatchNorm, ReLU and a residual add between them."""

    def __init__(self, bits: int):
        super().__init__()
        self.c1 = bie_core.QConv2d(32, 32, 3, padding=1, w_bits=bits, a_bits=bits)
        self.bn = nn.BatchNorm2d(32)
        self.c2 = bie_core.QConv2d(32, 16, 3, stride=2, padding=1, w_bits=bits, a_bits=bits, bias=True)

    def forward(self, x):
        return self.c2(torch.relu(self.bn(self.c1(x))) + x)


@pytest.fixture
def cpu_route(monkeypatch):
    """The route on the CPU for float32 and bfloat16 inputs (bie-backend-cpu's native int_conv2d serves the codes
    there)."""
    monkeypatch.setattr(layer_integer, "INT_OPERAND_DTYPES", {"cpu": (torch.float32, torch.bfloat16)})
    dispatch.clear_caches()
    yield
    dispatch.clear_caches()


def _block(bits: int, dtype, seed: int):
    torch.manual_seed(seed)
    m = _Block(bits)
    x = torch.randn(2, 32, 9, 9)
    m(x)
    m.eval()
    with torch.no_grad():
        for q in (m.c1, m.c2):
            q.act_shift.normal_(0, 0.05)
    return m.to(dtype), x.to(dtype)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_route_takes_the_codes_where_a_kernel_serves_them(cpu_route, bits, dtype):
    m, x = _block(bits, dtype, bits)
    if not layer_integer._int_operand_served("cpu", None, 32, 32, (3, 3), (1, 1), (1, 1), (1, 1), 1, bits, bits,
                                             dtype, ""):
        pytest.skip("no native int_conv2d kernel on the CPU here (bie-backend-cpu's native kernels not built)")
    for fmt in (torch.contiguous_format, torch.channels_last):
        xf = x.contiguous(memory_format=fmt)
        with torch.no_grad():
            ref = m(xf)
        code, y = graph_code(m, xf)
        assert code.count("int_conv2d_codes_eval") == 2 and "int_conv2d_eval" not in code, code
        assert torch.equal(y, ref)
    with torch.no_grad():
        # Inductor, batch sizes in turn (the recompile with a dynamic batch keeps the route: its question takes
        # constants): equal to the model compiled without the route, whose BatchNorm, ReLU and add store their
        # rounded output for int_conv2d_eval to quantize
        torch._dynamo.reset()
        compiled = torch.compile(m, fullgraph=True)
        outs = [compiled(xb) for xb in (x, torch.cat([x, x[:1]]), x[:1])]
        torch._dynamo.reset()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(layer_integer, "INT_OPERAND_DTYPES", {})
            plain = torch.compile(m, fullgraph=True)
            for xb, y in zip((x, torch.cat([x, x[:1]]), x[:1]), outs):
                assert torch.equal(y, plain(xb))
        torch._dynamo.reset()
        x1 = x[:1].contiguous(memory_format=torch.channels_last)
        ref1 = m.c1(x1)
        y1 = torch.compile(m.c1, fullgraph=True)(x1)   # inductor: the codes' ops in a kernel of their own
        assert torch.equal(y1, ref1) and y1.is_contiguous(memory_format=torch.channels_last)
        # a changed latent weight: the op derives the codes of the new version
        m.c2.weight.neg_()
        ref2 = m(x)
        assert torch.equal(graph_code(m, x)[1], ref2)
    bie_core.pack(m)
    with torch.no_grad():
        assert torch.equal(graph_code(m, x)[1], ref2)


def test_default_route_on_the_cpu_takes_bfloat16_only():
    """By default (INT_OPERAND_DTYPES, by measured speed) the CPU quantizes a bfloat16 input in the graph and
    keeps int_conv2d_eval for float32."""
    for dtype, routed in ((torch.bfloat16, True), (torch.float32, False)):
        m, x = _block(8, dtype, 7)
        code, y = graph_code(m.c1, x)
        assert ("int_conv2d_codes_eval" in code) is routed and ("int_conv2d_eval" in code) is not routed, code
        with torch.no_grad():
            assert torch.equal(y, m.c1(x))


def test_compiled_route_keeps_int_conv2d_eval_elsewhere(cpu_route, monkeypatch):
    """float16 input (not rounded by the operand's ops), or a dtype the route's table leaves out: the compiled layer
    calls int_conv2d_eval as before."""
    m, x = _block(8, torch.float16, 5)
    code, _ = graph_code(m.c1, x)
    assert "int_conv2d_codes_eval" not in code and "int_conv2d_eval" in code
    monkeypatch.setattr(layer_integer, "INT_OPERAND_DTYPES", {"cpu": (torch.bfloat16,)})
    m, x = _block(8, torch.float32, 6)
    code, y = graph_code(m, x)
    assert "int_conv2d_codes_eval" not in code and code.count("int_conv2d_eval") == 2
    with torch.no_grad():
        assert torch.equal(y, m(x))
    assert layer_integer._int_operand_served("cpu", None, 32, 32, (3, 3), (1, 1), (1, 1), (1, 1), 1, 8, 8,
                                             torch.float32, "") is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("bits", [4, 8])
def test_cuda_compiled_route_equals_the_model_compiled_without_it(monkeypatch, bits):
    """On a GPU (Triton's kernels: the float64 division, the roundings on the bits): a bfloat16 channels_last block
    compiled with the route, default and replayed from CUDA graphs, equals the block compiled without it."""
    torch.manual_seed(bits)
    block = nn.Sequential(bie_core.QConv2d(64, 64, 3, padding=1, w_bits=bits, a_bits=bits), nn.BatchNorm2d(64),
                          nn.ReLU(), bie_core.QConv2d(64, 32, 3, stride=2, padding=1, w_bits=bits, a_bits=bits))
    block = block.cuda()
    x = torch.randn(8, 64, 14, 14, device="cuda").contiguous(memory_format=torch.channels_last)
    block(x)
    block.eval()
    with torch.no_grad():
        block[1].running_mean.normal_(0, 0.2)
        for q in (block[0], block[3]):
            q.act_shift.normal_(0, 0.05)
    block = block.to(torch.bfloat16)
    xb = x.to(torch.bfloat16)
    monkeypatch.setattr(layer_integer, "INT_OPERAND_DTYPES", {})
    torch._dynamo.reset()
    with torch.no_grad():
        want = torch.compile(block, fullgraph=True)(xb)
    monkeypatch.setattr(layer_integer, "INT_OPERAND_DTYPES", {"cuda": (torch.bfloat16,)})
    if not layer_integer._int_operand_served("cuda", torch.cuda.current_device(), 64, 64, (3, 3), (1, 1), (1, 1),
                                             (1, 1), 1, bits, bits, torch.bfloat16, ""):
        pytest.skip("no native int_conv2d kernel for CUDA tensors here")
    code, _ = graph_code(block, xb)
    assert code.count("int_conv2d_codes_eval") == 2, code
    for mode in ("default", "reduce-overhead"):
        torch._dynamo.reset()
        f = torch.compile(block, fullgraph=True, mode=mode)
        with torch.no_grad():
            for _ in range(3):
                y = f(xb).clone()
        assert torch.equal(y, want), mode

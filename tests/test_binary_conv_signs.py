"""``binary_conv2d_signs`` (the binary conv on a padded sign operand) and the compiled BinaryConv2d forward that
makes the operand in its graph: the operand's format, the op against ``binary_conv2d``, its bad input, the quiet
question the layer asks the dispatcher, and a compiled model's route (CPU: the reference stands in for a native
kernel by declaring itself one in a test backend)."""
import os
import sys

import pytest
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from _compiled_graph import graph_code  # noqa: E402

import bie_core  # noqa: E402
import bie_core.layers.binary as layer_binary  # noqa: E402
from bie_core import dispatch, ops  # noqa: E402
from bie_core.backend_api import Capability  # noqa: E402
from bie_core.ops.binary import packed_len, sign_operand, signs_problem  # noqa: E402

# (N, C, H, W, O, kernel, stride, padding, dilation)
SHAPES = [
    (2, 8, 7, 5, 4, (3, 3), (1, 1), (1, 1), (1, 1)),
    (1, 16, 9, 6, 6, (3, 2), (2, 1), (2, 0), (1, 1)),
    (1, 24, 12, 12, 5, (3, 3), (1, 1), (2, 2), (2, 2)),
    (3, 64, 5, 5, 8, (1, 1), (1, 1), (0, 0), (1, 1)),
    (1, 8, 1, 2, 3, (3, 3), (1, 1), (3, 3), (1, 1)),   # padding wider than the kernel's reach
]


def _x(shape, dtype, gen):
    x = torch.randn(shape, generator=gen)
    flat = x.view(-1)
    idx = torch.randperm(flat.numel(), generator=gen)[:max(3, flat.numel() // 20)]
    flat[idx[0::3]] = 0.0
    flat[idx[1::3]] = -0.0
    flat[idx[2::3]] = float("nan")
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_operand_holds_signs_complements_and_the_ring(dtype):
    gen = torch.Generator().manual_seed(1)
    x = _x((2, 16, 3, 4), dtype, gen)
    shift = (torch.randn(16, generator=gen) * 0.5).to(dtype)
    shift[0] = -x[0, 0, 0, 0]                       # x + shift exactly 0 there: +1
    for pad_value, ring in ((-1.0, 0), (1.0, 255)):
        xs = sign_operand(x, shift, (1, 2), pad_value)
        assert xs.dtype == torch.uint8 and xs.shape == (2, 5, 8, 4) and xs.is_contiguous()
        inner = xs[:, 1:4, 2:6]
        bits = ops.pack_signs((x + shift.view(1, -1, 1, 1)).permute(0, 2, 3, 1).contiguous())
        assert torch.equal(inner[..., :2], bits) and torch.equal(inner[..., 2:], 255 - bits)
        assert int(inner[0, 0, 0, 0]) & 1 == 1
        ring_mask = torch.ones(5, 8, dtype=torch.bool)
        ring_mask[1:4, 2:6] = False
        assert bool((xs[:, ring_mask][..., :2] == ring).all()) and bool((xs[:, ring_mask][..., 2:] == 255 - ring).all())


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:5])))
def test_equals_binary_conv2d_on_the_operand(shape):
    """binary_conv2d_signs(sign_operand(x, shift, padding, pad)) is binary_conv2d(x, ..., shift) bit for bit: counts
    and every float epilogue, in the channels_last format."""
    n, c, h, w_, o, ks, st, pd, dl = shape
    gen = torch.Generator().manual_seed(hash(shape) % 2 ** 31)
    k = c * ks[0] * ks[1]
    wb = torch.randint(0, 256, (o, packed_len(k)), generator=gen, dtype=torch.uint8)
    for i, dtype in enumerate((torch.float32, torch.bfloat16, torch.float16)):
        x = _x((n, c, h, w_), dtype, gen)
        shift = (torch.randn(c, generator=gen) * 0.5).to(dtype) if i != 1 else None
        for pad_value in (-1.0, 1.0):
            for scale, bias, out in ((None, None, None), (torch.rand(o, generator=gen) + 0.1,
                                                          torch.randn(o, generator=gen), dtype)):
                ref = ops.binary_conv2d(x, wb, list(ks), list(st), list(pd), list(dl), 1, pad_value, scale, bias,
                                        out, shift)
                y = ops.binary_conv2d_signs(sign_operand(x, shift, pd, pad_value), wb, list(ks), list(st), list(dl),
                                            scale, bias, out)
                assert y.is_contiguous(memory_format=torch.channels_last)
                assert y.dtype == ref.dtype and torch.equal(y, ref), (dtype, pad_value, out)


def test_counts_whatever_the_complement_bytes_hold():
    """The op counts popcount(S & W) + popcount(T & ~W): with T not the complement of S the count is that sum, not
    the signs' dot product (the definition a kernel reading both halves computes)."""
    gen = torch.Generator().manual_seed(3)
    xs = torch.randint(0, 256, (1, 3, 3, 4), generator=gen, dtype=torch.uint8)
    wb = torch.randint(0, 256, (2, packed_len(16 * 9)), generator=gen, dtype=torch.uint8)
    y = ops.binary_conv2d_signs(xs, wb, [3, 3], [1, 1], [1, 1], None, None, None)
    s = ((xs[..., :2].unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1).reshape(9, 16)
    t = ((xs[..., 2:].unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1).reshape(9, 16)
    w01 = ((wb.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1).reshape(2, 16, 9).permute(0, 2, 1)
    for oc in range(2):
        count = int((s * w01[oc]).sum() + (t * (1 - w01[oc])).sum())
        assert int(y[0, oc, 0, 0]) == 2 * count - 144


def test_bad_input_names_the_op_and_the_value():
    xs = torch.zeros(1, 4, 4, 4, dtype=torch.uint8)
    wb = torch.zeros(2, packed_len(16 * 9), dtype=torch.uint8)
    args = ([3, 3], [1, 1], [1, 1], None, None, None)
    with pytest.raises(TypeError, match="binary_conv2d_signs.*xs has dtype int8"):
        ops.binary_conv2d_signs(xs.view(torch.int8), wb, *args)
    with pytest.raises(ValueError, match="binary_conv2d_signs.*an even count; got 3"):
        ops.binary_conv2d_signs(torch.zeros(1, 4, 4, 3, dtype=torch.uint8), wb, *args)
    with pytest.raises(ValueError, match="binary_conv2d_signs.*xs must be contiguous"):
        ops.binary_conv2d_signs(torch.zeros(1, 4, 8, 4, dtype=torch.uint8)[:, :, ::2], wb, *args)
    with pytest.raises(ValueError, match=r"binary_conv2d_signs.*w must be .*\(\.\., 18\)"):
        ops.binary_conv2d_signs(xs, wb[:, :5], *args)
    with pytest.raises(ValueError, match="binary_conv2d_signs.*too small for the kernel"):
        ops.binary_conv2d_signs(torch.zeros(1, 2, 4, 4, dtype=torch.uint8), wb, *args)
    with pytest.raises(ValueError, match="binary_conv2d_signs.*kernel_size, stride and dilation must be > 0"):
        ops.binary_conv2d_signs(xs, wb, [3, 3], [0, 1], [1, 1], None, None, None)


def test_native_kernel_serves_is_quiet_and_follows_the_preference(recwarn):
    """The question a layer asks before tracing its route: False where only the reference serves (no warning,
    nothing raised); True where a non-reference kernel accepts the problem, unless the preference in force leaves
    its backend out."""
    cpu = torch.device("cpu")
    p = signs_problem(cpu, 1, 64, 3, 3, 8, (3, 3), (1, 1), (1, 1), torch.float32)
    assert dispatch.native_kernel_serves(p) is False
    assert dispatch.native_kernel_serves(p, "cpu") is False
    assert not [w for w in recwarn if issubclass(w.category, bie_core.BieFallbackWarning)]


def test_native_kernel_serves_a_test_kernel_unless_the_preference_leaves_it_out(signs_backend):
    p = signs_problem(torch.device("cpu"), 1, 64, 3, 3, 8, (3, 3), (1, 1), (1, 1), torch.float32)
    assert dispatch.native_kernel_serves(p) is True
    assert dispatch.native_kernel_serves(p, "cpu") is False
    with bie_core.use_backend("cpu"):
        assert dispatch.native_kernel_serves(p) is False


# ------------------------------------------------------------------ the compiled layer's route
class _Block(nn.Module):
    """Two binary convs with a BatchNorm, ReLU and a residual add between them (a binary net's block)."""

    def __init__(self):
        super().__init__()
        self.c1 = bie_core.BinaryConv2d(64, 64, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(64)
        self.c2 = bie_core.BinaryConv2d(64, 16, 3, stride=2, padding=1, pad_value=1.0)

    def forward(self, x):
        return self.c2(torch.relu(self.bn(self.c1(x))) + x)


@pytest.fixture
def signs_backend(monkeypatch):
    """A loaded backend "signs_test" whose binary_conv2d_signs kernel is the reference declared as a native kernel
    (the CPU has none), and the CPU among the route's devices: the layer's question then says yes on the CPU."""
    reg = dispatch._REG
    k = reg.reference_kernel("binary_conv2d_signs").replace(backend="signs_test", name="signs_test_kernel",
                                                            reference=False, priority=500,
                                                            capability=Capability(devices=("cpu",)))
    before = list(reg.kernels("binary_conv2d_signs"))
    monkeypatch.setitem(reg._kernels, "binary_conv2d_signs", sorted(before + [k], key=lambda q: -q.priority))
    monkeypatch.setattr(layer_binary, "SIGN_OPERAND_DEVICES", ("cuda", "cpu"))
    dispatch.clear_caches()
    yield k
    dispatch.clear_caches()


def test_compiled_route_takes_the_operand_where_a_kernel_serves_it(signs_backend):
    torch.manual_seed(0)
    m = _Block()
    x = torch.randn(2, 64, 9, 9)
    m(x)
    m.eval()
    with torch.no_grad():
        for c in (m.c1, m.c2):
            c.act_shift.normal_(0, 0.2)
        ref = m(x)
    code, y = graph_code(m, x)
    assert code.count("binary_conv2d_signs_eval") == 2 and "binary_conv2d_eval" not in code, code
    assert torch.equal(y, ref)
    with torch.no_grad():
        yi = torch.compile(m, fullgraph=True)(x)          # inductor: the operand's ops fused into its kernels
    assert torch.equal(yi, ref)
    # a changed latent weight: the op derives the signs of the new version
    with torch.no_grad():
        m.c2.weight.neg_()
        ref2 = m(x)
        assert not torch.equal(ref2, ref)
        assert torch.equal(torch.compile(m, fullgraph=True)(x), ref2)
    bie_core.pack(m)
    with torch.no_grad():
        assert torch.equal(torch.compile(m, fullgraph=True)(x), ref2)


def test_compiled_route_keeps_binary_conv2d_elsewhere(signs_backend):
    """Pad value 0, two groups, a channel count not a multiple of 8, or a preference without the serving backend:
    the compiled layer calls binary_conv2d as before."""
    torch.manual_seed(1)
    cases = [(bie_core.BinaryConv2d(64, 16, 3, padding=1, pad_value=0.0), torch.randn(1, 64, 6, 6)),
             (bie_core.BinaryConv2d(64, 16, 3, padding=1, groups=2), torch.randn(1, 64, 6, 6)),
             (bie_core.BinaryConv2d(12, 16, 3, padding=1), torch.randn(1, 12, 6, 6)),
             (bie_core.BinaryConv2d(64, 16, 3, padding=1, backend="cpu"), torch.randn(1, 64, 6, 6))]
    for layer, x in cases:
        layer(x)
        layer.eval()
        with torch.no_grad():
            ref = layer(x)
        code, y = graph_code(layer, x)
        assert "binary_conv2d_signs_eval" not in code and "binary_conv2d_eval" in code, (layer, code)
        assert torch.equal(y, ref)


def _compiled_eval_code(seed: int) -> str:
    """The graph code of a 64-channel BinaryConv2d compiled for inference (its scales set by one training call)."""
    torch.manual_seed(seed)
    layer = bie_core.BinaryConv2d(64, 16, 3, padding=1)
    x = torch.randn(1, 64, 6, 6)
    layer(x)
    layer.eval()
    return graph_code(layer, x)[0]


def test_compiled_route_not_taken_on_the_reference_alone():
    """Without a native kernel for the operand (the CPU backends), the compiled layer keeps binary_conv2d."""
    code = _compiled_eval_code(2)
    assert "binary_conv2d_signs_eval" not in code and "binary_conv2d_eval" in code
    assert layer_binary._sign_operand_served("cpu", None, 64, 16, (3, 3), (1, 1), (1, 1), torch.float32, "") is False


def test_compiled_route_only_on_its_devices(signs_backend, monkeypatch):
    """A device outside SIGN_OPERAND_DEVICES keeps binary_conv2d even where a kernel takes the operand (the CPU:
    inductor's code for the operand is slower there than the native packing)."""
    monkeypatch.setattr(layer_binary, "SIGN_OPERAND_DEVICES", ("cuda",))
    code = _compiled_eval_code(4)
    assert "binary_conv2d_signs_eval" not in code and "binary_conv2d_eval" in code

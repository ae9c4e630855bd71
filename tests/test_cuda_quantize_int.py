"""bie-backend-cuda ``quantize_int`` (csrc/quantize.cu) against the plain-PyTorch reference, bit for bit: every float
dtype, 4 and 8 bits, scales of every broadcast (one value, per row, per output channel, along a middle dim, per
element), shifts in x's dtype and in float32, codes as int8 and as floats, odd sizes and misaligned or strided
inputs, exact ties, values beyond the range, infinities, NaN, signed zeros, subnormals, and scales of zero,
infinity and subnormal size. The bound call (``bind_quantize_int``) computes what the kernel computes.

The scale's run decomposition (pure Python) is checked anywhere; the kernel checks need a CUDA device."""
from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bie_backend_cuda") is None,
                                reason="bie-backend-cuda is not installed")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _ref(x, scale, bits, shift=None, out_dtype=None):
    from bie_backend_cpu.reference.integer import quantize_int
    return quantize_int(x.cpu(), scale.cpu(), bits, None if shift is None else shift.cpu(), out_dtype)


@pytest.mark.parametrize("x_shape, s_shape", [((3, 7), ()), ((3, 7), (3, 1)), ((4, 5, 6), (4, 1, 1)),
                                              ((4, 5, 6), (5, 1)), ((4, 5, 6), (1, 6)), ((4, 5, 6), (4, 5, 6)),
                                              ((2, 3), (1, 1)), ((8, 2, 3, 3), (8, 1, 1, 1))])
def test_scale_runs_cover_every_element(x_shape, s_shape):
    from bie_backend_cuda.integer import scale_runs
    s = torch.rand(s_shape) + 0.1
    values, inner = scale_runs(x_shape, s)
    n = torch.Size(x_shape).numel()
    per_element = values.expand(n) if inner == 0 else values.repeat_interleave(inner)
    assert per_element.shape == (n,)
    assert torch.equal(per_element, s.expand(x_shape).reshape(-1).to(torch.float32))


class _Library:
    """Stands in for the library's quantize_int (the op and the Python module function): the same arguments, the
    codes computed by the reference from the per-element scale the arguments describe."""

    def __init__(self):
        self.calls = 0

    def quantize_int(self, x, values, inner, bits, shift, out_dtype):
        self.calls += 1
        assert x.is_contiguous() and values.dtype == torch.float32 and values.is_contiguous()
        assert shift is None or (shift.dtype == x.dtype and shift.is_contiguous() and shift.numel() == x.shape[-1])
        n = x.numel()
        per_element = values.expand(n) if inner == 0 else values.repeat_interleave(inner)
        assert per_element.numel() == n
        xs = x if shift is None else x + shift
        return _ref(xs.reshape(-1), per_element, bits, None, out_dtype).reshape(x.shape)


@pytest.fixture
def stand_in(monkeypatch):
    from bie_backend_cuda import _build
    lib = _Library()
    monkeypatch.setattr(_build, "ops", lambda: lib)
    monkeypatch.setattr(_build, "direct", lambda: lib)
    return lib


@pytest.mark.parametrize("dtype", FLOATS)
def test_arguments_handed_to_the_library(stand_in, dtype):
    """The Python side (scale runs, shift in x's dtype, contiguous x, one value read by the bound call) gives the
    library what makes the op's result (checked here on a stand-in; the kernel itself on the GPU below)."""
    from bie_backend_cuda.integer import bind_quantize_int, quantize_int
    gen = torch.Generator().manual_seed(FLOATS.index(dtype))
    x = (torch.randn(4, 5, 6, generator=gen) * 9).to(dtype)
    for scale in (torch.tensor(0.3), torch.rand(4, 1, 1, generator=gen) + 0.1, torch.rand(5, 1, generator=gen) + 0.1,
                  torch.rand(6, generator=gen) + 0.1, torch.tensor([[0.2]]).to(dtype)):
        for shift in (None, torch.randn(6, generator=gen), torch.randn(6, generator=gen).to(dtype)):
            for xx in (x, x.transpose(0, 2).contiguous().transpose(0, 2)):   # contiguous, and strided
                want = _ref(xx, scale, 8, shift)
                assert torch.equal(quantize_int(xx, scale, 8, shift), want)
    scale, shift = torch.tensor(0.4), torch.randn(6, generator=gen)
    call = bind_quantize_int(x, scale, 4, shift)
    assert call is not None and call.bie_cuda_quantize == ((4, 5, 6), dtype)
    before = stand_in.calls
    assert torch.equal(call(x, scale, 4, shift), _ref(x, scale, 4, shift))
    assert torch.equal(call(x, torch.tensor(0.9), 4, None, torch.float32), _ref(x, torch.tensor(0.9), 4, None,
                                                                                 torch.float32))
    assert stand_in.calls == before + 2   # one library call each
    assert bind_quantize_int(x, torch.rand(4, 1, 1), 8) is None   # more than one scale value: the kernel serves


def _specials(dtype):
    fin = torch.finfo(dtype)
    v = [0.5, 1.5, -0.5, -1.5, 2.5, -2.5, 6.5, -7.5, 7.5, -8.5, 126.5, 127.5, -128.5, 1e4, -1e4, 0.0, -0.0,
         float("inf"), float("-inf"), float("nan"), fin.tiny, -fin.tiny, fin.tiny / 4, fin.max, -fin.max,
         0.25, 0.75, 1.25, -0.25]
    return torch.tensor(v, dtype=torch.float32).to(dtype)


@needs_cuda
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [4, 8])
def test_quantize_int_matches_the_reference(dtype, bits):
    from bie_backend_cuda.integer import quantize_int
    gen = torch.Generator().manual_seed(bits * 7 + FLOATS.index(dtype))
    cases = []
    for shape in [(1,), (3, 7), (4, 5, 33), (64, 256), (1000003,), (2, 3, 16), (17, 8)]:
        x = (torch.randn(shape, generator=gen) * 40).to(dtype)
        cases.append((x, torch.tensor(0.37)))
        cases.append((x, torch.rand((shape[0],) + (1,) * (len(shape) - 1), generator=gen) + 0.05))
    x = (torch.randn(6, 10, 12, generator=gen) * 20).to(dtype)
    cases += [(x, torch.rand(10, 1, generator=gen) + 0.1), (x, torch.rand(12, generator=gen) + 0.1),
              (x, torch.rand(6, 10, 12, generator=gen) + 0.1)]
    sp = _specials(dtype)
    for s in (0.25, 1.0, 3.0, 0.0, float("inf"), 1e-40, -0.5):   # -0.5: negative scales divide as well
        cases.append((sp, torch.tensor(s)))
    for x, scale in cases:
        got = quantize_int(x.cuda(), scale.cuda(), bits)
        assert got.dtype == torch.int8 and got.is_contiguous()
        assert torch.equal(got.cpu(), _ref(x, scale, bits)), (tuple(x.shape), tuple(scale.shape))


@needs_cuda
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [4, 8])
def test_quantize_int_shift_out_dtype_and_layouts(dtype, bits):
    from bie_backend_cuda.integer import quantize_int
    gen = torch.Generator().manual_seed(bits + 3 * FLOATS.index(dtype))
    for shape in [(5, 24), (3, 7), (2, 3, 16), (9, 1), (4, 1000)]:
        x = (torch.randn(shape, generator=gen) * 6).to(dtype)
        scale = torch.rand((), generator=gen) * 0.3 + 0.05
        for shift in ((torch.randn(shape[-1:], generator=gen) * 2).to(dtype), torch.randn(shape[-1:], generator=gen)):
            got = quantize_int(x.cuda(), scale.cuda(), bits, shift.cuda())
            assert torch.equal(got.cpu(), _ref(x, scale, bits, shift)), shape
        for out_dtype in FLOATS:
            got = quantize_int(x.cuda(), scale.cuda(), bits, None, out_dtype)
            assert got.dtype == out_dtype
            assert torch.equal(got.cpu(), _ref(x, scale, bits, None, out_dtype)), shape
    base = (torch.randn(4 * 64 + 3, generator=gen) * 9).to(dtype).cuda()
    s = torch.tensor(0.2, device="cuda")
    for view in (base[1:257].view(4, 64), base[:256].view(64, 4).t(), base[3:].view(4, 64)[:, ::2]):
        assert torch.equal(quantize_int(view, s, bits).cpu(), _ref(view, s, bits))
    empty = torch.empty(0, 5, dtype=dtype, device="cuda")
    assert quantize_int(empty, s, bits).shape == (0, 5)


@needs_cuda
@pytest.mark.parametrize("dtype", FLOATS)
def test_bound_call_computes_what_the_kernel_computes(dtype):
    from bie_backend_cuda.integer import bind_quantize_int, quantize_int
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(5, 48, generator=gen) * 5).to(dtype).cuda()
    sa = torch.tensor(0.1, device="cuda", dtype=dtype)   # not float32: converted per call, as the op reads it
    shift = torch.randn(48, generator=gen).cuda()
    call = bind_quantize_int(x, sa, 8, shift)
    assert call is not None
    for xx in (x, (torch.randn(5, 48, generator=gen) * 5).to(dtype).cuda(), x.t().contiguous().t()):
        for bits, sh, od in ((8, shift, None), (4, None, None), (8, shift.to(dtype), torch.float32)):
            assert torch.equal(call(xx, sa, bits, sh, od), quantize_int(xx, sa, bits, sh, od))
            assert torch.equal(call(xx, sa, bits, sh, od).cpu(), _ref(xx, sa, bits, sh, od))
    s2 = torch.tensor(0.3, device="cuda")
    assert torch.equal(call(x, s2, 8, shift), _ref(x, s2, 8, shift).cuda())   # the scale of each call is read


@needs_cuda
def test_registered_and_chosen_through_the_dispatcher():
    import bie_core
    from bie_core import ops
    x = torch.randn(6, 32, device="cuda", dtype=torch.bfloat16) * 4
    s = torch.tensor(0.25, device="cuda")
    got = ops.quantize_int(x, s, 8, backend="cuda:quantize_int")
    assert torch.equal(got.cpu(), _ref(x, s, 8))
    chosen = bie_core.explain(ops.quantize_int, x, s, 8, backend="cuda:quantize_int").chosen()
    assert chosen["quantize_int"] == "cuda:quantize_int"


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.int8, torch.bfloat16, torch.float32, torch.float64])
def test_transpose_2d_is_exact_on_odd_and_large_shapes(dtype):
    """The tiled transpose against x.t(). Its tiles are 128 rows by 128 bytes (n = 128 / element size columns);
    whole tiles with 16-byte aligned rows take 16-byte accesses, the rest one element a thread. Shapes: whole tiles
    only, whole tiles with partial ones in either dim, rows too short or misaligned for 16-byte accesses, more
    rows of tiles than one grid dimension holds (65535), and views at aligned, even and odd offsets."""
    from bie_backend_cuda import integer as ci
    gen = torch.Generator(device="cuda").manual_seed(3)
    n = 128 // torch.empty((), dtype=dtype).element_size()
    shapes = [(1, 1), (1, 65), (65, 1), (63, 130), (4097, 64), (128, n), (256, 3 * n), (3 * 128 + 5, 2 * n + 1),
              (2 * 128 + 1, 3 * n), (4 * 128, 2 * n - 1), (n, 128), (128 * 65536 + 3, 2), (128 * 65536 + 16, n)]
    for m, k in shapes:
        x = torch.randint(-100, 100, (m, k), device="cuda", generator=gen, dtype=dtype)
        y = ci.transpose_2d(x)
        assert y.is_contiguous() and torch.equal(y, x.t()), (m, k)
    x = torch.randint(-100, 100, (3 * 128, 4 * n), device="cuda", generator=gen, dtype=dtype)
    for v in (x[128:, n:3 * n],                 # aligned rows and offset: the 16-byte path
              x[16:16 + 256, 1:1 + 2 * n],        # an offset one element off alignment
              x[3:39, 4:68], x[3:39, 5:69]):      # partial tiles at even and odd offsets
        assert torch.equal(ci.transpose_2d(v), v.t())
    assert torch.equal(ci.transpose_2d(x.t()), x)                  # column-major input: copied first

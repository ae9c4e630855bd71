"""bie-backend-cutlass, binary family: kernels against the plain-PyTorch reference.

Fresh random inputs each run; odd shapes (M=1, K not a multiple of 128, N odd), every output
dtype, scalar and per-channel scales, bias, every conv pad value, channels_last and int8 inputs,
groups, stride and dilation. Integer counts must be bit-exact, and so must the float outputs
(the epilogue rounds exactly as the reference: float32(dot) * scale, then + bias, then the cast).

Without CUDA, or without the CUTLASS headers / compiler, only the light checks run.
"""
from __future__ import annotations

import functools
import importlib.util

import pytest
import torch

from bie_core.ops.binary import CONV_CASES

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bie_backend_cutlass") is None,
                                reason="bie-backend-cutlass is not installed")


def _usable() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    from bie_backend_cutlass import descriptor
    reason = descriptor.backend.probe()
    if reason:
        return reason
    if not ((8, 0) <= torch.cuda.get_device_capability() <= (9, 0)):
        return "no 1-bit AND+popc MMA on this GPU"
    return None


needs_kernels = pytest.mark.skipif(_usable() is not None, reason=str(_usable()))
FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def test_import_is_light():
    # in a fresh process: another test of the same pytest process may have loaded the family already
    import subprocess
    import sys
    code = ("import bie_backend_cutlass.binary as b\n"      # importing compiles and loads nothing
            "from bie_backend_cutlass import _build\n"
            "assert 'binary' not in _build._loaded, _build._loaded\n"
            "assert b.kpad(1) == 128 and b.kpad(128) == 128 and b.kpad(129) == 256\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_counting_twin_serves_up_to_the_work_limit(monkeypatch):
    """Tuned calls run the tuned tile's counting twin (no popcount pass) on in-place 16-bit-output calls up to
    COUNT_MAX_WORK, the tile with the pass above it and on 32-bit outputs; a counting tile the caller
    names at any size (CPU: the kernels are stubbed, the choice is what is checked)."""
    from bie_backend_cutlass import binary as b, tuning
    ran = []

    class Ops:
        def wgemm(self, a, b_, rt, ct, s1, s2, bias, out, geo, cfg):
            ran.append(b.WG_CONFIGS[cfg])

        def gemm(self, *args):
            ran.append(b.CONFIGS[args[-1]])

        def rows(self, *args):
            ran.append("pass")

    monkeypatch.setattr(b, "_ops", lambda: Ops())
    monkeypatch.setattr(b, "_wg_ok", lambda *args: True)
    monkeypatch.setattr(tuning, "choose", lambda op, bucket, cands, device=None: "wg128x256c1")
    monkeypatch.setattr(tuning, "sm_count", lambda device=None: 132)

    def run(m, n, k, dt, tile=None):
        ran.clear()
        a = torch.zeros((m, k // 8), dtype=torch.uint8)
        w = torch.zeros((n, k // 8), dtype=torch.uint8)
        p = b.PreparedSigns()
        p._cache[("gemm", k)] = (None, torch.zeros(n, dtype=torch.int32), b.kpad(k))   # rows read in place
        b.binary_gemm(a, w, k, None, None, dt, prepared=p, tile=tile)
        return list(ran)

    assert run(4096, 4096, 4096, torch.bfloat16) == ["wg128x256c1r"]
    assert run(4096, 4096, 4096, torch.float32) == ["pass", "wg128x256c1"]
    assert 8192 ** 3 > b.COUNT_MAX_WORK
    assert run(8192, 2048, 8192, torch.float16) == ["pass", "wg128x256c1"]
    assert run(8192, 2048, 8192, torch.float16, tile="wg128x256r") == ["wg128x256r"]   # named: any size
    with pytest.raises(ValueError, match="tile='wg1'"):
        run(64, 64, 128, torch.float16, tile="wg1")


def test_binary_gemm_is_not_handed_over_to_the_cuda_backend():
    """With the row terms counted in the mainloop, this backend's wgmma GEMM measured within 2% of
    bie-backend-cuda's at 4096^3 and 8192^3 and faster at M=384 and 1024 with N=K=4096, in the same runs
    (benchmarks/results/cutlass_h100_binary.md), so automatic selection keeps binary_gemm here: no deferral."""
    from bie_backend_cutlass import binary as b
    got = {}

    class Recorder:
        def register(self, op, fn, **kw):
            got[op] = kw

    b.register(Recorder(), 50)
    assert got["binary_gemm"]["capability"].defer is None
    assert not hasattr(b, "_gemm_defer")


def test_binary_linear_hands_small_m_to_the_cuda_backend():
    """Up to 256 rows bie-backend-cuda's mma.sync binary_linear is faster on the GPU and has the leaner bound call
    (bie_core/preferences.py), so this backend's binary_linear defers there; above, it keeps the call."""
    from bie_backend_cutlass import binary as b
    from bie_core.kernels import Problem
    got = {}

    class Recorder:
        def register(self, op, fn, **kw):
            got[op] = kw

    b.register(Recorder(), 50)
    defer = got["binary_linear"]["capability"].defer

    def p(m):
        return Problem("binary_linear", "cuda", 0, torch.bfloat16, {"M": m, "N": 4096, "K": 4096})
    assert "binary_linear_tc" in defer(p(1)) and "binary_linear_tc" in defer(p(256))
    assert defer(p(257)) is None and defer(p(4096)) is None


def _ref():
    from bie_backend_cpu.reference import binary
    return binary


def _bits(shape, k, gen):
    from bie_core.ops._common import randbits
    return randbits(shape, device="cuda", gen=gen, k=k)


def _same(out, ref, what):
    assert out.dtype == ref.dtype and out.shape == ref.shape, (what, out.dtype, ref.dtype, out.shape, ref.shape)
    # the reference's memory format is the op's (a conv of a channels_last x returns channels_last)
    assert out.is_contiguous() == ref.is_contiguous(), (what, out.stride(), ref.stride())
    if out.dim() == 4:
        cl = torch.channels_last
        assert out.is_contiguous(memory_format=cl) == ref.is_contiguous(memory_format=cl), (what, out.stride())
    if not torch.equal(out, ref):
        diff = (out.double() - ref.double()).abs()
        raise AssertionError(f"{what}: {int((diff > 0).sum())} of {diff.numel()} elements differ, "
                             f"max |diff| {float(diff.max())}")


GEMM_SHAPES = [(1, 1, 1), (1, 64, 4096), (1, 257, 300), (3, 5, 7), (7, 33, 130), (33, 17, 1000), (64, 96, 512),
               (129, 255, 1023), (200, 64, 2048), (300, 130, 4100), (2, 8, 8191)]


@needs_kernels
@pytest.mark.parametrize("m,n,k", GEMM_SHAPES)
def test_binary_gemm(m, n, k):
    from bie_backend_cutlass import binary as cb
    rb = _ref()
    gen = torch.Generator().manual_seed(m * 7919 + n * 31 + k)
    a, b = _bits((m, (k + 7) // 8), k, gen), _bits((n, (k + 7) // 8), k, gen)
    _same(cb.binary_gemm(a, b, k, None, None, None), rb.binary_gemm(a, b, k, None, None, None), "count")
    for i, dt in enumerate(FLOATS):
        per = (i + m) % 2 == 0
        scale = (torch.rand((n,) if per else (), generator=gen) + 0.05).to("cuda", FLOATS[(i + 1) % 3])
        bias = torch.randn(n, generator=gen).to("cuda", FLOATS[(i + 2) % 3]) if i != 1 else None
        p = cb.prepare_weight(b)
        _same(cb.binary_gemm(a, b, k, scale, bias, dt, prepared=p), rb.binary_gemm(a, b, k, scale, bias, dt),
              f"{dt} per_channel={per}")
        _same(cb.binary_gemm(a, b, k, None, None, dt, prepared=p), rb.binary_gemm(a, b, k, None, None, dt),
              f"{dt} no scale")


@needs_kernels
@pytest.mark.parametrize("tile", ["128x256", "128x256k1024", "64x128"])
def test_every_tile_config(tile):
    from bie_backend_cutlass import binary as cb
    rb = _ref()
    gemm = functools.partial(cb.binary_gemm, tile=tile)
    gen = torch.Generator().manual_seed(5)
    for (m, n, k) in [(1, 3, 5), (130, 260, 1500), (257, 129, 4096)]:
        a, b = _bits((m, (k + 7) // 8), k, gen), _bits((n, (k + 7) // 8), k, gen)
        for dt in (None,) + FLOATS:
            s = None if dt is None else torch.rand(n, generator=gen).cuda()
            _same(gemm(a, b, k, s, None, dt), rb.binary_gemm(a, b, k, s, None, dt), f"{tile} {dt}")


@needs_kernels
def test_binary_gemm_views_and_garbage_pad_bits():
    from bie_backend_cutlass import binary as cb
    rb = _ref()
    gen = torch.Generator().manual_seed(3)
    k = 1001
    kb = (k + 7) // 8
    a = _bits((9, 3 * kb), 3 * kb * 8, gen)[:, kb:2 * kb]          # unaligned view
    b = _bits((5, kb), k, gen)
    a2 = a.clone()
    a2[:, -1] |= 0xF0                                                 # non-zero pad bits must not count
    _same(cb.binary_gemm(a2, b, k, None, None, None), rb.binary_gemm(a2, b, k, None, None, None), "pad bits")
    _same(cb.binary_gemm(a, b.t().contiguous().t(), k, None, None, None),
          rb.binary_gemm(a, b, k, None, None, None), "column-major weight view")


@needs_kernels
@pytest.mark.parametrize("m,n,k", [(1, 64, 4096), (3, 5, 7), (17, 33, 100), (64, 129, 1024), (256, 96, 640)])
def test_binary_linear(m, n, k):
    from bie_backend_cutlass import binary as cb
    rb = _ref()
    gen = torch.Generator().manual_seed(m + n + k)
    w = _bits((n, (k + 7) // 8), k, gen)
    for i, dt in enumerate(FLOATS):
        x = torch.randn((m, 2 * k), generator=gen).to("cuda", dt)[:, ::2] if i == 1 else \
            torch.randn((m, k), generator=gen).to("cuda", dt)
        x[torch.rand(x.shape, generator=gen).cuda() < 0.05] = 0
        shift = (torch.randn(k, generator=gen) * 0.3).to("cuda", FLOATS[(i + 1) % 3])
        shift[:2] = -x[0, :2].to(shift.dtype)
        sa = (torch.rand((), generator=gen) + 0.1).to("cuda", dt)
        sw = (torch.rand((n,) if i != 2 else (), generator=gen) + 0.1).cuda()
        bias = torch.randn(n, generator=gen).to("cuda", dt) if i != 0 else None
        _same(cb.binary_linear(x, shift, w, k, sa, sw, bias, dt), rb.binary_linear(x, shift, w, k, sa, sw, bias, dt),
              f"{dt}")
        _same(cb.binary_linear(x, None, w, k, None, None, None, None),
              rb.binary_linear(x, None, w, k, None, None, None, None), f"{dt} count")


@needs_kernels
@pytest.mark.parametrize("m,n,k", [(1, 64, 4096), (7, 33, 130), (257, 96, 512), (300, 130, 4100), (512, 256, 1024)])
def test_bound_binary_linear_equals_the_kernel(m, n, k):
    """bind_binary_linear (the layers' eager call) fixes the layout, the shift, the epilogue vectors and the tuned
    tile once, then launches the packing and the GEMM on fresh buffers: bit-exact with binary_linear, on new
    inputs of the bound signature."""
    from bie_backend_cutlass import binary as cb
    gen = torch.Generator().manual_seed(m * 7 + n + k)
    w = _bits((n, (k + 7) // 8), k, gen)
    for i, dt in enumerate(FLOATS):
        shift = (torch.randn(k, generator=gen) * 0.3).to("cuda", dt) if i != 1 else None
        sa = (torch.rand((), generator=gen) + 0.1).to("cuda", dt)
        sw = (torch.rand((n,) if i != 2 else (), generator=gen) + 0.1).cuda()
        bias = torch.randn(n, generator=gen).to("cuda", dt) if i != 0 else None
        x0 = torch.randn((m, k), generator=gen).to("cuda", dt)
        prepared = cb.prepare_weight(w)
        call = cb.bind_binary_linear(x0, shift, w, k, sa, sw, bias, dt, prepared)
        assert call is not None and call.input_only
        for _ in range(2):
            x = torch.randn((m, k), generator=gen).to("cuda", dt)
            _same(call(x), cb.binary_linear(x, shift, w, k, sa, sw, bias, dt, prepared), f"{dt} bound")
    empty = torch.empty((0, 64), device="cuda")
    assert cb.bind_binary_linear(empty, None, w[:, :8], 64, None, None, None, torch.float32) is None


@needs_kernels
def test_binary_layer_eager_inference_on_cutlass_matches_the_full_path():
    """A BinaryLinear layer bound to this backend's binary_linear (300 rows: not handed to bie-backend-cuda) gives
    the full path's output, and explain names the kernel."""
    import bie_core
    from bie_core import BinaryLinear
    torch.manual_seed(3)
    layer = BinaryLinear(512, 96, bias=True, backend="cutlass").to(device="cuda", dtype=torch.bfloat16).eval()
    x = torch.randn(300, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        layer.act_shift.normal_(0, 0.3)
        layer(x[:4])   # sets the activation scale
    layer.pack()
    with torch.no_grad():
        full = layer._forward(x)
    for _ in range(3):
        with torch.inference_mode():
            assert torch.equal(layer(x), full)
    with torch.inference_mode():
        e = bie_core.explain(layer, x)
    assert e.chosen()["binary_linear"] == "cutlass:binary_linear", str(e)


@needs_kernels
def test_binary_linear_packing_spans_and_tails():
    """The packing kernel reads whole 1024-value spans of a row coalesced (one warp each, words assembled from
    other lanes' loads) and the rest word by word: every float dtype contiguous, with and without a shift, K of
    exact spans, spans + whole words, spans + a partial word, and more spans than the block has warps."""
    from bie_backend_cutlass import binary as cb
    rb = _ref()
    gen = torch.Generator().manual_seed(77)
    for k in (1024, 2048 + 96, 3072 + 37, 6144):
        w = _bits((24, (k + 7) // 8), k, gen)
        for dt in FLOATS:
            x = torch.randn((5, k), generator=gen).to("cuda", dt)
            x[torch.rand(x.shape, generator=gen).cuda() < 0.05] = 0
            shift = (torch.randn(k, generator=gen) * 0.3).to("cuda", dt)
            shift[-3:] = -x[1, -3:]
            for sh in (shift, None):
                _same(cb.binary_linear(x, sh, w, k, None, None, None, None),
                      rb.binary_linear(x, sh, w, k, None, None, None, None), f"k={k} {dt} shift={sh is not None}")


@needs_kernels
@pytest.mark.parametrize("tile", ["wg128x256", "wg64x128", "wg64x256", "wg128x256c1"])
def test_wgmma_configs(tile):
    """The Hopper wgmma kernels (sm_90 only; elsewhere the named tile is ignored): gemm, linear
    and bmm on shapes its TMA epilogue serves (N % 8 == 0), every output dtype, scalar and
    per-channel scales of every float dtype, bias, K tails, batches."""
    from bie_backend_cutlass import binary as cb
    rb = _ref()
    gemm, linear, bmm = (functools.partial(f, tile=tile)
                         for f in (cb.binary_gemm, cb.binary_linear, cb.binary_bmm))
    sm90 = torch.cuda.get_device_capability() == (9, 0)
    gen = torch.Generator().manual_seed(11)
    for (m, n, k) in [(1, 8, 5), (100, 64, 300), (130, 264, 1500), (257, 512, 4096), (64, 128, 8192), (3, 24, 129)]:
        a, b = _bits((m, (k + 7) // 8), k, gen), _bits((n, (k + 7) // 8), k, gen)
        _same(gemm(a, b, k, None, None, None), rb.binary_gemm(a, b, k, None, None, None), f"{tile} count")
        assert not sm90 or cb.LAST_CONFIG[0] == tile
        for i, dt in enumerate(FLOATS):
            per = (i + m) % 2 == 0
            s = (torch.rand((n,) if per else (), generator=gen) + 0.05).to("cuda", FLOATS[(i + m) % 3])
            bias = torch.randn(n, generator=gen).to("cuda", FLOATS[(i + 2) % 3]) if i != 1 else None
            _same(gemm(a, b, k, s, bias, dt), rb.binary_gemm(a, b, k, s, bias, dt), f"{tile} {dt} {per}")
            assert not sm90 or cb.LAST_CONFIG[0] == tile
            _same(gemm(a, b, k, None, None, dt), rb.binary_gemm(a, b, k, None, None, dt), f"{tile} {dt}")
        x = torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16)
        w = _bits((n, (k + 7) // 8), k, gen)
        sh = torch.randn(k, generator=gen).to("cuda", torch.bfloat16) * 0.1
        sa = (torch.rand((), generator=gen) + 0.5).to("cuda", torch.bfloat16)
        sw = (torch.rand(n, generator=gen) + 0.5).cuda()
        bias = torch.randn(n, generator=gen).cuda()
        for dt in FLOATS:
            _same(linear(x, sh, w, k, sa, sw, bias, dt), rb.binary_linear(x, sh, w, k, sa, sw, bias, dt),
                  f"{tile} linear {dt}")
        _same(linear(x, None, w, k, None, None, None, None),
              rb.binary_linear(x, None, w, k, None, None, None, None), f"{tile} linear count")
        bs = 3
        a3 = _bits((bs, m, (k + 7) // 8), k, gen)
        b3 = _bits((bs, n, (k + 7) // 8), k, gen)
        _same(bmm(a3, b3, k, None, None), rb.binary_bmm(a3, b3, k, None, None), f"{tile} bmm count")
        s = (torch.rand((), generator=gen) + 0.1).cuda()
        for dt in FLOATS:
            _same(bmm(a3, b3, k, s, dt), rb.binary_bmm(a3, b3, k, s, dt), f"{tile} bmm {dt}")
        assert not sm90 or cb.LAST_CONFIG[0] == tile


@needs_kernels
@pytest.mark.parametrize("tile", ["wg128x256r", "wg128x256c1r"])
def test_wgmma_counted_rows(tile):
    """The configurations that count popc(a row) in their mainloop instead of a pass before the GEMM: bit-exact
    wherever they serve (binary_gemm / binary_bmm with 16-bit outputs and operands used in place: K % 128 == 0),
    with M and N tails, K tails inside a 1024-bit stage, row-strided views, scales, bias, batches; elsewhere the
    same tile reading the pass's terms serves."""
    from bie_backend_cutlass import binary as cb
    rb = _ref()
    gemm, linear, bmm = (functools.partial(f, tile=tile)
                         for f in (cb.binary_gemm, cb.binary_linear, cb.binary_bmm))
    base = cb.COUNTED[tile]
    sm90 = torch.cuda.get_device_capability() == (9, 0)
    gen = torch.Generator().manual_seed(23)
    for (m, n, k) in [(1, 8, 128), (300, 520, 1152), (129, 264, 2048), (257, 512, 4096), (64, 128, 8192),
                      (200, 24, 384)]:
        a, b = _bits((m, k // 8), k, gen), _bits((n, k // 8), k, gen)
        for i, dt in enumerate((torch.float16, torch.bfloat16)):
            per = (i + m) % 2 == 0
            s = (torch.rand((n,) if per else (), generator=gen) + 0.05).to("cuda", FLOATS[(i + m) % 3])
            bias = torch.randn(n, generator=gen).to("cuda", FLOATS[(i + 2) % 3]) if i == 0 else None
            _same(gemm(a, b, k, s, bias, dt), rb.binary_gemm(a, b, k, s, bias, dt), f"{tile} {dt} {per}")
            assert not sm90 or cb.LAST_CONFIG[0] == tile
        # a view whose rows sit 64 bytes apart beyond their k bits (garbage there: the kernel must not count it)
        wide = _bits((m, k // 8 + 64), k + 512, gen)
        av = wide[:, : k // 8]
        _same(gemm(av, b, k, None, None, torch.bfloat16),
              rb.binary_gemm(av.contiguous(), b, k, None, None, torch.bfloat16), f"{tile} view")
        assert not sm90 or cb.LAST_CONFIG[0] == tile
        # 32-bit outputs: the same tile with the pass's terms
        _same(gemm(a, b, k, None, None, None), rb.binary_gemm(a, b, k, None, None, None), f"{tile} count")
        assert not sm90 or cb.LAST_CONFIG[0] == base
        a3, b3 = _bits((3, m, k // 8), k, gen), _bits((3, n, k // 8), k, gen)
        s = (torch.rand((), generator=gen) + 0.1).cuda()
        _same(bmm(a3, b3, k, s, torch.bfloat16), rb.binary_bmm(a3, b3, k, s, torch.bfloat16), f"{tile} bmm")
        assert not sm90 or cb.LAST_CONFIG[0] == tile
    # K not a multiple of 128 (a copied, masked): the pass's terms
    a, b = _bits((70, 40), 317, gen), _bits((16, 40), 317, gen)
    _same(gemm(a, b, 317, None, None, torch.float16), rb.binary_gemm(a, b, 317, None, None, torch.float16),
          f"{tile} k tail")
    assert not sm90 or cb.LAST_CONFIG[0] == base
    # binary_linear packs x with its popcounts: the pass-free GEMM of the same tile
    x = torch.randn(130, 1024, generator=gen).to("cuda", torch.bfloat16)
    w = _bits((264, 128), 1024, gen)
    _same(linear(x, None, w, 1024, None, None, None, torch.bfloat16),
          rb.binary_linear(x, None, w, 1024, None, None, None, torch.bfloat16), f"{tile} linear")
    assert not sm90 or cb.LAST_CONFIG[0] == base


@needs_kernels
@pytest.mark.parametrize("tile", ["wg128x256", "wg128x256c1", "wg128x256r"])
def test_wgmma_dependent_launch_chain(tile):
    """The wgmma GEMM is launched as a programmatic dependent of the popcount / packing pass before it
    and must still read what that pass and the kernels before it wrote: `a` rewritten in place by a
    torch kernel each step, its row terms rewritten by the pass into a recycled buffer; no host sync
    between steps (a GEMM that started reading early would see the previous step's values)."""
    from bie_backend_cutlass import binary as cb
    rb = _ref()
    gemm, linear = (functools.partial(f, tile=tile) for f in (cb.binary_gemm, cb.binary_linear))
    gen = torch.Generator().manual_seed(5)
    m, n, k = 384, 512, 2048
    w = _bits((n, k // 8), k, gen)
    p = cb.prepare_weight(w)
    a = torch.empty((m, k // 8), dtype=torch.uint8, device="cuda")
    x = torch.empty((m, k), dtype=torch.bfloat16, device="cuda")
    outs, ins, xs = [], [], []
    for step in range(12):
        a.random_(0, 256)        # in place, on the GPU, right before the GEMM's popcount pass
        outs.append(gemm(a, w, k, None, None, torch.bfloat16, prepared=p))
        ins.append(a.clone())
        x.normal_()
        outs.append(linear(x, None, w, k, None, None, None, torch.float32, prepared=p))
        xs.append(x.clone())
    for step in range(12):
        _same(outs[2 * step], rb.binary_gemm(ins[step], w, k, None, None, torch.bfloat16), f"{tile} gemm {step}")
        _same(outs[2 * step + 1], rb.binary_linear(xs[step], None, w, k, None, None, None, torch.float32),
              f"{tile} linear {step}")


@needs_kernels
@pytest.mark.parametrize("bs,m,n,k", [(1, 1, 1, 1), (2, 3, 5, 7), (3, 16, 16, 64), (4, 9, 33, 200),
                                      (2, 64, 64, 1024), (5, 130, 70, 2048)])
def test_binary_bmm(bs, m, n, k):
    from bie_backend_cutlass import binary as cb
    rb = _ref()
    gen = torch.Generator().manual_seed(bs + m + n + k)
    a = _bits((bs, m, (k + 7) // 8), k, gen)
    b = _bits((bs, n, (k + 7) // 8), k, gen)
    _same(cb.binary_bmm(a, b, k, None, None), rb.binary_bmm(a, b, k, None, None), "count")
    s = (torch.rand((), generator=gen) + 0.1).cuda()
    for dt in FLOATS:
        _same(cb.binary_bmm(a, b, k, s, dt), rb.binary_bmm(a, b, k, s, dt), str(dt))


CONV = [
    # (N, C, H, W, O, kernel, stride, padding, dilation, groups): the conformance kit's small geometries, then
    # wider channel counts (several channel words, grouped, strided)
    *CONV_CASES[:7],
    (2, 64, 14, 14, 64, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (2, 96, 7, 7, 40, (3, 3), (2, 2), (1, 1), (1, 1), 4),
    (1, 130, 9, 10, 33, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (3, 64, 8, 8, 128, (1, 1), (2, 2), (0, 0), (1, 1), 1),
]


@needs_kernels
@pytest.mark.parametrize("case", CONV, ids=[str(i) for i in range(len(CONV))])
def test_binary_conv2d(case):
    from bie_backend_cutlass import binary as cb
    rb = _ref()
    n, c, h, w_, o, ks, st, pd, dl, g = case
    gen = torch.Generator().manual_seed(sum(case[:5]))
    k = (c // g) * ks[0] * ks[1]
    wb = _bits((o, (k + 7) // 8), k, gen)
    p = cb.prepare_weight(wb)
    for i, pad_value in enumerate((-1.0, 0.0, 1.0)):
        for dt in (torch.float32, torch.bfloat16, torch.int8):
            if dt is torch.int8:
                x = torch.randint(-3, 4, (n, c, h, w_), generator=gen, dtype=torch.int8).cuda()
            else:
                x = torch.randn((n, c, h, w_), generator=gen).to("cuda", dt)
                x[torch.rand(x.shape, generator=gen).cuda() < 0.05] = 0
            if (i + c) % 2:
                x = x.contiguous(memory_format=torch.channels_last)
            args = (list(ks), list(st), list(pd), list(dl), g, pad_value)
            _same(cb.binary_conv2d(x, wb, *args, None, None, None, prepared=p),
                  rb.binary_conv2d(x, wb, *args, None, None, None), f"count pad={pad_value} {dt}")
        for odt in FLOATS:
            x = torch.randn((n, c, h, w_), generator=gen).to("cuda", odt)
            scale = (torch.rand((o,) if i != 1 else (), generator=gen) + 0.05).cuda()
            bias = torch.randn(o, generator=gen).to("cuda", odt) if i != 2 else None
            args = (list(ks), list(st), list(pd), list(dl), g, pad_value)
            _same(cb.binary_conv2d(x, wb, *args, scale, bias, odt, prepared=p),
                  rb.binary_conv2d(x, wb, *args, scale, bias, odt), f"{odt} pad={pad_value}")


@needs_kernels
def test_resnet_shapes_and_graph_replay():
    """A ResNet-18 stage shape at batch 8, through the dispatcher, captured in a CUDA graph."""
    import bie_core
    from bie_core import ops
    rb = _ref()
    gen = torch.Generator().manual_seed(11)
    x = torch.randn((8, 256, 14, 14), generator=gen).to("cuda", torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    wb = _bits((256, 256 * 9 // 8), 256 * 9, gen)
    scale = torch.rand(256, generator=gen).cuda()
    args = (x, wb, [3, 3], [1, 1], [1, 1], [1, 1], 1, -1.0, scale, None, torch.bfloat16)
    with bie_core.use_backend("cutlass"):
        y = ops.binary_conv2d(*args)
        torch.cuda.synchronize()
        _same(y, rb.binary_conv2d(*args), "dispatch")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            ops.binary_conv2d(*args)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            yg = ops.binary_conv2d(*args)
        x.copy_(torch.randn(x.shape, generator=gen).to("cuda", torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        _same(yg, rb.binary_conv2d(*args), "graph replay")


@needs_kernels
def test_binary_gemm_graph_replay_with_new_operands(tmp_path, monkeypatch):
    """binary_gemm captured in a CUDA graph (an untuned bucket: the default tile, on sm_90 with a 16-bit output
    its counting twin, whose mainloop counts popc(a) on every replay), replayed after a and the scale are
    rewritten in place; and once more after a tuned call of the same bucket."""
    from bie_backend_cutlass import binary as cb, tuning
    rb = _ref()
    gen = torch.Generator().manual_seed(31)
    m, n, k = 640, 520, 2048
    a, w = _bits((m, k // 8), k, gen), _bits((n, k // 8), k, gen)
    p = cb.prepare_weight(w)
    scale = (torch.rand(n, generator=gen) + 0.5).cuda()
    monkeypatch.setattr(tuning, "table_path", lambda device=None: tmp_path / "tuning.json")
    monkeypatch.setattr(tuning, "_tables", {})
    monkeypatch.setenv("BIE_CUTLASS_TUNE", "0")   # the warm-up must leave the bucket untuned
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        cb.binary_gemm(a, w, k, scale, None, torch.bfloat16, prepared=p)   # weight layouts built outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = cb.binary_gemm(a, w, k, scale, None, torch.bfloat16, prepared=p)
    if torch.cuda.get_device_capability() == (9, 0):
        assert cb.LAST_CONFIG[0] == "wg128x256r"
    for step in range(3):
        a.copy_(_bits((m, k // 8), k, gen))
        scale.copy_(torch.rand(n, generator=gen) + 0.5)
        graph.replay()
        torch.cuda.synchronize()
        _same(y, rb.binary_gemm(a, w, k, scale, None, torch.bfloat16), f"replay {step}")
    monkeypatch.delenv("BIE_CUTLASS_TUNE")
    _same(cb.binary_gemm(a, w, k, scale, None, torch.bfloat16, prepared=p),
          rb.binary_gemm(a, w, k, scale, None, torch.bfloat16), "tuned")


@needs_kernels
def test_dispatch_picks_cutlass_and_bad_input_raises():
    import bie_core
    from bie_core import ops
    gen = torch.Generator().manual_seed(2)
    a, b = _bits((4, 16), 128, gen), _bits((8, 16), 128, gen)
    text = bie_core.explain("binary_gemm", a, b, 128, None, None, None)
    assert "cutlass" in str(text)
    with bie_core.use_backend("cutlass"):
        with pytest.raises(Exception):
            ops.binary_gemm(a, b[:, :8], 128, None, None, None)       # wrong packed width
        with pytest.raises(Exception):
            ops.binary_gemm(a, b, 128, torch.ones(3, device="cuda"), None, torch.float32)  # bad scale size
    from bie_backend_cutlass import binary as cb
    with pytest.raises(RuntimeError):   # the C++ layer checks geometry too
        cb._ops().gemm(a, b, torch.zeros(1, dtype=torch.int32, device="cuda"),
                       torch.zeros(8, dtype=torch.int32, device="cuda"), None, None, None,
                       torch.empty(4, 8, dtype=torch.int32, device="cuda"),
                       [4, 8, 128, 1, 128, 128, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0], 0)

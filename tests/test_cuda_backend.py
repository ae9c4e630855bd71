"""bie-backend-cuda: kernels against the plain-PyTorch reference on fresh random inputs.

Without a CUDA device only the packaging checks run (the backend must show as
unavailable, and importing it must not compile anything); the kernel checks
skip.
"""
from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from _cuda_graphs import graph_replays

from bie_core.backend_api import conv_memory_format

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bie_backend_cuda") is None,
                                reason="bie-backend-cuda is not installed")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
needs_hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                  reason="needs a Hopper (sm_90) GPU")


def test_descriptor_is_light_and_honest():
    from bie_backend_cuda import descriptor
    d = descriptor.backend
    assert d.name == "cuda" and tuple(d.device_types) == ("cuda",)
    reason = d.probe()
    if not torch.cuda.is_available():
        assert reason == "no CUDA device"


def test_listed_without_breaking_core():
    import bie_core
    recs = {r.name: r for r in bie_core.backends()}
    assert "cuda" in recs
    if not torch.cuda.is_available():
        assert recs["cuda"].status == "unavailable" and recs["cuda"].cause == "no CUDA device"


def test_every_source_is_built():
    """The extension compiles every .cu file of csrc and nothing that is not there (a translation unit left out of
    the list would leave its explicitly instantiated kernels undefined when the library loads)."""
    from pathlib import Path

    from bie_backend_cuda import _build
    on_disk = {p.name for p in Path(_build.CSRC).glob("*.cu")} | {"bie_cuda.cpp"}
    assert set(_build.SOURCES) == on_disk and len(_build.SOURCES) == len(on_disk)


# ------------------------------------------------------------------ kernels
def _ref():
    from bie_backend_cpu.reference import binary, weight_only
    return binary, weight_only


def _bits(shape, k, gen, device="cuda"):
    from bie_core.ops._common import randbits
    return randbits(shape, device=device, gen=gen, k=k)


def _cpu(t):
    return None if t is None else t.detach().cpu()


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 5, 129), (64, 1024), (1, 4099), (17, 8)])
def test_pack_unpack(dtype, shape):
    from bie_backend_cuda import binary as cb
    rb, _ = _ref()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(shape[:-1] + (2 * shape[-1],), generator=gen)
    x[torch.rand(x.shape, generator=gen) < 0.1] = 0.0
    if dtype is torch.int8:
        x = (x * 3).round()
    x = x.to(dtype).cuda()
    for xx in (x[..., : shape[-1]].contiguous(), x[..., ::2]):
        got = cb.pack_signs(xx)
        assert torch.equal(got.cpu(), rb.pack_signs(xx.cpu()))
        for odt in (torch.float32, torch.bfloat16, torch.int8):
            assert torch.equal(cb.unpack_signs(got, shape[-1], odt).cpu(), rb.unpack_signs(got.cpu(), shape[-1], odt))


GEMM = [(1, 1, 1), (1, 64, 64), (1, 256, 4096), (3, 5, 7), (7, 33, 130), (16, 64, 128), (33, 17, 1000),
        (128, 96, 512), (2, 8, 8191), (64, 128, 4096), (300, 520, 777), (257, 1000, 2048)]


@needs_cuda
@pytest.mark.parametrize("m,n,k", GEMM)
@pytest.mark.parametrize("tile", [0, 1, 2, 3, 4, 5, "simt"])
def test_binary_gemm(m, n, k, tile):
    from bie_backend_cuda import binary as cb
    rb, _ = _ref()
    gen = torch.Generator().manual_seed(m * 7 + n * 13 + k)
    kb = (k + 7) // 8
    a, b = _bits((m, kb), k, gen), _bits((n, kb), k, gen)
    exp = rb.binary_gemm(a.cpu(), b.cpu(), k, None, None, None)
    run = (lambda *args: cb.binary_gemm_simt(*args)) if tile == "simt" else \
        (lambda *args: cb.binary_gemm(*args, tile=tile))
    assert torch.equal(run(a, b, k, None, None, None).cpu(), exp)
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        scale = (torch.rand((n,) if (m + n) % 2 == 0 else (), generator=gen) + 0.05).cuda()
        bias = torch.randn(n, generator=gen).to(dt).cuda()
        got = run(a, b, k, scale, bias, dt).cpu()
        ref = rb.binary_gemm(a.cpu(), b.cpu(), k, scale.cpu(), bias.cpu(), dt)
        assert torch.equal(got, ref), f"{dt}: max diff {(got.double() - ref.double()).abs().max()}"


def test_wgmma_image_layout():
    """The prepared image of the Hopper 1-bit kernel is the layout binary_wgmma.cu documents: per 256-row tile and
    1024-bit stage one contiguous 32 KB block, row r's 16-byte chunk c stored at c ^ (r % 8), zeros past N and K
    (device-independent: plain torch ops)."""
    from bie_backend_cuda import binary as cb
    gen = torch.Generator().manual_seed(11)
    n, kb = 300, 144                      # 2 column tiles (the second partial), 2 stages (the second partial)
    bits = torch.randint(0, 256, (n, kb), dtype=torch.uint8, generator=gen)
    img = cb.wgmma_image(bits, kb)
    assert img.dtype == torch.uint8 and img.numel() == 2 * 2 * 256 * 128
    blocks = img.view(2, 2, 256, 8, 16)   # [column tile][stage][row][stored chunk][byte]
    padded = torch.zeros(512, 256, dtype=torch.uint8)
    padded[:n, :kb] = bits
    for t in range(2):
        for s_ in range(2):
            for r in range(256):
                src = padded[t * 256 + r, s_ * 128:(s_ + 1) * 128].view(8, 16)
                perm = torch.tensor([c ^ (r % 8) for c in range(8)])
                assert torch.equal(blocks[t, s_, r, perm], src), (t, s_, r)


WGMMA_GEMM = [(256, 256, 1024), (1, 8, 128), (129, 8, 128), (300, 264, 1152), (1000, 520, 4096), (517, 2056, 3072),
              (2048, 768, 8192)]


@needs_cuda
@needs_hopper
@pytest.mark.parametrize("m,n,k", WGMMA_GEMM)
def test_binary_gemm_wgmma(m, n, k):
    """The Hopper kernel bit-exact on fresh random bits: tails in M, N (past 256 columns) and K (past 1024
    bits), one to several tiles per SM, every output dtype, per-channel / scalar scales of every float dtype,
    bias; both by force and as the automatic choice."""
    from bie_backend_cuda import binary as cb
    rb, _ = _ref()
    gen = torch.Generator().manual_seed(m * 7 + n * 13 + k)
    kb = k // 8
    a, b = _bits((m, kb), k, gen), _bits((n, kb), k, gen)
    prep = cb.prepare_weight(b)
    assert prep.image is not None
    exp = rb.binary_gemm(a.cpu(), b.cpu(), k, None, None, None)
    for tile in ("wgmma1", "wgmma2", "wgmma4"):   # blocks per cluster sharing the weight stages
        assert torch.equal(cb.binary_gemm(a, b, k, None, None, None, prepared=prep, tile=tile).cpu(), exp), tile
    if m >= cb.WGMMA_MIN_M:   # among bie-backend-cuda's kernels the dispatcher picks the wgmma one here
        import bie_core
        e = bie_core.explain(bie_core.ops.binary_gemm, a, b, k, None, None, None, backend="cuda")
        assert e.chosen()["binary_gemm"] == "cuda:binary_gemm_wgmma", str(e)
        assert torch.equal(cb.binary_gemm_wgmma(a, b, k, None, None, None, prepared=prep).cpu(), exp)
    # (2-byte outputs with and without bias each)
    for i, dt in enumerate((torch.float32, torch.float16, torch.bfloat16, torch.float16, torch.bfloat16)):
        sdt = (torch.float32, torch.bfloat16, torch.float16)[(i + m) % 3]
        scale = (torch.rand((n,) if (i + m) % 2 == 0 else (), generator=gen) + 0.05).to(sdt).cuda()
        bias = torch.randn(n, generator=gen).to(dt).cuda() if i not in (1, 4) else None
        got = cb.binary_gemm(a, b, k, scale, bias, dt, prepared=prep, tile="wgmma").cpu()
        ref = rb.binary_gemm(a.cpu(), b.cpu(), k, scale.cpu(), None if bias is None else bias.cpu(), dt)
        assert torch.equal(got, ref), f"{dt}: max diff {(got.double() - ref.double()).abs().max()}"
    # a view with a row stride larger than the row (16-byte aligned), and all-ones / all-zeros rows
    wide = torch.zeros(m, kb + 16, dtype=torch.uint8, device="cuda")
    wide[:, :kb] = a
    wide[0, :kb] = 255
    if m > 1:
        wide[1, :kb] = 0
    av = wide[:, :kb]
    exp = rb.binary_gemm(av.cpu(), b.cpu(), k, None, None, None)
    assert torch.equal(cb.binary_gemm(av, b, k, None, None, None, prepared=prep, tile="wgmma").cpu(), exp)


@needs_cuda
@needs_hopper
@pytest.mark.parametrize("m,n,k", [(2600, 2312, 3072), (4100, 1032, 1024), (4096, 4096, 1024), (1152, 4104, 8192)])
def test_binary_gemm_wgmma_many_tiles(m, n, k):
    """More tiles than SMs, so every block runs several (the staging buffers, column-term buffers and slot
    phases wrap around; one to eight stages per tile, fewer and more than the ring's slots, and up to eight
    tiles per block). Tails in M and N; bit-exact against the reference for 2-byte outputs with and without
    bias, and int32, forced (one block per cluster and two) and as the automatic choice."""
    from bie_backend_cuda import binary as cb
    rb, _ = _ref()
    gen = torch.Generator().manual_seed(m + n + k)
    a, b = _bits((m, k // 8), k, gen), _bits((n, k // 8), k, gen)
    prep = cb.prepare_weight(b)
    tiles = -(-m // 128) * -(-n // 256)
    assert tiles > torch.cuda.get_device_properties(0).multi_processor_count
    for dt, with_bias in ((torch.bfloat16, False), (torch.float16, True)):
        scale = (torch.rand(n, generator=gen) + 0.05).cuda()
        bias = torch.randn(n, generator=gen).to(dt).cuda() if with_bias else None
        ref = rb.binary_gemm(a.cpu(), b.cpu(), k, scale.cpu(), None if bias is None else bias.cpu(), dt)
        for tile in ("wgmma", "wgmma2", 0):   # (clusters of 2: the slot releases cross blocks)
            got = cb.binary_gemm(a, b, k, scale, bias, dt, prepared=prep, tile=tile).cpu()
            assert torch.equal(got, ref), f"{dt} {tile}: max diff {(got.double() - ref.double()).abs().max()}"
    assert torch.equal(cb.binary_gemm(a, b, k, None, None, None, prepared=prep, tile="wgmma").cpu(),
                       rb.binary_gemm(a.cpu(), b.cpu(), k, None, None, None))


@needs_cuda
@needs_hopper
@pytest.mark.parametrize("k", [65408, 65536])
def test_binary_gemm_wgmma_long_k(k):
    """2-byte outputs at the edge of 16-bit popcounts: K = 65408 (an all-ones row against an all-ones weight row:
    popc = K, the largest below 2^16) and K = 65536. Bit-exact, with scales and bias."""
    from bie_backend_cuda import binary as cb
    rb, _ = _ref()
    gen = torch.Generator().manual_seed(k)
    m, n, kb = 130, 264, k // 8
    a, b = _bits((m, kb), k, gen), _bits((n, kb), k, gen)
    a[0] = 255
    b[0] = 255
    b[1] = 0
    prep = cb.prepare_weight(b)
    for dt in (torch.bfloat16, torch.float16):
        scale = (torch.rand(n, generator=gen) + 0.05).cuda()
        for bias in (None, torch.randn(n, generator=gen).to(dt).cuda()):
            got = cb.binary_gemm(a, b, k, scale, bias, dt, prepared=prep, tile="wgmma").cpu()
            ref = rb.binary_gemm(a.cpu(), b.cpu(), k, scale.cpu(), None if bias is None else bias.cpu(), dt)
            assert torch.equal(got, ref), f"{dt} bias={bias is not None}: max diff {(got.double() - ref.double()).abs().max()}"
    assert torch.equal(cb.binary_gemm(a, b, k, None, None, None, prepared=prep, tile="wgmma").cpu(),
                       rb.binary_gemm(a.cpu(), b.cpu(), k, None, None, None))


@needs_cuda
@needs_hopper
def test_binary_gemm_wgmma_refuses_clearly():
    from bie_backend_cuda import binary as cb
    gen = torch.Generator().manual_seed(5)
    a, b = _bits((300, 25), 200, gen), _bits((64, 25), 200, gen)      # k = 200: not a multiple of 128
    prep = cb.prepare_weight(b)
    assert prep.image is None
    with pytest.raises(ValueError, match="k % 128"):
        cb.binary_gemm(a, b, 200, None, None, None, prepared=prep, tile="wgmma")
    rb, _ = _ref()   # the automatic choice falls back to mma.sync
    assert torch.equal(cb.binary_gemm(a, b, 200, None, None, None, prepared=prep).cpu(),
                       rb.binary_gemm(a.cpu(), b.cpu(), 200, None, None, None))


@needs_cuda
def test_binary_gemm_unaligned_views_and_bmm():
    from bie_backend_cuda import binary as cb
    rb, _ = _ref()
    gen = torch.Generator().manual_seed(3)
    k = 200
    kb = (k + 7) // 8
    big_a, big_b = _bits((9, 3 * kb), 3 * kb * 8, gen), _bits((11, 3 * kb), 3 * kb * 8, gen)
    a, b = big_a[:, 1:kb + 1].clone(), big_b[:, 2:kb + 2].clone()
    a[:, -1] &= 0xFF; b[:, -1] &= 0xFF
    a_v = torch.cat([torch.zeros_like(a[:, :1]), a], 1)[:, 1:]      # misaligned view
    exp = rb.binary_gemm(a.cpu(), b.cpu(), k, None, None, None)
    assert torch.equal(cb.binary_gemm(a_v, b, k, None, None, None).cpu(), exp)
    A, B = _bits((3, 17, kb), k, gen), _bits((3, 29, kb), k, gen)
    scale = torch.tensor(0.37).cuda()
    for fn in (cb.binary_bmm, cb.binary_bmm_simt):
        assert torch.equal(fn(A, B, k, None, None).cpu(), rb.binary_bmm(A.cpu(), B.cpu(), k, None, None))
        got = fn(A, B, k, scale, torch.float32).cpu()
        torch.testing.assert_close(got, rb.binary_bmm(A.cpu(), B.cpu(), k, scale.cpu(), torch.float32))


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_embeddings(dtype):
    from bie_backend_cuda import binary as cb
    rb, _ = _ref()
    gen = torch.Generator().manual_seed(5)
    for v, d, ishape in [(1, 1, (1,)), (10, 7, (3, 4)), (100, 130, (17,)), (7, 8, (0,))]:
        bits = _bits((v, (d + 7) // 8), d, gen)
        scale = torch.rand(v, generator=gen).to(dtype).cuda()
        for idt in (torch.int64, torch.int32):
            idx = torch.randint(0, v, ishape, generator=gen).to(idt).cuda()
            assert torch.equal(cb.sign_embedding(idx, bits, scale, d, dtype).cpu(),
                               rb.sign_embedding(idx.cpu(), bits.cpu(), scale.cpu(), d, dtype))
    bits = _bits((40, 9), 65, gen)
    idx = torch.randint(0, 40, (6, 5), generator=gen).cuda()
    assert torch.equal(cb.sign_embedding_bag(idx, bits, 65, dtype).cpu(),
                       rb.sign_embedding_bag(idx.cpu(), bits.cpu(), 65, dtype))
    bad = torch.tensor([0, 40, -1]).cuda()   # out of range: NaN rows, nothing read out of bounds
    out = cb.sign_embedding(bad, bits, torch.ones(40, dtype=dtype).cuda(), 65, dtype).cpu()
    assert not torch.isnan(out[0]).any() and torch.isnan(out[1:]).all()


WQ = [(bits, gs, act, fmt) for bits in (1, 2, 3, 4, 8) for gs in (32, 64, 128, -1) for act in (False, True)
      for fmt in ("gptq", "gba")]


def _wq_case(k, n, bits, gs, fmt, act, seed, sdtype=torch.float16):
    from bie_core.ops.weight_only import make_wq_case
    gen = torch.Generator().manual_seed(seed)
    return make_wq_case(k, n, bits, gs, fmt, act, gen, "cuda", sdtype=sdtype)


def _close(got, w64, x, dtype, k, what, bias=None):
    from bie_core.ops.weight_only import wq_tolerance
    exp = x.double().cpu() @ w64
    if bias is not None:
        exp = exp + bias.double().cpu()
    rms = lambda t: float(t.double().pow(2).mean().sqrt()) if t.numel() else 0.0  # noqa: E731
    rtol, atol = wq_tolerance(dtype, k, rms(x.cpu()), rms(w64))
    assert got.dtype == dtype, what
    torch.testing.assert_close(got.double().cpu(), exp, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def wq_kernel(name: str = ""):
    """wq_gemm through the dispatcher: the automatic choice among bie-backend-cuda's kernels, or the kernel ``name``
    chosen explicitly (``backend="cuda:<name>"``, the public override; it must accept the call). ``prepared`` is
    accepted and ignored: the dispatcher keeps the layouts."""
    from bie_core.ops.weight_only import wq_gemm
    backend = f"cuda:{name}" if name else "cuda"

    def run(x, qw, s, z, gi, bias, bits, gs, fmt, prepared=None):
        return wq_gemm(x, qw, s, z, gi, bias, bits, gs, fmt, backend=backend)
    return run


def _skinny_layout(cw, prepared, qw, s, z, gi, bits, gs, k, fmt, dtype, inter=True):
    """The A-fragment ordered layout the skinny, thin and wgmma kernels read (interleaved column blocks or not)."""
    return cw._layout(prepared, qw, s, z, gi, bits, gs, k, fmt, dtype, skinny=True, inter=inter)


def launching(launch, cw, inter=True, **plan):
    """A wq_gemm-like callable that runs one kernel's launch function directly with a forced launch plan (warps,
    grid, K slices, x staging, tile rows, K splits, tuning): what automatic planning would not pick."""
    def run(x, qw, s, z, gi, bias, bits, gs, fmt, prepared=None):
        lay = _skinny_layout(cw, prepared, qw, s, z, gi, bits, gs, x.shape[1], fmt, x.dtype, inter)
        return launch(x, lay, bias, **plan)
    return run


wq_auto = wq_kernel()


@needs_cuda
@pytest.mark.parametrize("bits,gs,act,fmt", WQ)
def test_wq_gemm(bits, gs, act, fmt):
    from bie_backend_cuda import weight_only as cw
    k, n = (256, 72) if gs != 32 else (200, 40)
    qw, s, z, gi, w64 = _wq_case(k, n, bits, gs, fmt, act, bits * 100 + (gs % 97) + act * 7)
    gen = torch.Generator().manual_seed(11)
    prepared = cw.prepare(qw, s, z, gi)
    for i, m in enumerate((1, 3, 16, 17, 64, 65, 300)):
        dtype = (torch.float16, torch.bfloat16, torch.float32)[i % 3]
        x = torch.randn((m, k), generator=gen).to(dtype).cuda()
        bias = torch.randn(n, generator=gen).to(dtype).cuda() if i % 2 else None
        got = wq_auto(x, qw, s, z, gi, bias, bits, gs, fmt)
        _close(got, w64, x, dtype, k, f"M={m} {dtype}", bias)
    g = torch.randn((5, n), generator=gen).to(torch.bfloat16).cuda()
    got = cw.wq_gemm_grad_input(g, qw, s, z, gi, bits, gs, k, fmt, prepared=prepared)
    _close(got, w64.t(), g, torch.bfloat16, n, "grad_input")
    w = cw.wq_dequantize(qw, s, z, gi, bits, gs, k, fmt, torch.float32, prepared=prepared)
    torch.testing.assert_close(w.double().cpu(), w64, rtol=2 ** -10, atol=2 ** -10 * float(w64.pow(2).mean().sqrt()))


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("bits,fmt,act", [(4, "gptq", False), (3, "gba", True)])
def test_wq_gemm_dense_rounds_product_and_bias_once(bits, fmt, act, dtype):
    """Dequantize + cuBLAS adds the bias to the float32 product and rounds once. A bias that cancels most of
    the product exposes a second rounding: the product's own (at its size) would be kept in the small output."""
    from bie_backend_cuda import weight_only as cw
    k, n, m = 160, 72, 64
    qw, s, z, gi, _ = _wq_case(k, n, bits, 128 if not act else 32, fmt, act, 977 + bits)
    gs = 128 if not act else 32
    gen = torch.Generator().manual_seed(5)
    x = torch.randn((m, k), generator=gen).to(dtype).cuda()
    # the weight as this route multiplies it: the product of the identity (one exact term an output)
    w = cw.wq_gemm_dense(torch.eye(k, dtype=dtype, device="cuda"), qw, s, z, gi, None, bits, gs, fmt).double()
    prod = x.double() @ w
    bias = (-prod[0] + 0.01 * torch.randn(n, generator=gen, dtype=torch.float64).cuda()).to(dtype)
    exact = (prod + bias.double())[0]
    got = cw.wq_gemm_dense(x, qw, s, z, gi, bias, bits, gs, fmt)[0].double()
    # one rounding of the exact sum, plus float32 accumulation of K products and of the bias
    bound = exact.abs() * 2.0 ** (-8 if dtype is torch.bfloat16 else -11) + \
        (k + 2) * 2.0 ** -24 * ((x[0].double().abs() @ w.abs()) + bias.double().abs())
    assert bool(((got - exact).abs() <= bound).all()), f"max err {float((got - exact).abs().max()):.3g}"


DEQ = [(bits, gs, act, fmt) for bits in (1, 2, 4, 8) for gs, act, fmt in
       ((32, False, "gptq"), (128, True, "gba"), (-1, False, "gba"), (64, True, "gptq"))] + [(1, 16, False, "gptq")]


@needs_cuda
@pytest.mark.parametrize("bits,gs,act,fmt", DEQ)
def test_wq_dequant_columns_exact(bits, gs, act, fmt):
    """The canonical dequantize kernel is the reference bit for bit (fp32 math, one rounding to the output dtype):
    the whole weight and column ranges written into a strided buffer (vector and scalar paths: N % 4 == 0 or not,
    K off the packed word, act-order, groups shorter than a word), nothing written outside its columns."""
    from bie_backend_cpu.reference import weight_only as rw
    from bie_backend_cuda import weight_only as cw
    ops = cw._build.ops()
    for k, n in ((300, 1000), (300, 1001)):
        qw, s, z, gi, _ = _wq_case(k, n, bits, gs, fmt, act, 31 * bits + n + max(gs, 0))
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            ref = rw.wq_dequantize(qw.cpu(), s.cpu(), z.cpu(), None if gi is None else gi.cpu(), bits, gs, k, fmt, dt)
            got = cw.wq_dequantize(qw, s, z, gi, bits, gs, k, fmt, dt)
            assert torch.equal(got.cpu(), ref), f"whole weight {bits}-bit {fmt} g{gs} N={n} {dt}"
            buf = torch.full((k, 264), float("nan"), dtype=dt, device="cuda")
            for n0, nc in ((0, 256), (256, 256), (512, 260), (n - 232, 232), (3, 1), (n - 5, 5)):
                buf.fill_(float("nan"))
                ops.wq_dequant_canonical(qw, s, z, gi, bits, gs, k, fmt == "gptq", dt, n0, buf[:, :nc])
                assert torch.equal(buf[:, :nc].cpu(), ref[:, n0:n0 + nc]), f"columns [{n0}, {n0 + nc}) {dt}"
                assert bool(buf[:, nc:].isnan().all()), f"columns [{n0}, {n0 + nc}): wrote past its columns"


@needs_cuda
def test_wq_large_m_and_bad_column_ranges():
    """M > 64 (dequantize + cuBLAS) with odd N, act-order, bias, fp16 / bf16 / fp32 activations; and column
    ranges the dequantize op refuses."""
    from bie_backend_cuda import weight_only as cw
    gen = torch.Generator().manual_seed(41)
    for bits, fmt, act, n in ((4, "gptq", True, 300), (2, "gba", False, 257), (8, "gptq", False, 128 * 3)):
        k = 264
        qw, s, z, gi, w64 = _wq_case(k, n, bits, 64, fmt, act, 40 + bits)
        for m, dt in ((257, torch.bfloat16), (300, torch.float16), (271, torch.float32)):   # (past the wgmma rows)
            x = torch.randn((m, k), generator=gen).to(dt).cuda()
            bias = torch.randn(n, generator=gen).to(dt).cuda() if m % 2 else None
            _close(wq_auto(x, qw, s, z, gi, bias, bits, 64, fmt), w64, x, dt, k, f"large M={m} N={n} {dt}", bias)
    ops = cw._build.ops()
    qw, s, z, gi, _ = _wq_case(64, 40, 4, 32, "gptq", False, 3)
    with pytest.raises(RuntimeError, match="outside N"):
        ops.wq_dequant_canonical(qw, s, z, None, 4, 32, 64, True, torch.float16, 32, torch.empty(64, 16).half().cuda())
    with pytest.raises(RuntimeError, match="out must be"):
        ops.wq_dequant_canonical(qw, s, z, None, 4, 32, 64, True, torch.float16, 0, torch.empty(16, 64).half().cuda().t())
    with pytest.raises(RuntimeError, match="n0 needs out"):
        ops.wq_dequant_canonical(qw, s, z, None, 4, 32, 64, True, torch.float16, 8, None)


@needs_cuda
def test_wq_large_shapes_split_k_deterministic_and_graphs():
    from bie_backend_cuda import weight_only as cw
    k, n = 4096, 1000
    qw, s, z, gi, w64 = _wq_case(k, n, 4, 128, "gptq", True, 7)
    prepared = cw.prepare(qw, s, z, gi)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn((1, k), generator=gen).half().cuda()
    y1 = wq_auto(x, qw, s, z, gi, None, 4, 128, "gptq")
    y2 = wq_auto(x, qw, s, z, gi, None, 4, 128, "gptq")
    assert torch.equal(y1, y2)
    _close(y1, w64, x, torch.float16, k, "K=4096")
    # CUDA graph capture and replay
    static_x = x.clone()
    graph_replays(lambda x_: wq_auto(x_, qw, s, z, gi, None, 4, 128, "gptq"), static_x,
                   lambda: torch.randn((1, k), generator=gen).half().cuda(),
                   lambda out: _close(out, w64, static_x, torch.float16, k, "graph replay"), 3)


SKINNY = [(bits, gs, fmt, sdt) for bits in (1, 2, 3, 4, 8) for gs, fmt, sdt in
          ((32, "gptq", torch.float16), (64, "gba", torch.bfloat16), (128, "gptq", torch.bfloat16),
           (-1, "gba", torch.float16), (16, "gptq", torch.float16))]


@needs_cuda
@pytest.mark.parametrize("bits,gs,fmt,sdt", SKINNY)
def test_wq_skinny_kernel_every_m(bits, gs, fmt, sdt):
    """The M <= 16 kernel: every row count, odd N, K off the vector and group grid, split-K, fp16/bf16 statistics,
    unaligned x (scalar staging), against the float64 product and the general small-M kernel."""
    from bie_backend_cuda import weight_only as cw
    k, n = (997, 200) if bits != 8 else (520, 136)     # K % 8 != 0: scalar x staging
    if gs == 16:
        k, n = 304, 24
    act = bits in (3, 4)
    qw, s, z, gi, w64 = _wq_case(k, n, bits, gs, fmt, act, 5 * bits + max(gs, 0), sdtype=sdt)
    gen = torch.Generator().manual_seed(bits + 3)
    prepared = cw.prepare(qw, s, z, gi)
    _skinny_rows(wq_kernel("wq_gemm_skinny"), qw, s, z, gi, w64, bits, gs, fmt, k, n, gen)
    _skinny_rows(launching(cw.launch_skinny, cw, inter=False), qw, s, z, gi, w64, bits, gs, fmt, k, n, gen, prepared,
                 what="skinny (column blocks not interleaved)")
    # the small-M tensor-core kernel agrees (both are fp32-accumulated)
    x = torch.randn((5, k), generator=gen).half().cuda()
    a = wq_kernel("wq_gemm_skinny")(x, qw, s, z, gi, None, bits, gs, fmt)
    b = wq_kernel("wq_gemm_mma")(x, qw, s, z, gi, None, bits, gs, fmt)
    torch.testing.assert_close(a.float(), b.float(), rtol=2e-3, atol=2e-3 * float(b.float().abs().max()))


def _skinny_rows(run, qw, s, z, gi, w64, bits, gs, fmt, k, n, gen, prepared=None, rows=range(1, 17), what="skinny",
                 shift=0):
    """Every row count through ``run`` (a wq_gemm-like callable): fresh x in fp16/bf16/fp32 (every fourth one 2 bytes off 16-byte alignment),
    bias on odd counts, NaN-poisoned outputs, against the float64 product, and a second call bit-identical."""
    for m in rows:
        dtype = (torch.float16, torch.bfloat16, torch.float32)[(m + shift) % 3]
        if m % 4 == 0:   # contiguous, but 2 bytes off 16-byte alignment
            x = torch.randn((m * k + 1,), generator=gen).to(dtype).cuda()[1:].view(m, k)
        else:
            x = torch.randn((m, k), generator=gen).to(dtype).cuda()
        bias = torch.randn(n, generator=gen).to(dtype).cuda() if m % 2 else None
        out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
        out.copy_(run(x, qw, s, z, gi, bias, bits, gs, fmt, prepared=prepared))
        _close(out, w64, x, dtype, k, f"{what} M={m} {dtype}", bias)
        again = run(x, qw, s, z, gi, bias, bits, gs, fmt, prepared=prepared)
        assert torch.equal(out, again), f"{what} kernel is not deterministic"


@needs_cuda
def test_wq_skinny_big_layer_split_k_and_graphs():
    from bie_backend_cuda import weight_only as cw
    k, n = 8192, 1032
    qw, s, z, gi, w64 = _wq_case(k, n, 4, 128, "gptq", False, 21, sdtype=torch.float16)
    prepared = cw.prepare(qw, s, z, gi)
    gen = torch.Generator().manual_seed(4)
    for m, tune in ((1, 0), (16, 0), (7, 1 << 4), (3, (8 << 4) | (40 << 8))):
        run = launching(cw.launch_skinny, cw, tune=tune)
        x = torch.randn((m, k), generator=gen).bfloat16().cuda()
        y = run(x, qw, s, z, gi, None, 4, 128, "gptq", prepared=prepared)
        _close(y, w64, x, torch.bfloat16, k, f"K=8192 M={m} tune={tune}")
        static_x = x.clone()
        graph_replays(lambda x_: run(x_, qw, s, z, gi, None, 4, 128, "gptq", prepared=prepared),
                       static_x, lambda: torch.randn((m, k), generator=gen).bfloat16().cuda(),
                       lambda out: _close(out, w64, static_x, torch.bfloat16, k, f"graph replay M={m}"), 2)


def _captured(fn):
    """A CUDA graph of fn() on torch.cuda.graph's shared capture stream, and fn's result."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@needs_cuda
def test_graphs_captured_on_one_stream_replay_at_once_on_two():
    """Two graphs of the skinny kernel with K splits, captured one after the other on the shared capture stream,
    replayed at the same time on two streams: each gives what its eager call gave, every time."""
    from bie_backend_cuda import weight_only as cw
    k, n = 8192, 1032
    qw, s, z, gi, _ = _wq_case(k, n, 4, 128, "gptq", False, 21, sdtype=torch.float16)
    prepared = cw.prepare(qw, s, z, gi)
    run = launching(cw.launch_skinny, cw, tune=(8 << 4) | (40 << 8))   # K splits (as in the test above)
    gen = torch.Generator().manual_seed(6)
    xs = [torch.randn((3, k), generator=gen).bfloat16().cuda() for _ in range(2)]
    want = [run(x, qw, s, z, gi, None, 4, 128, "gptq", prepared=prepared) for x in xs]
    graphs = [_captured(lambda x=x: run(x, qw, s, z, gi, None, 4, 128, "gptq", prepared=prepared)) for x in xs]
    streams = [torch.cuda.Stream() for _ in graphs]
    for _ in range(30):
        for (graph, _), st in zip(graphs, streams):
            st.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(st):
                graph.replay()
        for st in streams:
            torch.cuda.current_stream().wait_stream(st)
        torch.cuda.synchronize()
        for (_, out), w in zip(graphs, want):
            assert torch.equal(out, w)


THIN = [(bits, gs, fmt, sdt) for bits in (1, 2, 3, 4) for gs, fmt, sdt in
        ((32, "gptq", torch.float16), (64, "gba", torch.bfloat16), (128, "gptq", torch.bfloat16),
         (256, "gba", torch.float16), (-1, "gptq", torch.bfloat16))]
THIN += [(8, 32, "gba", torch.bfloat16), (8, 128, "gptq", torch.float16), (8, 256, "gptq", torch.bfloat16),
         (8, -1, "gptq", torch.bfloat16), (8, -1, "gba", torch.float16)]


def _thin_calls(monkeypatch, cw):
    """Count the calls that reach the thin kernel (so a test fails if dispatch silently goes elsewhere): through its
    op, and through the library function that bound calls (bind_thin) launch."""
    calls = []

    class Spy:
        def __init__(self, lib):
            self.lib = lib

        def __getattr__(self, name):
            f = getattr(self.lib, name)
            if name != "wq_thin_gemm":
                return f
            return lambda *a: calls.append(a[-1]) or f(*a)
    ops, direct = Spy(cw._build.ops()), Spy(cw._build.direct())
    monkeypatch.setattr(cw._build, "ops", lambda: ops)
    monkeypatch.setattr(cw._build, "direct", lambda: direct)
    return calls


@needs_cuda
@pytest.mark.parametrize("bits,gs,fmt,sdt", THIN)
def test_wq_thin_kernel_every_m(bits, gs, fmt, sdt, monkeypatch):
    """The thin GEMV kernel (M <= 16): every row count, odd N, K off the 128-k stage and group grid (but % 8 == 0),
    fp16/bf16 statistics and activations, act-order, misaligned x, K splits over 1..16 warps (uneven ranges), x
    staged whole, copied per stage (2-8 rows, planned) or staged in K slices (forced: 2 and 3 slices, every row
    count, the one-row variant too), NaN-poisoned outputs, determinism; against the float64 product and the wqv
    kernel."""
    from bie_backend_cuda import weight_only as cw
    k, n = (1000, 200) if gs != 256 else (1288, 136)
    act = bits in (3, 4)
    qw, s, z, gi, w64 = _wq_case(k, n, bits, gs, fmt, act, 7 * bits + max(gs, 0), sdtype=sdt)
    gen = torch.Generator().manual_seed(bits + 5)
    prepared = cw.prepare(qw, s, z, gi)
    calls = _thin_calls(monkeypatch, cw)
    for warps, grid, inter, slices, xpre in ((0, 0, True, 0, -2), (1, 3, False, 0, 0), (3, 0, True, 2, 1),
                                             (16, 1, False, 3, 7), (0, 5, True, 3, -1), (0, 0, True, 2, -3),
                                             (16, 2, False, 3, -3), (5, 0, True, 0, -3)):
        # K splits, persistent blocks (items per block), both code layouts, K slices (grids of 1-2 blocks
        # per slice), every way of staging x (planned; cp.async after 0, 1 or all first stages; registers;
        # in chunks by bulk copies, with warps that have no item: 13 items, 16 warps, one block per slice)
        run = launching(cw.launch_thin, cw, inter=inter, warps=warps, grid=grid, slices=slices, xpre=xpre)
        _skinny_rows(run, qw, s, z, gi, w64, bits, gs, fmt, k, n, gen, prepared, rows=range(1, 17),
                     what=f"thin warps={warps} slices={slices} xpre={xpre}", shift=warps)
    assert len(calls) == 8 * 16 * 2, f"{len(calls)} calls reached the thin kernel"
    # the thin kernel chosen through the dispatcher, and the skinny kernel, agree (both accumulate in float32)
    x = torch.randn((5, k), generator=gen).bfloat16().cuda()
    a = wq_kernel("wq_gemm_thin")(x, qw, s, z, gi, None, bits, gs, fmt)
    assert len(calls) == 8 * 16 * 2 + 1
    b = wq_kernel("wq_gemm_skinny")(x, qw, s, z, gi, None, bits, gs, fmt)
    torch.testing.assert_close(a.float(), b.float(), rtol=4e-3, atol=4e-3 * float(b.float().abs().max()))


@needs_cuda
@pytest.mark.parametrize("bits,gs,fmt,sdt", [c for c in THIN if c[0] in (4, 8)])
def test_wq_thin_one_tile_rings(bits, gs, fmt, sdt, monkeypatch):
    """1-8 rows of 4- and 8-bit codes through the one-tile kernels (the ring depth the plan picks for the layer), with
    every x staging, 1-16 warps and K slices: against the float64 product, and deterministic."""
    from bie_backend_cuda import weight_only as cw
    k, n = (3000, 72) if gs != 256 else (3336, 72)
    qw, s, z, gi, w64 = _wq_case(k, n, bits, gs, fmt, bits == 4, 31 + max(gs, 0), sdtype=sdt)
    prepared = cw.prepare(qw, s, z, gi)
    gen = torch.Generator().manual_seed(29)
    calls = _thin_calls(monkeypatch, cw)
    ways = ((1, 0, -2, 0), (1, 1, 0, 0), (1, 3, 1, 0), (1, 16, 2, 2), (1, 5, -1, 3), (2, 0, -2, 0), (3, 3, 1, 0),
            (4, 16, -1, 0), (5, 0, -2, 0), (6, 16, -3, 2), (8, 7, -1, 3), (8, 0, -3, 0))
    for m, warps, xpre, slices in ways:
        run = launching(cw.launch_thin, cw, warps=warps, xpre=xpre, slices=slices)
        x = torch.randn((m, k), generator=gen).bfloat16().cuda()
        y = run(x, qw, s, z, gi, None, bits, gs, fmt, prepared=prepared)
        _close(y, w64, x, torch.bfloat16, k, f"M={m} warps={warps} xpre={xpre} slices={slices}")
        assert torch.equal(y, run(x, qw, s, z, gi, None, bits, gs, fmt, prepared=prepared)), f"M={m}: not deterministic"
    assert len(calls) == 2 * len(ways)


@needs_cuda
@pytest.mark.parametrize("n", [392, 203])
def test_wq_thin_slices_reduction(n, monkeypatch):
    """The K slices' reduction kernels (four outputs a thread where N % 4 == 0 and the output is large enough, else
    one), with and without bias, for fp16 / bf16 / fp32 outputs, 2-5 slices, 1-16 rows: against the float64 product,
    deterministic."""
    from bie_backend_cuda import weight_only as cw
    k = 2056
    qw, s, z, gi, w64 = _wq_case(k, n, 4, 128, "gptq", False, 50 + n, sdtype=torch.bfloat16)
    prepared = cw.prepare(qw, s, z, gi)
    gen = torch.Generator().manual_seed(n)
    calls = _thin_calls(monkeypatch, cw)
    for m, slices, dtype in ((1, 2, torch.bfloat16), (3, 3, torch.float16), (8, 5, torch.float32), (9, 2, torch.bfloat16),
                             (16, 4, torch.float16)):
        run = launching(cw.launch_thin, cw, slices=slices)
        x = torch.randn((m, k), generator=gen).to(dtype).cuda()
        bias = torch.randn(n, generator=gen).to(dtype).cuda() if m % 2 else None
        y = run(x, qw, s, z, gi, bias, 4, 128, "gptq", prepared=prepared)
        _close(y, w64, x, dtype, k, f"M={m} slices={slices}", bias)
        assert torch.equal(y, run(x, qw, s, z, gi, bias, 4, 128, "gptq", prepared=prepared)), f"M={m}: not deterministic"
    assert len(calls) == 10


@needs_cuda
@pytest.mark.parametrize("n,k", [(392, 2056), (203, 4096), (66000, 512), (16400, 8192)])
def test_wq_thin_slices_summed_alike_eager_and_in_graphs(n, k, monkeypatch):
    """K slices are summed by the warp that writes an item's last partial when called eagerly on a layer of at most
    2^27 weights, and by a reduction kernel when recorded into a CUDA graph or on a larger layer (16400 x 8192): the
    same additions in the same order, so the same bits. Forced and planned slices, 1-16 rows, with and without bias;
    66000 columns outgrow the stream's first arrival counters."""
    from bie_backend_cuda import weight_only as cw
    qw, s, z, gi, w64 = _wq_case(k, n, 4, 128, "gptq", False, 70 + n, sdtype=torch.bfloat16)
    prepared = cw.prepare(qw, s, z, gi)
    gen = torch.Generator().manual_seed(n)
    calls = _thin_calls(monkeypatch, cw)
    for m, slices, dtype in ((1, 2, torch.bfloat16), (5, 0, torch.bfloat16), (8, 3, torch.float16), (6, 0, torch.float16),
                             (12, 2, torch.bfloat16), (16, 0, torch.float32)):
        run = launching(cw.launch_thin, cw, slices=slices)
        x = torch.randn((m, k), generator=gen).to(dtype).cuda()
        bias = torch.randn(n, generator=gen).to(dtype).cuda() if m % 2 == 0 else None
        eager = run(x, qw, s, z, gi, bias, 4, 128, "gptq", prepared=prepared)
        _close(eager, w64, x, dtype, k, f"eager M={m} slices={slices}", bias)
        for _ in range(2):   # the counters are left zero: later calls sum alike
            assert torch.equal(eager, run(x, qw, s, z, gi, bias, 4, 128, "gptq", prepared=prepared)), f"M={m}"
        static_x = x.clone()
        got = []
        graph_replays(lambda x_: run(x_, qw, s, z, gi, bias, 4, 128, "gptq", prepared=prepared), static_x,
                       lambda: x, lambda out: got.append(out.clone()), 1)
        assert torch.equal(got[0], eager), f"M={m} slices={slices}: graph replay differs from the eager call"
        fresh = torch.cuda.Stream()   # a stream's first eager call: its counters are made and zeroed first
        with torch.cuda.stream(fresh):
            other = run(x, qw, s, z, gi, bias, 4, 128, "gptq", prepared=prepared)
        torch.cuda.synchronize()
        assert torch.equal(other, eager), f"M={m} slices={slices}: a new stream's first call differs"
    assert len(calls) >= 6 * 6


@needs_cuda
def test_wq_thin_big_layer_and_graphs(monkeypatch):
    """A 28672-wide K (many stages per warp, every ring slot reused) and CUDA-graph replay with new inputs."""
    from bie_backend_cuda import weight_only as cw
    k, n = 28672, 264
    qw, s, z, gi, w64 = _wq_case(k, n, 4, 128, "gptq", False, 23, sdtype=torch.float16)
    prepared = cw.prepare(qw, s, z, gi)
    gen = torch.Generator().manual_seed(6)
    calls = _thin_calls(monkeypatch, cw)
    thin = wq_kernel("wq_gemm_thin")
    for m in (1, 3, 8, 12, 16):   # 8-16 rows of K = 28672 staged in K slices (planned)
        x = torch.randn((m, k), generator=gen).bfloat16().cuda()
        y = thin(x, qw, s, z, gi, None, 4, 128, "gptq")
        _close(y, w64, x, torch.bfloat16, k, f"K=28672 M={m}")
        static_x = x.clone()
        graph_replays(lambda x_: thin(x_, qw, s, z, gi, None, 4, 128, "gptq"),
                       static_x, lambda: torch.randn((m, k), generator=gen).bfloat16().cuda(),
                       lambda out: _close(out, w64, static_x, torch.bfloat16, k, f"graph replay M={m}"), 2)
    assert len(calls) >= 5
    # a long single row (97 KiB staged copy of x), and 8 rows too long for the staged copy (> 128 KiB): per-stage
    # x copies serve them
    for m, k, n in ((1, 49664, 40), (8, 8200, 40)):
        qw, s, z, gi, w64 = _wq_case(k, n, 2, 64, "gba", False, 29 + m, sdtype=torch.bfloat16)
        x = torch.randn((m, k), generator=gen).half().cuda()
        y = thin(x, qw, s, z, gi, None, 2, 64, "gba")
        _close(y, w64, x, torch.float16, k, f"K={k} M={m}")
    assert len(calls) >= 7


@needs_cuda
def test_wq_thin_one_row_planned_slices(monkeypatch):
    """One row of 4-bit codes in groups of 128 on layers of more than 2^24 weights: the plan stages x in K slices
    (the warps split the columns, a reduction kernel sums the slices); on narrow layers it splits K over 16 warps.
    Planned launches against the float64 product and against x staged whole (slices=-1), with and without bias,
    fp16 and bf16, deterministic."""
    from bie_backend_cuda import weight_only as cw
    gen = torch.Generator().manual_seed(44)
    calls = _thin_calls(monkeypatch, cw)
    thin = wq_kernel("wq_gemm_thin")
    whole = launching(cw.launch_thin, cw, slices=-1)
    # just over 2^24 weights (sliced, 8 stages of K), long K (sliced), wide N, and a narrow layer (not sliced)
    for k, n, dtype in ((4096, 4104, torch.bfloat16), (1024, 16400, torch.float16), (14336, 1208, torch.bfloat16),
                        (4096, 1032, torch.float16)):
        qw, s, z, gi, w64 = _wq_case(k, n, 4, 128, "gptq", False, k + n, sdtype=dtype)
        x = torch.randn((1, k), generator=gen).to(dtype).cuda()
        bias = torch.randn(n, generator=gen).to(dtype).cuda() if n % 3 else None
        y = thin(x, qw, s, z, gi, bias, 4, 128, "gptq")
        _close(y, w64, x, dtype, k, f"{k}x{n} planned", bias)
        assert torch.equal(y, thin(x, qw, s, z, gi, bias, 4, 128, "gptq")), f"{k}x{n}: not deterministic"
        y_whole = whole(x, qw, s, z, gi, bias, 4, 128, "gptq")
        torch.testing.assert_close(y.float(), y_whole.float(), rtol=4e-3, atol=4e-3 * float(y_whole.float().abs().max()))
        if k == 4096 and n == 4104:   # the slices' partials and their reduction under CUDA-graph replay
            static_x = x.clone()
            run = lambda x_: thin(x_, qw, s, z, gi, bias, 4, 128, "gptq")  # noqa: E731
            graph_replays(run, static_x, lambda: torch.randn((1, k), generator=gen).to(dtype).cuda(),
                           lambda out: _close(out, w64, static_x, dtype, k, "graph replay", bias), 2)
    assert len(calls) >= 12


@needs_cuda
def test_wq_thin_chunked_x_on_a_big_layer(monkeypatch):
    """Where the plan stages x in chunks by bulk copies (K slices of 4-bit codes in groups of 128, more than 2^27
    weights, sm_90), with the blocks' items in turn: 5-16 rows against the float64 product of the dequantized weight
    (random codes made on the GPU), forced chunks and the register staging agree, also under CUDA-graph replay."""
    from bie_backend_cuda import weight_only as cw
    from bie_core.ops.weight_only import num_groups, packed_rows
    k, n = 28672, 4736   # 135.8M weights
    gen = torch.Generator(device="cuda").manual_seed(26)
    qw = torch.randint(-2 ** 31, 2 ** 31 - 1, (packed_rows(k, 4), n), device="cuda", dtype=torch.int32, generator=gen)
    s = (torch.rand((num_groups(k, 128), n), device="cuda", generator=gen) + 0.5).half() / 16
    z = torch.randint(-2 ** 31, 2 ** 31 - 1, (num_groups(k, 128), packed_rows(n, 4)), device="cuda", dtype=torch.int32,
                      generator=gen)
    prepared = cw.prepare(qw, s, z, None)
    cols = torch.arange(0, n, 37, device="cuda")   # the reference on every 37th column (float64 on the GPU)
    w64 = cw.wq_dequantize(qw, s, z, None, 4, 128, k, "gptq", torch.float32)[:, cols].double()
    run = lambda x_: wq_kernel("wq_gemm_thin")(x_, qw, s, z, None, None, 4, 128, "gptq")  # noqa: E731
    forced = lambda xpre: lambda x_: launching(cw.launch_thin, cw, xpre=xpre)(  # noqa: E731
        x_, qw, s, z, None, None, 4, 128, "gptq", prepared=prepared)
    for m in (5, 8, 13, 16):
        x = torch.randn((m, k), device="cuda", generator=gen).bfloat16()
        y = run(x)
        exp = x.double() @ w64
        err = float((y[:, cols].double() - exp).abs().max() / exp.abs().max())
        assert err < 1e-2, f"M={m}: relative error {err}"
        torch.testing.assert_close(forced(-3)(x), y, rtol=0, atol=0)
        torch.testing.assert_close(forced(-1)(x).float(), y.float(), rtol=1e-2, atol=1e-2 * float(y.float().abs().max()))
        static_x = x.clone()
        graph_replays(run, static_x, lambda: torch.randn((m, k), device="cuda", generator=gen).bfloat16(),
                       lambda out: torch.testing.assert_close(out, run(static_x), rtol=0, atol=0), 2)


@needs_cuda
def test_wq_thin_x_ring(monkeypatch):
    """x through a ring of chunks that the block's last warp copies and sums: the plan's choice for 9-16 rows of 4-bit
    codes in groups of 128 on layers of more than 2^27 weights whose items fit one pass of one K slice (28672 x 8192
    on an H100 / H200), fp16 / bf16, gptq / gba, bias; against the float64 product of the dequantized weight (random
    codes made on the GPU, every 37th column), deterministic, under CUDA-graph replay, and level with x staged in two
    K slices (forced: no ring)."""
    from bie_backend_cuda import weight_only as cw
    from bie_core.ops.weight_only import num_groups, packed_rows
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the x ring takes bulk copies (sm_90)")
    calls = _thin_calls(monkeypatch, cw)
    gen = torch.Generator(device="cuda").manual_seed(30)
    k, n = 8192, 28672
    for m, fmt, dtype, with_bias in ((16, "gptq", torch.bfloat16, False), (9, "gba", torch.float16, True),
                                     (12, "gptq", torch.float16, True)):
        qw = torch.randint(-2 ** 31, 2 ** 31 - 1, (packed_rows(k, 4), n), device="cuda", dtype=torch.int32,
                           generator=gen)
        s = ((torch.rand((num_groups(k, 128), n), device="cuda", generator=gen) + 0.5) / 16).to(dtype)
        if fmt == "gptq":
            z = torch.randint(-2 ** 31, 2 ** 31 - 1, (num_groups(k, 128), packed_rows(n, 4)), device="cuda",
                              dtype=torch.int32, generator=gen)
        else:
            z = (torch.rand((num_groups(k, 128), n), device="cuda", generator=gen) / 8).to(dtype)
        cols = torch.arange(0, n, 37, device="cuda")
        w64 = cw.wq_dequantize(qw, s, z, None, 4, 128, k, fmt, torch.float32)[:, cols].double()
        bias = torch.randn(n, device="cuda", generator=gen).to(dtype) if with_bias else None
        run = lambda x_: wq_kernel("wq_gemm_thin")(x_, qw, s, z, None, bias, 4, 128, fmt)  # noqa: E731
        x = torch.randn((m, k), device="cuda", generator=gen).to(dtype)
        y = run(x)
        exp = x.double() @ w64 + (0 if bias is None else bias[cols].double())
        err = float((y[:, cols].double() - exp).abs().max() / exp.abs().max())
        assert err < 1e-2, f"M={m} {fmt} {dtype}: relative error {err}"
        assert torch.equal(run(x), y), f"M={m}: not deterministic"
        sliced = launching(cw.launch_thin, cw, slices=2)(x, qw, s, z, None, bias, 4, 128, fmt,
                                                         prepared=cw.prepare(qw, s, z, None))
        torch.testing.assert_close(sliced.float(), y.float(), rtol=1e-2, atol=1e-2 * float(y.float().abs().max()))
        static_x = x.clone()
        graph_replays(run, static_x, lambda: torch.randn((m, k), device="cuda", generator=gen).to(dtype),
                       lambda out: torch.testing.assert_close(out, run(static_x), rtol=0, atol=0), 2)
    assert len(calls) >= 3 * 6


@needs_cuda
@pytest.mark.parametrize("kernel", ["thin", "thin-sliced", "skinny"])
def test_wq_programmatic_launch_chain(kernel, monkeypatch):
    """Programmatic dependent launch of the thin (wqt) and skinny (wqv) kernels: each call prefetches its weights
    while the previous kernel runs and must read x (and use workspaces and counters) only after it. A chain of layers
    where every x is the previous call's output (the kernel right before), eagerly and in a CUDA graph replayed with
    new inputs; the first call of each layout (built by the kernels just before it) is launched without PDL. Every
    chain starts from a new x, so a read of an earlier chain's stale outputs fails. thin-sliced: x staged in two K
    slices, so every call is the thin kernel + the slices' reduction kernel (16 rows too)."""
    thin = kernel != "skinny"
    from bie_backend_cuda import weight_only as cw
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90")
    k = n = 2048
    spec = [(4, 128, "gptq", torch.float16), (4, 128, "gptq", torch.float16), (2, 64, "gba", torch.bfloat16),
            (8, -1, "gptq", torch.float16), (4, 32, "gba", torch.float16)]
    layers = [_wq_case(k, n, b, gs, fmt, False, 61 + i, sdtype=sd) for i, (b, gs, fmt, sd) in enumerate(spec)]
    preps = [cw.prepare(*c[:4]) for c in layers]
    ops = cw._build.ops()
    calls = []

    class Spy:
        def __getattr__(self, name):
            f = getattr(ops, name)
            if name not in ("wq_thin_gemm", "wq_skinny_gemm"):
                return f
            return lambda *a: calls.append((name, a[-3] if name == "wq_thin_gemm" else a[-1])) or f(*a)   # pdl
    monkeypatch.setattr(cw._build, "ops", lambda: Spy())
    run = {"thin": wq_kernel("wq_gemm_thin"), "skinny": wq_kernel("wq_gemm_skinny"),
           "thin-sliced": launching(cw.launch_thin, cw, slices=2)}[kernel]
    gen = torch.Generator().manual_seed(12)

    def chain(x_):
        ins, outs = [], []
        for (qw, s, z, gi, _), p, (bits, gs, fmt, _sd) in zip(layers, preps, spec):
            ins.append(x_)
            x_ = run(x_, qw, s, z, gi, None, bits, gs, fmt, prepared=p)   # the next call's x, as it is
            outs.append(x_)
        return ins, outs

    def check(ins, outs, what):
        for i, (xi, yi, c) in enumerate(zip(ins, outs, layers)):
            assert float(yi.float().abs().max()) > 0, f"{what} layer {i}: all zero"
            _close(yi, c[4], xi, torch.bfloat16, k, f"{what} layer {i}")

    for m in (1, 3, 16) if kernel == "thin-sliced" else (1, 3):
        for rep in range(3):   # first use (no PDL), then PDL with new inputs every time
            x = torch.randn((m, k), generator=gen).bfloat16().cuda()
            ins, outs = chain(x)
            check(ins, outs, f"eager M={m} call {rep}")
    names = [c[0] for c in calls[:5]]
    assert names == (["wq_thin_gemm"] * 5 if thin else ["wq_skinny_gemm"] * 5), names
    assert [c[1] for c in calls[:5]] == [False] * 5 and all(c[1] for c in calls[5:]), calls
    mg = 16 if kernel == "thin-sliced" else 1
    static_x = torch.randn((mg, k), generator=gen).bfloat16().cuda()
    graph_replays(chain, static_x, lambda: torch.randn((mg, k), generator=gen).bfloat16().cuda(),
                   lambda out: check(*out, "graph replay"), 3)


@needs_cuda
def test_wq_thin_rejects_bad_input():
    from bie_backend_cuda import _build
    ops = _build.ops()
    i32 = lambda *sh: torch.zeros(sh, dtype=torch.int32, device="cuda")  # noqa: E731
    x = torch.zeros((1, 128), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match="at most 16 rows"):
        ops.wq_thin_gemm(torch.zeros((17, 128), dtype=torch.bfloat16, device="cuda"), i32(128 * 8 * 2), i32(1, 128),
                     None, 4, 128, 128, 7, 2, True, False, True, torch.bfloat16, 0, 0, False, 0, -2)
    x9 = torch.zeros((9, 128), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match="more than 8 rows need x staged"):
        ops.wq_thin_gemm(x9, i32(128 * 8 * 2), i32(1, 128), None, 4, 128, 128, 7, 2, True, False, True, torch.bfloat16,
                     0, 0, False, -1, -2)
    with pytest.raises(RuntimeError, match="slices must be"):
        ops.wq_thin_gemm(x9, i32(128 * 8 * 2), i32(1, 128), None, 4, 128, 128, 7, 2, True, False, True, torch.bfloat16,
                     0, 0, False, -2, -2)
    with pytest.raises(RuntimeError, match="warps must be 0..16"):
        ops.wq_thin_gemm(x, i32(128 * 8 * 2), i32(1, 128), None, 4, 128, 128, 7, 2, True, False, True, torch.bfloat16,
                     17, 0, False, 0, -2)
    with pytest.raises(RuntimeError, match="xpre must be"):
        ops.wq_thin_gemm(x, i32(128 * 8 * 2), i32(1, 128), None, 4, 128, 128, 7, 2, True, False, True, torch.bfloat16,
                     0, 0, False, 0, 8)
    with pytest.raises(RuntimeError, match="groups of at least 32"):
        ops.wq_thin_gemm(x, i32(128 * 8 * 2), i32(8, 128), None, 4, 128, 128, 4, 2, True, False, True, torch.bfloat16, 0, 0, False, 0, -2)
    with pytest.raises(RuntimeError, match="prepared qweight"):
        ops.wq_thin_gemm(x, i32(5), i32(1, 128), None, 4, 128, 128, 7, 2, True, False, True, torch.bfloat16, 0, 0, False, 0, -2)
    with pytest.raises(RuntimeError, match="bits must be 2, 4 or 8"):
        ops.wq_thin_gemm(x, i32(128 * 8 * 2), i32(1, 128), None, 3, 128, 128, 7, 2, True, False, True, torch.bfloat16, 0, 0, False, 0, -2)
    with pytest.raises(RuntimeError, match="fewer groups"):
        ops.wq_thin_gemm(x, i32(128 * 8 * 2), i32(0 + 1, 128), None, 4, 128, 128, 5, 2, True, False, True, torch.bfloat16, 0, 0, False, 0, -2)


@needs_cuda
def test_wq_skinny_plan_of_exactly_48k_shared_memory():
    """Regression: the skinny kernel's plan for W8 per-channel at M=4 on 28672x8192 asks for exactly 48 KiB of
    dynamic shared memory, which with the kernel's static shared memory is over the default limit; the launcher
    raised the limit only above 48 KiB and the call failed. Checked against the general small-M kernel."""
    from bie_backend_cuda import weight_only as cw
    from bie_core.ops.weight_only import packed_rows
    gen = torch.Generator(device="cuda").manual_seed(11)
    k, n = 8192, 28672
    qw = torch.randint(-2 ** 31, 2 ** 31 - 1, (packed_rows(k, 8), n), device="cuda", dtype=torch.int32, generator=gen)
    s = (torch.rand((1, n), device="cuda", generator=gen) + 0.5).half() / 256
    z = torch.randint(-2 ** 31, 2 ** 31 - 1, (1, packed_rows(n, 8)), device="cuda", dtype=torch.int32, generator=gen)
    x = torch.randn((4, k), device="cuda", generator=gen).bfloat16()
    a = wq_kernel("wq_gemm_skinny")(x, qw, s, z, None, None, 8, -1, "gptq")
    torch.cuda.synchronize()
    b = wq_kernel("wq_gemm_mma")(x, qw, s, z, None, None, 8, -1, "gptq")
    torch.testing.assert_close(a.float(), b.float(), rtol=2e-3, atol=2e-3 * float(b.float().abs().max()))


@pytest.mark.parametrize("bits,fmt,sdt", [(4, "gptq", torch.float16), (4, "gba", torch.bfloat16),
                                           (8, "gptq", torch.bfloat16), (2, "gba", torch.float16),
                                           (8, "gba", torch.float16)])
def test_wgmma_statistics_encoding_is_exact(bits, fmt, sdt):
    """The wgmma kernel's statistics (CPU-side encoding, no GPU needed): scale | (zero + MAGIC) << 16 (GPTQ) or
    scale | -zero << 16 (GBA), both in the checkpoint's 16-bit dtype and exactly equal to the canonical values."""
    from bie_backend_cuda import weight_only as cw
    k, n = 256, 136
    from bie_core.ops.weight_only import make_wq_case
    qw, s, z, _, _ = make_wq_case(k, n, bits, 64, fmt, False, torch.Generator().manual_seed(31), "cpu", sdtype=sdt)
    lay = cw.build_layout_skinny(qw, s, z, None, bits, 64, k, fmt, torch.float16)
    stw = cw._stw(lay)
    assert stw.shape == (s.shape[0], lay.stats16.shape[1]) and stw.dtype == torch.int32
    lo = (stw & 0xFFFF).to(torch.int16).view(sdt)[:, :n]
    hi = (stw >> 16).to(torch.int16).view(sdt)[:, :n].double()
    assert torch.equal(lo, s)
    kbits = cw._KERNEL_BITS[bits]
    magic = 1024.0 if sdt is torch.float16 else (0.0 if kbits == 8 else 128.0)
    if fmt == "gptq":
        zi = cw.unpack_stream(z.t().contiguous(), bits, n).t().double()
        assert torch.equal(hi, zi + magic)
    else:
        assert torch.equal(hi, -z.double())


def test_wgmma_row_ranges():
    """Where the Hopper register-A wgmma kernel is the fastest (the thresholds measured on the H100:
    benchmarks/results/cuda_h100.md)."""
    from bie_backend_cuda import weight_only as cw
    big, small = (28672, 8192), (4096, 4096)
    assert [m for m in range(1, 300) if cw.wgmma_fast(m, *big, 4)] == list(range(9, 257))
    assert [m for m in range(1, 20) if cw.wgmma_fast(m, *small, 4)] == list(range(5, 20))
    assert [m for m in range(1, 20) if cw.wgmma_fast(m, *big, 8)] == [17, 18, 19]


def test_wgmma_tile_rows_plan():
    """The wgmma kernel's tile rows (wgmma_tile_rows) on an H100's 132 SMs: the choices measured best, from the
    grid-fill model mirrored from the launcher."""
    from bie_backend_cuda import weight_only as cw
    def plan(n, k, ms):
        return [cw.wgmma_tile_rows(m, n, k, 132) for m in ms]
    for n, k in ((28672, 8192), (8192, 28672), (4096, 4096)):
        assert plan(n, k, (9, 16, 40, 64, 96, 128, 256)) == [16, 16, 64, 64, 128, 128, 128]
    assert plan(28672, 8192, (17, 24, 32, 160, 192)) == [64, 64, 64, 64, 64]
    assert plan(8192, 28672, (17, 24, 32, 160, 192)) == [32, 32, 32, 128, 128]
    assert plan(4096, 4096, (17, 32, 192)) == [32, 32, 128]
    assert plan(25600, 5120, (24, 32, 160, 192)) == [64, 64, 64, 64]
    assert plan(4096, 11008, (24, 32, 160, 192)) == [32, 32, 128, 128]
    for n, k in ((13824, 5120), (5120, 13824), (11008, 4096), (14336, 4096)):
        assert plan(n, k, (160, 192)) == [64, 64]
    for m in range(1, 257):   # every planned tile has a grid the launcher can build
        for n, k in ((128, 128), (13824, 5120), (4096, 11008)):
            t = cw.wgmma_tile_rows(m, n, k, 132)
            assert t in (16, 32, 64, 128) and 0 < cw.wgmma_wave_fill(m, n, k, t, 132) <= 1


def test_thin_row_ranges():
    """Where the thin GEMV is the fastest (thresholds measured on the H100, benchmarks/results/cuda_h100.md): 2- and
    4-bit codes (1 and 3 bits through their layouts) up to 16 rows on any layer (x staged whole or in K slices)
    except 2 rows of a big layer whose K is above THIN_ROWS_MAX_K; 8-bit codes up to 4 rows on small layers, and on
    big ones 1 row, or 2-4 rows when the block can stage all of x (128 KiB, as csrc/wq_thin.cuh thin_mx) and K is at
    most THIN_ROWS_MAX_K."""
    from bie_backend_cuda import weight_only as cw
    for bits in (1, 2, 3, 4):
        for n, k in ((4096, 4096), (28672, 8192), (1024, 65536)):
            assert [m for m in range(1, 33) if cw.thin_fast(m, n, k, bits)] == list(range(1, 17))
        for n, k in ((8192, 28672), (8192, 65536)):   # 2 rows of a long K: the skinny kernel
            assert [m for m in range(1, 33) if cw.thin_fast(m, n, k, bits)] == [1] + list(range(3, 17))
    assert [m for m in range(1, 17) if cw.thin_fast(m, 4096, 4096, 8)] == [1, 2, 3, 4]
    assert [m for m in range(1, 17) if cw.thin_fast(m, 28672, 8192, 8)] == [1, 2, 3, 4]      # 4 x 16 KiB of x
    assert [m for m in range(1, 17) if cw.thin_fast(m, 8192, 28672, 8)] == [1]               # K > THIN_ROWS_MAX_K
    assert [m for m in range(1, 17) if cw.thin_fast(m, 1024, 65536, 8)] == [1, 2, 3, 4]      # small layer: per-stage x
    assert [m for m in range(1, 17) if cw.thin_fast(m, 8192, 65536, 8)] == [1]               # K too long to stage 2 rows


WQW = [(bits, gs, fmt, sdt, act) for bits in (1, 2, 3, 4, 8) for gs, fmt, sdt, act in
       ((128, "gptq", torch.float16, True), (64, "gba", torch.bfloat16, False), (32, "gptq", torch.bfloat16, False),
        (-1, "gba", torch.float16, True), (16, "gptq", torch.float16, False))]


@needs_hopper
@pytest.mark.parametrize("bits,gs,fmt,sdt,act", WQW)
def test_wq_wgmma_kernel(bits, gs, fmt, sdt, act):
    """The Hopper wgmma kernel: row counts around every token tile (16/32: raw codes + per-group scaling; 64/128:
    dequantized fragments) and both 64-row and 128-row tiles above 32 rows, N off the 128-column grid,
    K a multiple of 8 but not of the 128-k stage, fp16/bf16/fp32 x, bias, fp16/bf16 statistics, act-order;
    every output written (NaN-poisoned), deterministic, and equal to the dequantize + matmul path."""
    from bie_backend_cuda import weight_only as cw
    k, n = (1000, 200) if bits != 8 else (520, 136)
    if gs == 16:
        k, n = 304, 264
    qw, s, z, gi, w64 = _wq_case(k, n, bits, gs, fmt, act, 3 * bits + max(gs, 0), sdtype=sdt)
    gen = torch.Generator().manual_seed(bits * 7 + 1)
    prepared = cw.prepare(qw, s, z, gi)
    for i, m in enumerate((1, 9, 16, 17, 32, 33, 65, 127, 129, 333)):
        dtype = (torch.float16, torch.bfloat16, torch.float32)[i % 3]
        # planned tiles; 128/64-row tiles above 32 rows, split-K; 64-row tiles at any row count (the plan takes them
        # for 17-32 rows of layers whose 32-row grid fills the SMs badly); last: the pipelined many-row kernel
        # (4-bit codes, 3-bit through them, in groups of 32 or more)
        for ntok, splits in ((0, 0), (128, 0), (0, 1), (128, 3), (64, 3), (64, 0), (cw.WGMMA_ROWS_NTOK, 0)):
            if (ntok == 64 and m < 17) or (ntok == cw.WGMMA_ROWS_NTOK and (bits not in (3, 4) or gs == 16)):
                continue
            if ntok == 128 and m <= 32:
                ntok = 0
            run = launching(cw.launch_wgmma, cw, ntok=ntok, splits=splits)
            x = torch.randn((m, k), generator=gen).to(dtype).cuda()
            bias = torch.randn(n, generator=gen).to(dtype).cuda() if i % 2 else None
            out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
            out.copy_(run(x, qw, s, z, gi, bias, bits, gs, fmt, prepared=prepared))
            _close(out, w64, x, dtype, k, f"wgmma M={m} ntok={ntok} splits={splits} {dtype}", bias)
            assert torch.equal(out, run(x, qw, s, z, gi, bias, bits, gs, fmt, prepared=prepared))
    # small M through the same kernel chosen explicitly (rows of the tile masked) agrees with the small-M kernel
    x = torch.randn((3, k), generator=gen).bfloat16().cuda()
    a = wq_kernel("wq_gemm_wgmma")(x, qw, s, z, gi, None, bits, gs, fmt)
    b = wq_kernel("wq_gemm_mma")(x, qw, s, z, gi, None, bits, gs, fmt)
    torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2 * float(b.float().abs().max()))


@needs_hopper
@pytest.mark.parametrize("fmt,sdt,gs,act", [("gptq", torch.float16, 128, True), ("gba", torch.bfloat16, 32, False),
                                            ("gptq", torch.bfloat16, -1, False)])
def test_wgmma_rows_tiles(fmt, sdt, gs, act):
    """The pipelined many-row kernel: more tiles than SMs (the persistent loop, the copy ring and the three-deep
    wgmma pipeline running on across tiles), N = 11620 (91 column groups of 128, the last partly past N; N % 8 != 0:
    direct output stores) and 11520 (whole lines through shared memory), M off the
    256-row tile (rows past M read as zeros by the TMA box; the staged epilogue's second round of 128 rows partly
    or wholly past M), K off the 64-k block and K = 56 (one stage a tile), fp16 / bf16 activations with fp16 / bf16
    statistics (both conversions), bias; NaN-poisoned outputs, deterministic, against the float64 reference."""
    from bie_backend_cuda import weight_only as cw
    gen = torch.Generator().manual_seed(5)
    rows = wq_kernel("wq_gemm_wgmma_rows")
    # K = 200: four 64-k stages a tile, the last partly past K; K = 56: one stage a tile, so the next stage's
    # fragment is always the next tile's (the three-deep wgmma pipeline crosses every tile boundary).
    # N = 11620: 91 column tiles, the last partly past N; 11520: 90, all whole
    for k, n in ((200, 11620), (200, 11520), (56, 11520)):
        qw, s, z, gi, w64 = _wq_case(k, n, 4, gs, fmt, act, 77 + k, sdtype=sdt)
        prepared = cw.prepare(qw, s, z, gi)
        for m, dtype in ((300, torch.bfloat16), (129, torch.float16), (17, torch.bfloat16)):   # (> 16: past the thin kernel)
            x = torch.randn((m, k), generator=gen).to(dtype).cuda()
            bias = torch.randn(n, generator=gen).to(dtype).cuda() if m != 129 else None
            out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
            out.copy_(rows(x, qw, s, z, gi, bias, 4, gs, fmt))
            _close(out, w64, x, dtype, k, f"wqm M={m} N={n} K={k} {dtype} {fmt} g{gs}", bias)
            assert torch.equal(out, rows(x, qw, s, z, gi, bias, 4, gs, fmt))
            if k == 200 and m != 17:
                # the last partial wave's tiles split in K (forced: 2, 3 uneven parts of the 4 code blocks, 9
                # clamped to 4): float32 partials and their reduction; with more tiles than SMs (300 rows)
                # whole tiles and split ones in one launch
                for splits in (2, 3, 9):
                    run = launching(cw.launch_wgmma, cw, ntok=cw.WGMMA_ROWS_NTOK, splits=splits)
                    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
                    out.copy_(run(x, qw, s, z, gi, bias, 4, gs, fmt, prepared=prepared))
                    _close(out, w64, x, dtype, k, f"wqm split {splits} M={m} N={n} {dtype} {fmt} g{gs}", bias)
                    assert torch.equal(out, run(x, qw, s, z, gi, bias, 4, gs, fmt, prepared=prepared))


@needs_hopper
def test_wq_rows_tail_split_auto():
    """The launcher's own split of the last partial wave (K = 1024: 16 code blocks, two parts of 8 where the tail
    leaves half of the SMs idle) and its absence (no tail), against the float64 reference, deterministic."""
    from bie_backend_cuda import weight_only as cw
    gen = torch.Generator().manual_seed(9)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = wq_kernel("wq_gemm_wgmma_rows")
    k = 1024
    for n in (128 * (sms // 2 - 3), 128 * (sms + 5), 128 * sms):   # all tiles split; whole + tail; no tail
        qw, s, z, gi, w64 = _wq_case(k, n, 4, 128, "gptq", True, 3, sdtype=torch.float16)
        x = torch.randn((200, k), generator=gen).bfloat16().cuda()
        bias = torch.randn(n, generator=gen).bfloat16().cuda()
        y = rows(x, qw, s, z, gi, bias, 4, 128, "gptq")
        _close(y, w64, x, torch.bfloat16, k, f"wqm auto split N={n}", bias)
        assert torch.equal(y, rows(x, qw, s, z, gi, bias, 4, 128, "gptq"))


@needs_hopper
def test_wq_wgmma_big_layer_and_graphs():
    from bie_backend_cuda import weight_only as cw
    k, n = 4096, 2176
    qw, s, z, gi, w64 = _wq_case(k, n, 4, 128, "gptq", True, 5, sdtype=torch.float16)
    prepared = cw.prepare(qw, s, z, gi)
    gen = torch.Generator().manual_seed(8)
    x = torch.randn((300, k), generator=gen).bfloat16().cuda()
    y = wq_auto(x, qw, s, z, gi, None, 4, 128, "gptq")
    _close(y, w64, x, torch.bfloat16, k, "K=4096 M=300")
    static_x = x.clone()
    graph_replays(lambda x_: wq_auto(x_, qw, s, z, gi, None, 4, 128, "gptq"), static_x,
                   lambda: torch.randn((300, k), generator=gen).bfloat16().cuda(),
                   lambda out: _close(out, w64, static_x, torch.bfloat16, k, "graph replay"), 1)


@needs_cuda
def test_wq_nonuniform_act_order_falls_back_correctly():
    from bie_backend_cuda import weight_only as cw
    k, n = 128, 24
    qw, s, z, _, w64 = _wq_case(k, n, 4, 32, "gba", False, 9)
    gi = torch.randint(0, 4, (k,), generator=torch.Generator().manual_seed(1)).to(torch.int32)
    gi[:4] = torch.arange(4, dtype=torch.int32)
    sf, zf = s.double().cpu(), z.double().cpu()
    from bie_backend_cpu.reference import weight_only as rw
    q = rw._unpack_rows(qw.cpu(), 4, k).double()
    w = q * sf[gi.long()] - zf[gi.long()]
    x = torch.randn(3, k).half().cuda()
    for name in ("", "wq_gemm_thin", "wq_gemm_skinny", "wq_gemm_mma", "wq_gemm_dense"):
        got = wq_kernel(name)(x, qw, s, z, gi.cuda(), None, 4, 32, "gba")
        _close(got, w, x, torch.float16, k, f"non-uniform g_idx {name or 'automatic'}")


@needs_cuda
def test_dispatch_picks_cuda_kernels():
    import bie_core
    from bie_core import ops
    gen = torch.Generator().manual_seed(0)
    a, b = _bits((4, 16), 128, gen), _bits((8, 16), 128, gen)
    e = bie_core.explain(ops.binary_gemm, a, b, 128, None, None, None)
    assert "cuda:binary_gemm_tc" in str(e)
    with pytest.raises(bie_core.NoKernelError) as err:     # honest: rejected by capability, never run
        qw, s, z, gi, _ = _wq_case(96, 16, 4, 48, "gptq", False, 1)
        ops.wq_gemm(torch.randn(1, 96).half().cuda(), qw, s, z, gi, None, 4, 48, "gptq", backend="cuda")
    assert "group_size=48" in str(err.value)
    # the weight-only kernel that runs is named, and why the others did not serve
    qw, s_, z, gi, _ = _wq_case(256, 64, 4, 128, "gptq", False, 2)
    x = torch.randn(1, 256).half().cuda()
    e = bie_core.explain(ops.wq_gemm, x, qw, s_, z, gi, None, 4, 128, "gptq")
    assert e.chosen()["wq_gemm"] == "cuda:wq_gemm_thin", str(e)
    assert "cuda:wq_gemm_mma" in str(e)


def test_cache_key_covers_every_included_header(tmp_path, monkeypatch):
    """The extension's cache key hashes its sources and every header they include, transitively (tensor_map.h is
    included only through other headers): editing any of them means a new build, never a stale one."""
    import shutil
    from bie_backend_cuda import _build
    files = {p.name for p in _build.extension((9, 0)).files()}
    assert {"tensor_map.h", "hopper.cuh", "wq_thin_kernel.cuh", "launchers.h"} <= files, files
    csrc = tmp_path / "csrc"
    shutil.copytree(_build.CSRC, csrc)
    monkeypatch.setattr(_build, "CSRC", csrc)
    before = _build.build_dir((9, 0))
    (csrc / "tensor_map.h").write_text((csrc / "tensor_map.h").read_text() + "\n// edited\n")
    assert _build.build_dir((9, 0)) != before
    assert _build.build_dir((9, 0)) != _build.build_dir((8, 0))


@needs_cuda
@pytest.mark.parametrize("m,n,k", [(1, 64, 64), (7, 33, 130), (300, 520, 777)])
def test_binary_linear_fused(m, n, k):
    from bie_backend_cuda import binary as cb
    rb, _ = _ref()
    if not hasattr(rb, "binary_linear"):
        pytest.skip("binary_linear is not defined by this bie-core")
    gen = torch.Generator().manual_seed(m + n + k)
    w = _bits((n, (k + 7) // 8), k, gen)
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.randn((m, k), generator=gen).to(dt).cuda()
        shift = (torch.randn(k, generator=gen) * 0.3).to(dt).cuda()
        sa = torch.tensor(0.7).to(dt).cuda()
        sw = (torch.rand(n, generator=gen) + 0.1).cuda()
        bias = torch.randn(n, generator=gen).to(dt).cuda()
        got = cb.binary_linear(x, shift, w, k, sa, sw, bias, dt).cpu()
        ref = rb.binary_linear(x.cpu(), shift.cpu(), w.cpu(), k, sa.cpu(), sw.cpu(), bias.cpu(), dt)
        assert torch.equal(got, ref)
    assert torch.equal(cb.binary_linear(x, None, w, k, None, None, None, None).cpu(),
                       rb.binary_linear(x.cpu(), None, w.cpu(), k, None, None, None, None))


# ------------------------------------------------------------ binary conv2d
# (N, C, H, W, O, kernel, stride, padding, dilation): odd channel counts (1, 5, 33: a part word; 130: five words),
# every tap count a k step can split (1x1 .. 7x7), strides, dilation, asymmetric kernels and padding, 1 and 2
# blocks of channels, windows that cross images inside one block of 128 pixels
CONV = [
    (1, 1, 1, 1, 1, (1, 1), (1, 1), (0, 0), (1, 1)),
    (2, 3, 7, 5, 4, (3, 3), (1, 1), (1, 1), (1, 1)),
    (1, 8, 9, 9, 16, (3, 3), (2, 2), (1, 1), (1, 1)),
    (2, 16, 8, 8, 8, (1, 1), (1, 1), (0, 0), (1, 1)),
    (1, 5, 11, 6, 3, (3, 2), (2, 1), (2, 0), (1, 1)),
    (1, 6, 12, 12, 6, (3, 3), (1, 1), (2, 2), (2, 2)),
    (2, 64, 14, 14, 64, (3, 3), (1, 1), (1, 1), (1, 1)),
    (1, 130, 9, 10, 33, (3, 3), (1, 1), (1, 1), (1, 1)),
    (3, 64, 8, 8, 128, (1, 1), (2, 2), (0, 0), (1, 1)),
    (2, 33, 13, 11, 70, (5, 5), (1, 2), (2, 1), (1, 2)),
    (3, 32, 7, 7, 65, (3, 3), (1, 1), (1, 1), (1, 1)),
    (1, 3, 20, 18, 8, (7, 7), (2, 2), (3, 3), (1, 1)),   # a stem conv: 49 taps (pad 0 is refused there)
    (5, 96, 5, 5, 31, (3, 1), (1, 1), (1, 0), (1, 1)),
    # more than 64 K words: the weights in 32-word chunks through two buffers (a partial last chunk; odd channel
    # words, whose two words of a k step are read apart, and even ones)
    (1, 96, 7, 6, 20, (5, 5), (1, 1), (2, 2), (1, 1)),
    (1, 288, 5, 6, 40, (3, 3), (1, 1), (1, 1), (1, 1)),
    (2, 256, 6, 5, 72, (3, 3), (2, 1), (1, 1), (1, 1)),
]


@pytest.mark.parametrize("c,kh,kw", [(1, 1, 1), (37, 3, 2), (64, 3, 3), (130, 1, 3)])
def test_conv_weight_layout(c, kh, kw):
    """The direct conv's weight words (device ops only, so checked on the CPU too): K in (tap, channel word) order,
    bit b of word (t, cw) = channel 32 cw + b, zero past C and past the taps' words, rows of a multiple of 8 words;
    per-row and per-tap popcounts."""
    from bie_backend_cuda.binary import conv_weight
    rb, _ = _ref()
    gen = torch.Generator().manual_seed(c + kh + kw)
    o, k = 5, c * kh * kw
    w = _bits((o, (k + 7) // 8), k, gen, device="cpu")
    words, popc, taps = conv_weight(w, c, kh, kw)
    cw = -(-c // 32)
    assert words.dtype == torch.int32 and words.shape[1] % 8 == 0 and words.shape[1] >= kh * kw * cw
    bits = ((words.contiguous().view(torch.uint8).unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1)
    bits = bits.reshape(o, -1)
    body = bits[:, :kh * kw * cw * 32].reshape(o, kh, kw, cw * 32)
    signs = rb.unpack_signs(w, k, torch.float32).reshape(o, c, kh, kw)
    assert torch.equal(body[..., :c].permute(0, 3, 1, 2).float() * 2 - 1, signs)
    assert int(body[..., c:].sum()) == 0 and int(bits[:, kh * kw * cw * 32:].sum()) == 0
    assert torch.equal(popc, (signs > 0).sum((1, 2, 3)).int())
    assert torch.equal(taps, (signs > 0).sum(1).reshape(o, kh * kw).int())


@needs_cuda
@pytest.mark.parametrize("case", CONV, ids=[str(i) for i in range(len(CONV))])
def test_binary_conv2d_direct(case):
    from bie_backend_cuda import binary as cb
    rb, _ = _ref()
    n, c, h, w_, o, ks, st, pd, dl = case
    gen = torch.Generator().manual_seed(sum(case[:5]))
    k = c * ks[0] * ks[1]
    wb = _bits((o, (k + 7) // 8), k, gen)
    p = cb.prepare_conv(wb)
    geo = (list(ks), list(st), list(pd), list(dl), 1)
    for i, pad_value in enumerate((-1.0, 0.0, 1.0)):
        if pad_value == 0.0 and ks[0] * ks[1] > 32:
            with pytest.raises(RuntimeError, match="at most 32 taps"):
                cb.binary_conv2d(torch.randn(n, c, h, w_, device="cuda"), wb, *geo, 0.0, None, None, None)
            continue
        for j, dt in enumerate((torch.float32, torch.float16, torch.bfloat16, torch.int8)):
            if dt is torch.int8:
                x = torch.randint(-3, 4, (n, c, h, w_), generator=gen, dtype=torch.int8).cuda()
            else:
                x = torch.randn((n, c, h, w_), generator=gen).to("cuda", dt)
                x[torch.rand(x.shape, generator=gen).cuda() < 0.05] = 0
            if (i + j) % 3 == 1:
                x = x.contiguous(memory_format=torch.channels_last)
            elif (i + j) % 3 == 2:   # a strided view (every other column of a wider tensor)
                x = torch.cat([x, x], 3)[:, :, :, ::2]
            ref = rb.binary_conv2d(x.cpu(), wb.cpu(), *geo, pad_value, None, None, None)
            for tile in (1, 2, 3, 4, 5 + (i + j) % 4):   # 5-8: windows read from global memory
                got = cb.binary_conv2d(x, wb, *geo, pad_value, None, None, None, prepared=p, tile=tile)
                # (the op's format: channels_last for a channels_last x, as the reference's)
                assert got.is_contiguous(memory_format=conv_memory_format(x)) and torch.equal(got.cpu(), ref), \
                    f"count pad={pad_value} {dt} tile={tile}"
        for odt in (torch.float32, torch.float16, torch.bfloat16):
            x = torch.randn((n, c, h, w_), generator=gen).to("cuda", odt)
            scale = (torch.rand((o,) if i != 1 else (), generator=gen) + 0.05).cuda()
            bias = torch.randn(o, generator=gen).to("cuda", odt) if i != 2 else None
            got = cb.binary_conv2d(x, wb, *geo, pad_value, scale, bias, odt, prepared=p)
            ref = rb.binary_conv2d(x.cpu(), wb.cpu(), *geo, pad_value, scale.cpu(), _cpu(bias), odt)
            assert got.dtype == odt and torch.equal(got.cpu(), ref), f"{odt} pad={pad_value}"


@needs_cuda
def test_binary_conv2d_direct_dispatch_graphs_and_refusals():
    """ResNet-18 shapes through the dispatcher on bie-backend-cuda (its direct conv chosen; with bie-backend-cutlass
    installed the 1-bit wgmma conv takes the 256-channel layer automatically), replayed from a CUDA graph; grouped
    convs are refused by capability; bad native arguments raise."""
    import bie_core
    from bie_core import ops
    from bie_backend_cuda import _build
    rb, _ = _ref()
    gen = torch.Generator().manual_seed(12)
    for (c, hw, st) in ((256, 14, 1), (64, 56, 2)):
        x = torch.randn((8, c, hw, hw), generator=gen).to("cuda", torch.bfloat16).contiguous(
            memory_format=torch.channels_last)
        wb = _bits((2 * c, c * 9 // 8), c * 9, gen)
        scale = torch.rand(2 * c, generator=gen).cuda()
        args = (x, wb, [3, 3], [st, st], [1, 1], [1, 1], 1, -1.0, scale, None, torch.bfloat16)
        with bie_core.use_backend("cuda"):
            assert bie_core.explain(ops.binary_conv2d, *args).chosen()["binary_conv2d"] == "cuda:binary_conv2d_direct"
        ref = rb.binary_conv2d(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in args))
        y = ops.binary_conv2d(*args, backend="cuda")
        assert torch.equal(y.cpu(), ref)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            ops.binary_conv2d(*args, backend="cuda")
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            yg = ops.binary_conv2d(*args, backend="cuda")
        x.copy_(torch.randn(x.shape, generator=gen).to("cuda", torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        ref2 = rb.binary_conv2d(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in args))
        assert torch.equal(yg.cpu(), ref2) and not torch.equal(ref, ref2)
    x = torch.randn((2, 8, 6, 6), device="cuda")
    wb = _bits((4, (4 * 9 + 7) // 8), 4 * 9, gen)
    e = bie_core.explain(ops.binary_conv2d, x, wb, [3, 3], [1, 1], [1, 1], [1, 1], 2, -1.0, None, None, None)
    assert "groups=2" in str(e)
    ops_ = _build.ops()
    w_ok = torch.zeros((4, 24), dtype=torch.int32, device="cuda")
    pc, taps = torch.zeros(4, dtype=torch.int32, device="cuda"), torch.zeros((4, 9), dtype=torch.int32, device="cuda")
    geom = [3, 3, 1, 1, 1, 1, 1, 1]
    xs = torch.randn((2, 64, 6, 6), device="cuda")
    assert ops_.binary_conv2d(xs, w_ok, pc, taps, geom, 0, None, None, None, 0).shape == (2, 4, 6, 6)
    with pytest.raises(RuntimeError, match="wp must be contiguous int32"):
        ops_.binary_conv2d(xs, w_ok[:, :16], pc, taps, geom, 0, None, None, None, 0)
    with pytest.raises(RuntimeError, match="wtap"):
        ops_.binary_conv2d(xs, w_ok, pc, taps[:, :4], geom, 0, None, None, None, 0)
    with pytest.raises(RuntimeError, match="too small"):
        ops_.binary_conv2d(torch.randn((1, 64, 1, 1), device="cuda"), w_ok, pc, taps, [3, 3, 1, 1, 0, 0, 1, 1], 0,
                           None, None, None, 0)
    with pytest.raises(RuntimeError, match="x must be"):
        ops_.binary_conv2d(xs.double(), w_ok, pc, taps, geom, 0, None, None, None, 0)
    with pytest.raises(RuntimeError, match="tile must be"):
        ops_.binary_conv2d(xs, w_ok, pc, taps, geom, 0, None, None, None, 9)


# ------------------------------------------------------- native bad input
@needs_cuda
def test_native_bad_input_raises_not_crashes():
    """A failed check inside a native op (messages with numbers in them) is a Python RuntimeError."""
    from _native_errors import child_errors
    from bie_backend_cuda import _build
    _build.load()   # built here, so the child only loads it
    setup = ("import torch\nfrom bie_backend_cuda import _build\nops = _build.ops()\n"
             "x = torch.randn(2, 100, device='cuda', dtype=torch.bfloat16)\n"
             "i32 = lambda *s: torch.zeros(*s, dtype=torch.int32, device='cuda')")
    lines = child_errors(setup, {
        "pack_signs 1-D": "ops.pack_signs(torch.randn(3, device='cuda'))",
        "unpack_signs wrong k": "ops.unpack_signs(torch.zeros(2, 3, dtype=torch.uint8, device='cuda'), 100, "
                                "torch.float32)",
        "wq_skinny_gemm wrong qweight size": "ops.wq_skinny_gemm(x, i32(5), i32(1, 128), None, 4, 100, 100, 7, 2, True, False, "
                                       "True, torch.bfloat16, i32(8), 0, False)",
    })
    assert len(lines) == 3 and all("-> RuntimeError:" in ln for ln in lines), lines
    assert "got [3]" in lines[0], lines[0]


@needs_cuda
def test_split_k_semaphores_per_stream():
    """The split-K semaphores are kept per (device, stream): the same zeroed tensor on a stream's every call, another
    on a side stream (two streams' launches must not share them)."""
    from bie_backend_cuda.weight_only import _counters_for
    dev = torch.device("cuda", torch.cuda.current_device())
    a = _counters_for(dev, 8)
    assert _counters_for(dev, 8) is a
    assert _counters_for(torch.device("cuda"), 8) is a          # an index-less device: the current one
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        b = _counters_for(dev, 8)
        assert _counters_for(dev, 8) is b
    assert b is not a and _counters_for(dev, 8) is a
    assert int(a.count_nonzero()) == 0 and int(b.count_nonzero()) == 0
    assert _counters_for(dev, 8192).numel() >= 8192            # grown on demand


@needs_cuda
def test_split_k_semaphores_are_kept_per_graph_capture():
    """Eager calls keep one set of split-K semaphores per stream; each CUDA-graph capture gets its own (a spare made
    before it, or without one a set per launch in the graph's pool, zeroed at each replay), although
    torch.cuda.graph captures every graph on one shared stream."""
    from bie_backend_cuda import weight_only as cw
    dev = torch.device("cuda")
    eager = cw._counters_for(dev, 8)   # an eager call also makes the spares ready
    assert cw._counters_for(dev, 8) is eager
    sets = []
    for _ in range(cw._SPARES):
        _, (a, b) = _captured(lambda: (cw._counters_for(dev, 8), cw._counters_for(dev, 8)))
        assert a is b, "two launches of one capture got different sets"
        sets.append(a)
    seen = {eager.data_ptr()} | {t.data_ptr() for t in sets}
    assert len(seen) == 1 + cw._SPARES, "captures share a set of semaphores"
    graph, (a, b) = _captured(lambda: (cw._counters_for(dev, 8), cw._counters_for(dev, 8)))   # no spare left
    assert a.data_ptr() != b.data_ptr() and not {a.data_ptr(), b.data_ptr()} & seen
    a.fill_(7)
    graph.replay()
    torch.cuda.synchronize()
    assert int(a.abs().sum()) == 0 and int(b.abs().sum()) == 0, "the graph does not zero its own sets"
    assert cw._counters_for(dev, 8) is eager and len(cw._spare_counters[torch.cuda.current_device()]) == cw._SPARES

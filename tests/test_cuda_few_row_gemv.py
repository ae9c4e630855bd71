"""bie-backend-cuda's one-launch kernels for few rows, against the plain-PyTorch reference bit for bit:

* ``int_gemm_gemv`` (csrc/dynamic_gemv.cu modes 1 and 2, 1-32 rows): int_gemm on given codes, and the bound call's
  fused activation quantization (``fuse_quantized_input``: quantize_int inside the GEMV) on values at rounding ties,
  huge, infinite and NaN values, and scales that are not normal floats; from 9 rows with and without the clusters
  that share the codes of x on sm_90 (each cluster size forced, and none);
* ``binary_linear_gemv`` (csrc/binary.cu): the signs of x + shift taken inside the GEMV, with x at the shift, K not a
  multiple of 8 or 32 and views of x;
* the fused form of ``binary_linear_tc``'s bound call (the tensor-core GEMM taking the signs itself, 1-32 rows);
* the layers' eager inference (QLinear, BinaryLinear) choosing them at few rows and computing what the full path
  computes.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("bie_backend_cuda") is None,
                                 reason="bie-backend-cuda is not installed"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _codes(shape, bits, g):
    lo, hi = (-8, 7) if bits == 4 else (-128, 127)
    return torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int8)


def _ref_gemm(a, b, scale, bias, out_dtype):
    from bie_backend_cpu.reference.integer import int_gemm
    return int_gemm(a.cpu(), b.cpu(), 8, 8, None if scale is None else scale.cpu(),
                    None if bias is None else bias.cpu(), out_dtype)


def _ref_quant(x, scale, bits, shift):
    from bie_backend_cpu.reference.integer import quantize_int
    return quantize_int(x.cpu(), scale.cpu(), bits, None if shift is None else shift.cpu())


def _fits(m, k):
    """whether m rows of k features fit the GEMV's shared memory on this device (K near 7168 at 32 rows needs an
    sm_90's 227 KiB)"""
    from bie_backend_cuda import dynamic
    need = dynamic.gemv_smem_bytes(m, k)
    have = torch.cuda.get_device_properties(torch.cuda.current_device()).shared_memory_per_block_optin
    return need <= have


def _sm90():
    return torch.cuda.get_device_capability()[0] == 9


def _same(got, want):
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    if not want.is_floating_point():
        assert torch.equal(got, want), f"{(got != want).sum().item()} of {want.numel()} sums differ"
        return
    assert torch.equal(got.float().nan_to_num(12345.0), want.float().nan_to_num(12345.0)), \
        f"max diff {(got.float() - want.float()).abs().nan_to_num(0).max().item()}"


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (1, 64, 64), (3, 33, 130), (8, 200, 1000), (5, 17, 4097),
                                     (2, 4096, 4096), (8, 96, 8191),
                                     # 9-32 rows: 2, 3 and 4 tiles of 8 rows (their padding rows), odd K and N, the
                                     # clusters' padding blocks (N of one channel block), K near the shared memory's
                                     # end at 32 rows
                                     (9, 7, 33), (12, 40, 257), (16, 4096, 4096), (17, 33, 1000), (24, 100, 129),
                                     (31, 16, 4097), (32, 4096, 4096), (32, 96, 7001)])
@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.float16, torch.bfloat16])
def test_int_gemm_gemv_on_codes(m, n, k, out_dtype):
    from bie_backend_cuda import integer as ci
    if not _fits(m, k):
        pytest.skip(f"{m} rows of K={k} do not fit this device's shared memory")
    g = torch.Generator().manual_seed(m * 7 + n + k)
    a_bits = 4 if k % 2 else 8
    a, b = _codes((m, k), a_bits, g), _codes((n, k), 8, g)
    scale = bias = None
    if out_dtype is not None:
        scale = torch.rand((n,) if n % 2 else (), generator=g) * 0.01 + 1e-4
        bias = torch.randn(n, generator=g)
    want = _ref_gemm(a, b, scale, bias, out_dtype)
    dev = lambda t: None if t is None else t.cuda()   # noqa: E731
    prepared = ci.prepare_gemv(b.cuda())
    got = ci.int_gemm_gemv(a.cuda(), b.cuda(), a_bits, 8, dev(scale), dev(bias), out_dtype, prepared=prepared)
    _same(got, want)
    call = ci.bind_int_gemm_gemv(a.cuda(), b.cuda(), a_bits, 8, dev(scale), dev(bias), out_dtype, prepared=prepared)
    for _ in range(2):   # the first call and a programmatic dependent one
        _same(call(a.cuda(), b.cuda(), a_bits, 8, dev(scale), dev(bias), out_dtype), want)


@pytest.mark.parametrize("m", [4, 20])
def test_int_gemm_gemv_on_views_of_codes(m):
    """rows of a with a stride, and a start that is not 8-byte aligned: the byte-wise loads"""
    from bie_backend_cuda import integer as ci
    g = torch.Generator().manual_seed(3 + m)
    base, b = _codes((m, 301), 8, g), _codes((40, 256), 8, g)
    for a in (base[:, 1:257], base[:, 3:259], base[:, :256], base[:, 5:261]):
        want = _ref_gemm(a.contiguous(), b, None, None, None)
        _same(ci.int_gemm_gemv(a.cuda(), b.cuda(), 8, 8, None, None, None, prepared=ci.prepare_gemv(b.cuda())), want)


def _clusters():
    """the cluster sizes int_gemv takes on this device: 0 (the launcher's choice), 1 (none: every block makes all the
    codes of x, the form other GPUs run) and on sm_90 each forced size"""
    return (0, 1, 2, 4, 8) if _sm90() else (0, 1)


@pytest.mark.parametrize("m, n, k", [(3, 40, 100), (9, 16, 33), (16, 33, 1000), (21, 257, 999), (32, 4100, 4096),
                                     (32, 48, 64)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_int_gemv_cluster_forms_agree(m, n, k, dtype):
    """every cluster size (each block makes 1/cluster of the codes of x and stores them into all of the cluster's
    blocks) and none compute the reference's codes and sums, on given codes (mode 2) and on floats quantized with a
    shift (mode 1), with N smaller than a cluster's blocks (the padding blocks only make codes) and larger than the
    grid. Consecutive launches never see the same codes of x (a, x's codes, a again, x's, then a2): a block that
    read codes a form failed to store would find the previous launch's in its shared memory, and match."""
    import bie_backend_cuda._build as bb
    from bie_backend_cuda import integer as ci
    if not _fits(m, k):
        pytest.skip(f"{m} rows of K={k} do not fit this device's shared memory")
    g = torch.Generator().manual_seed(m * 131 + n + k)
    fn = bb.direct().int_gemv
    b = _codes((n, k), 8, g)
    wf = ci.prepare_gemv(b.cuda())
    a, a2 = _codes((m, k), 8, g), _codes((m, k), 8, g)
    s = torch.tensor(0.0371, dtype=torch.float32)
    x = _edge_x(m, k, dtype, float(s), g)
    shift = (torch.randn(k, generator=g) * 0.3 * float(s)).to(dtype)
    scale = torch.rand(n, generator=g) * 0.01 + 1e-4
    bias = torch.randn(n, generator=g)
    want_codes, want_codes2 = _ref_gemm(a, b, None, None, None), _ref_gemm(a2, b, None, None, None)
    want_fused = _ref_gemm(_ref_quant(x, s, 8, shift), b, scale, bias, dtype)
    for cluster in _clusters():
        for pdl in (False, True):
            _same(fn(a.cuda(), None, None, 8, wf, None, None, n, k, None, pdl, 1, cluster), want_codes)
            _same(fn(x.cuda(), s.cuda(), shift.cuda(), 8, wf, scale.cuda(), bias.cuda(), n, k, dtype, pdl, 1, cluster),
                  want_fused)
        # the register ring (ring 0) as well
        _same(fn(a2.cuda(), None, None, 8, wf, None, None, n, k, None, False, 0, cluster), want_codes2)


def _fused(x, act_scale, bits, shift, b, scale, bias, out_dtype):
    from bie_backend_cuda import integer as ci
    m, k = x.shape
    qa = torch.zeros((m, k), dtype=torch.int8, device="cuda")
    gemm = ci.bind_int_gemm_gemv(qa, b, bits, 8, scale, bias, out_dtype, prepared=ci.prepare_gemv(b))
    quant = ci.bind_quantize_int(x, act_scale, bits, shift)
    fused = gemm.fuse_quantized_input(quant, act_scale, bits, shift, scale, bias)
    assert fused is not None
    return fused


def _edge_x(m, k, dtype, s, g):
    """values on rounding ties of v / s, next to them, beyond the code range, and non-finite ones"""
    x = torch.randn(m, k, generator=g) * 40 * s
    n = torch.randint(-140, 140, (m, k), generator=g).float()
    ties = (n + 0.5) * s
    pick = torch.rand(m, k, generator=g)
    x = torch.where(pick < 0.3, ties, x)
    x = x.to(dtype).float()
    # the neighbours of ties in x's own dtype
    x = torch.where((pick > 0.3) & (pick < 0.4), torch.nextafter(ties.to(dtype).float(), torch.tensor(1e30)), x)
    flat = x.view(-1)
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e30, -1e30, 127.5 * s,
                             -128.5 * s, 7.5 * s, -8.5 * s])
    idx = torch.randperm(flat.numel(), generator=g)[:specials.numel()]
    flat[idx] = specials[:idx.numel()]
    return x.to(dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("shifted", [False, True])
@pytest.mark.parametrize("m, n, k", [(1, 64, 64), (3, 40, 130), (8, 257, 1000), (1, 4096, 4096), (6, 24, 33),
                                     (9, 33, 257), (12, 100, 1000), (16, 4096, 4096), (17, 24, 33), (24, 257, 130),
                                     (32, 1000, 4097), (32, 4096, 4096)])
def test_fused_quantization_is_quantize_int_then_int_gemm(dtype, bits, shifted, m, n, k):
    if not _fits(m, k):
        pytest.skip(f"{m} rows of K={k} do not fit this device's shared memory")
    g = torch.Generator().manual_seed(bits * 1000 + m + n + k)
    s = torch.tensor(0.0371, dtype=torch.float32)
    x = _edge_x(m, k, dtype, float(s), g)
    shift = (torch.randn(k, generator=g) * 0.3 * float(s)).to(dtype) if shifted else None
    b = _codes((n, k), 8, g)
    scale = torch.rand(n, generator=g) * 0.01 + 1e-4
    bias = torch.randn(n, generator=g)
    codes = _ref_quant(x, s, bits, shift)
    want = _ref_gemm(codes, b, scale, bias, dtype)
    fused = _fused(x.cuda(), s.cuda(), bits, None if shift is None else shift.cuda(), b.cuda(), scale.cuda(),
                   bias.cuda(), dtype)
    for _ in range(2):
        _same(fused(x.cuda()), want)
    x2 = _edge_x(m, k, dtype, float(s), g)   # a fresh input through the same bound call
    _same(fused(x2.cuda()), _ref_gemm(_ref_quant(x2, s, bits, shift), b, scale, bias, dtype))


@pytest.mark.parametrize("s", [1e-42, 0.0, -0.25, float("inf"), float("nan"), 3e38, 1.1754944e-38])
@pytest.mark.parametrize("m", [4, 20])
def test_fused_quantization_with_scales_that_are_not_normal(s, m):
    """the reciprocal path serves normal finite scales only; every other scale takes the true division"""
    g = torch.Generator().manual_seed(11)
    n, k = 48, 96
    st = torch.tensor(s, dtype=torch.float32)
    x = torch.randn(m, k, generator=g) * 3
    x.view(-1)[:6] = torch.tensor([0.0, 1e-42, -1e-42, float("inf"), float("nan"), 1e38])
    b = _codes((n, k), 8, g)
    want = _ref_gemm(_ref_quant(x, st, 8, None), b, None, None, None)
    _same(_fused(x.cuda(), st.cuda(), 8, None, b.cuda(), None, None, None)(x.cuda()), want)


def test_fused_quantization_refuses_other_calls():
    from bie_backend_cuda import integer as ci
    b = torch.zeros(16, 64, dtype=torch.int8, device="cuda")
    qa = torch.zeros(2, 64, dtype=torch.int8, device="cuda")
    gemm = ci.bind_int_gemm_gemv(qa, b, 8, 8, None, None, None, prepared=ci.prepare_gemv(b))
    x = torch.randn(2, 64, device="cuda")
    s = torch.tensor(0.1, device="cuda")
    assert gemm.fuse_quantized_input(lambda *a: None, s, 8, None, None, None) is None      # not this backend's
    other = ci.bind_quantize_int(torch.randn(3, 64, device="cuda"), s, 8)
    assert gemm.fuse_quantized_input(other, s, 8, None, None, None) is None               # another shape
    own = ci.bind_quantize_int(x, s, 8)
    assert gemm.fuse_quantized_input(own, torch.rand(2, device="cuda"), 8, None, None, None) is None
    assert gemm.fuse_quantized_input(own, s, 8, torch.zeros(63, device="cuda"), None, None) is None
    assert gemm.fuse_quantized_input(own, s, 8, None, None, None) is not None


def test_int_gemv_rejects_bad_arguments():
    import bie_backend_cuda._build as b
    from bie_backend_cuda import integer as ci
    w = torch.zeros(16, 64, dtype=torch.int8, device="cuda")
    wf = ci.prepare_gemv(w)
    fn = b.direct().int_gemv
    codes = torch.zeros(2, 64, dtype=torch.int8, device="cuda")
    with pytest.raises(RuntimeError, match="1 to 32 rows"):
        fn(torch.zeros(33, 64, dtype=torch.int8, device="cuda"), None, None, 8, wf, None, None, 16, 64, None, False, 1,
           0)
    with pytest.raises(RuntimeError, match="act_scale"):
        fn(torch.zeros(2, 64, device="cuda"), None, None, 8, wf, None, None, 16, 64, torch.float32, False, 1, 0)
    with pytest.raises(RuntimeError, match="fragment-ordered"):
        fn(codes, None, None, 8, wf[:-1], None, None, 16, 64, None, False, 1, 0)
    with pytest.raises(RuntimeError, match="cluster must be"):
        fn(codes, None, None, 8, wf, None, None, 16, 64, None, False, 1, 3)
    if not _sm90():
        with pytest.raises(RuntimeError, match="need an sm_90 GPU"):
            fn(codes, None, None, 8, wf, None, None, 16, 64, None, False, 1, 2)
    # 32 rows of a K whose codes cannot fit any device's shared memory: refused before the launch
    with pytest.raises(RuntimeError, match="shared memory"):
        fn(torch.zeros(32, 16384, dtype=torch.int8, device="cuda"), None, None, 8,
           ci.prepare_gemv(torch.zeros(16, 16384, dtype=torch.int8, device="cuda")), None, None, 16, 16384, None,
           False, 1, 0)


# ------------------------------------------------------------------ binary_linear_gemv
def _ref_binary_linear(x, shift, w, k, sa, sw, bias, out_dtype):
    from bie_backend_cpu.reference.binary import binary_linear
    c = lambda t: None if t is None else t.cpu()   # noqa: E731
    return binary_linear(x.cpu(), c(shift), w.cpu(), k, c(sa), c(sw), c(bias), out_dtype)


def _binary_case(m, n, k, dtype, epilogue, g):
    """(x, shift, w, sa, sw, bias, out_dtype) of a binary_linear call: x near -shift, so that the rounding of
    x + shift decides bits, with a zero, a NaN and a negative zero; the weight's bits past k in its last byte set (the
    op's contract lets them be set, they must not count); epilogue "count" (the int32 dot) or "scale"."""
    from bie_backend_cpu.reference.binary import pack_signs
    shift = (torch.randn(k, generator=g) * 0.3).to(dtype)
    x = (torch.randn(m, k, generator=g) * 1e-3).to(dtype) - shift
    x.view(-1)[:3] = torch.tensor([0.0, float("nan"), -0.0]).to(dtype)[:x.numel()]
    w = pack_signs(torch.randn(n, k, generator=g))
    if k % 8:
        w[:, -1] |= (0xFF << (k % 8)) & 0xFF
    sa = sw = bias = out_dtype = None
    if epilogue == "scale":
        sa, sw = torch.rand((), generator=g) + 0.5, torch.rand(n, generator=g) + 0.1
        bias, out_dtype = torch.randn(n, generator=g), dtype
    return x, shift, w, sa, sw, bias, out_dtype


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (1, 64, 64), (3, 24, 100), (8, 200, 1000), (2, 4096, 4096),
                                     (5, 33, 4099), (8, 16, 40960),
                                     # 9-16 and 17-32 rows: the 16- and 32-row accumulators, their shuffle
                                     # reduction by halves, and past 48 KiB of signs the shared-memory opt-in
                                     (9, 7, 257), (16, 130, 1000), (13, 4096, 4096), (17, 64, 999), (24, 33, 12288),
                                     (32, 4099, 4096), (32, 40, 25216), (19, 8, 40960)])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("epilogue", ["count", "scale"])
def test_binary_linear_gemv_matches_the_reference(m, n, k, dtype, epilogue):
    from bie_backend_cuda import binary as cb
    g = torch.Generator().manual_seed(m + n * 3 + k)
    x, shift, w, sa, sw, bias, out_dtype = _binary_case(m, n, k, dtype, epilogue, g)
    want = _ref_binary_linear(x, shift, w, k, sa, sw, bias, out_dtype)
    c = lambda t: None if t is None else t.cuda()   # noqa: E731
    prepared = cb.prepare_weight(w.cuda(), k)
    args = (x.cuda(), shift.cuda(), w.cuda(), k, c(sa), c(sw), c(bias), out_dtype)
    _same(cb.binary_linear_gemv(*args, prepared=prepared), want)
    call = cb.bind_binary_linear_gemv(*args, prepared=prepared)
    _same(call(x.cuda()), want)
    x2 = torch.randn(m, k + 3, generator=g).to(dtype)[:, 3:]   # a view: the kernel's copy is contiguous
    _same(cb.binary_linear_gemv(x2.cuda(), *args[1:], prepared=prepared),
          _ref_binary_linear(x2.contiguous(), shift, w, k, sa, sw, bias, out_dtype))


def test_binary_linear_gemv_rejects_bad_arguments():
    import bie_backend_cuda._build as b
    from bie_backend_cuda import binary as cb
    w = torch.zeros(16, 8, dtype=torch.uint8, device="cuda")
    p = cb.prepare_weight(w, 64)
    fn = b.direct().binary_linear_gemv
    with pytest.raises(RuntimeError, match="1 to 32 rows"):
        fn(torch.zeros(33, 64, device="cuda"), None, cb._gemv_weight(p), p.popc, 64, 16, None, None, None)
    wl = torch.zeros(16, 25216 // 8 + 16, dtype=torch.uint8, device="cuda")   # 32 rows of K=25344: 101504 bytes
    pl = cb.prepare_weight(wl, 25344)
    with pytest.raises(RuntimeError, match="shared memory"):
        fn(torch.zeros(32, 25344, device="cuda"), None, cb._gemv_weight(pl), pl.popc, 25344, 16, None, None, None)
    with pytest.raises(RuntimeError, match="uint8 rows"):
        fn(torch.zeros(2, 64, device="cuda"), None, w, p.popc, 64, 16, None, None, None)   # rows of 8 bytes


# ------------------------------------------------------------------ binary_linear_tc's fused form
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (1, 64, 64), (3, 24, 100), (5, 33, 4099), (9, 7, 257),
                                     (16, 130, 1000), (12, 4096, 4096), (17, 64, 999), (24, 33, 12288),
                                     (32, 4099, 4096), (32, 200, 14336),
                                     # the most K whose signs fit: 41 chunks of 32 rows, 83 of 16 rows
                                     (32, 40, 20992), (16, 8, 42496)])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("epilogue", ["count", "scale"])
def test_binary_linear_tc_fused_form_matches_the_reference(m, n, k, dtype, epilogue):
    """The bound call's one-launch form of the tensor-core GEMM (the block takes the signs of x + shift into shared
    memory itself) against the reference and against the two-launch form (pack kernel, then the same GEMM) bit for
    bit, with x at the shift (the rounding of the sum decides bits), NaN and signed zeros, and set weight pad bits."""
    from bie_backend_cuda import _build
    from bie_backend_cuda import binary as cb
    from bie_core.backend_api import linear_scale
    g = torch.Generator().manual_seed(m + n * 5 + k)
    x, shift, w, sa, sw, bias, out_dtype = _binary_case(m, n, k, dtype, epilogue, g)
    want = _ref_binary_linear(x, shift, w, k, sa, sw, bias, out_dtype)
    c = lambda t: None if t is None else t.cuda()   # noqa: E731
    prepared = cb.prepare_weight(w.cuda(), k)
    scale = None if sa is None else linear_scale(c(sa), c(sw))
    fn = _build.direct().binary_linear_bound
    xc, sc = x.cuda(), shift.cuda()
    for shape in ((m, k), (1, m, k)):   # x of any rank, the output in its shape
        for tile in (6, 0, 2):          # the fused form forced, chosen, and the two launches
            got = fn(xc.view(shape), sc, prepared.bits, prepared.popc, k, n, scale, c(bias), out_dtype, tile)
            assert got.shape == shape[:-1] + (n,)
            _same(got.view(m, n), want)
    # no shift: the signs of x itself
    _same(fn(xc, None, prepared.bits, prepared.popc, k, n, scale, c(bias), out_dtype, 6),
          _ref_binary_linear(x, None, w, k, sa, sw, bias, out_dtype))


def test_binary_linear_tc_fused_form_refuses_what_does_not_fit():
    from bie_backend_cuda import _build
    from bie_backend_cuda import binary as cb
    fn = _build.direct().binary_linear_bound
    p = cb.prepare_weight(torch.zeros(16, 2640, dtype=torch.uint8, device="cuda"), 21120)
    with pytest.raises(RuntimeError, match="fused form takes 1 to 32 rows"):
        fn(torch.zeros(33, 64, device="cuda"), None, p.bits, p.popc, 64, 16, None, None, None, 6)
    with pytest.raises(RuntimeError, match="fused form takes 1 to 32 rows"):   # 42 chunks of signs: past 99 KiB
        fn(torch.zeros(32, 21120, device="cuda"), None, p.bits, p.popc, 21120, 16, None, None, None, 6)
    # chosen (tile 0), the same calls take the two launches instead
    for m, k in ((33, 64), (32, 21120)):
        x = torch.randn(m, k, device="cuda")
        assert torch.equal(fn(x, None, p.bits, p.popc, k, 16, None, None, None, 0),
                           fn(x, None, p.bits, p.popc, k, 16, None, None, None, 2))


def test_binary_linear_bound_in_a_cuda_graph_takes_the_two_launches(tmp_path):
    """While a graph is captured, the chosen form (tile 0) is the two launches, which replay faster; the replay of a
    new x equals the fused form's eager result bit for bit."""
    from bie_backend_cuda import _build
    from bie_backend_cuda import binary as cb
    fn = _build.direct().binary_linear_bound
    g = torch.Generator().manual_seed(11)
    m, n, k = 8, 96, 777
    x, shift, w, _, _, _, _ = _binary_case(m, n, k, torch.bfloat16, "count", g)
    p = cb.prepare_weight(w.cuda(), k)
    xc, sc = x.cuda(), shift.cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm up off the default stream, as graph capture asks
        fn(xc, sc, p.bits, p.popc, k, n, None, None, None, 0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph(keep_graph=True)   # kept after capture, so that it can be printed
    graph.enable_debug_mode()
    with torch.cuda.graph(graph):
        y = fn(xc, sc, p.bits, p.popc, k, n, None, None, None, 0)
    dump = tmp_path / "graph.dot"
    graph.debug_dump(str(dump))
    assert "pack_signs_shifted_kernel" in dump.read_text(), "captured the fused form, not the two launches"
    x2 = torch.randn(m, k, generator=g).bfloat16()
    xc.copy_(x2.cuda())
    graph.replay()
    torch.cuda.synchronize()
    _same(y, fn(xc, sc, p.bits, p.popc, k, n, None, None, None, 6).cpu())
    # eager, the chosen form is the fused one: same result
    _same(fn(xc, sc, p.bits, p.popc, k, n, None, None, None, 0), y.cpu())


# ------------------------------------------------------------------ the layers
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m", [1, 5, 8, 12, 16, 32])
def test_qlinear_eager_inference_is_the_fused_gemv(bits, m):
    """QLinear's eager inference at 1-16 rows is the one-launch GEMV (1-32 without the CUTLASS GEMM, which takes
    17+ rows where it is loaded), computing what the full path computes."""
    import bie_core
    from bie_core import QLinear
    torch.manual_seed(bits + m)
    layer = QLinear(512, 384, w_bits=bits, a_bits=bits, bias=True).to(device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        layer.act_shift.normal_(0, 0.2)
    layer(torch.randn(16, 512, device="cuda", dtype=torch.bfloat16))   # sets the activation scale
    layer.eval()
    x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
    with torch.enable_grad():
        full = layer(x).detach()                         # the autograd path: the ops one by one
    for _ in range(3):
        with torch.inference_mode():
            assert torch.equal(layer(x), full)
    with torch.inference_mode():
        chosen = bie_core.explain(layer, x).chosen()
    cutlass = any(r.name == "cutlass" and r.status == "loaded" for r in bie_core.backends())
    if m > 16 and cutlass:
        assert chosen["int_gemm"] == "cutlass:int_gemm_sm90", chosen
    else:
        assert chosen["int_gemm"] == "cuda:int_gemm_gemv", chosen
        assert chosen["quantize_int"] == "cuda:quantize_int"


@pytest.mark.parametrize("m", [1, 4, 8, 12, 32])
def test_binary_linear_eager_inference_is_one_launch(m):
    """BinaryLinear's eager inference at 1-32 rows: the GEMV, or on sm_90 past 4 rows the tensor-core GEMM's fused
    form (both one launch that takes the signs itself), computing what the full path computes."""
    import bie_core
    from bie_core import BinaryLinear
    torch.manual_seed(m)
    layer = BinaryLinear(1000, 96, bias=True).to(device="cuda", dtype=torch.float16).eval()
    with torch.no_grad():
        layer.act_shift.normal_(0, 0.3)
    x = torch.randn(m, 1000, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        full = layer._forward(x)
    for _ in range(3):
        with torch.inference_mode():
            assert torch.equal(layer(x), full)
    gemv = m <= 4 or torch.cuda.get_device_capability()[0] != 9
    with torch.inference_mode():
        assert bie_core.explain(layer, x).chosen()["binary_linear"] == \
            ("cuda:binary_linear_gemv" if gemv else "cuda:binary_linear_tc")


def test_binary_linear_gemv_leaves_big_products_to_the_gemm():
    """Past GEMV_MAX_WORK (M * N * K; on sm_90 past 4 rows, 4096 outputs or GEMV_MAX_WORK_SM90) automatic selection
    takes the tensor-core GEMM (faster in GPU time there); the GEMV still serves one row of the same layer, and runs
    where it is asked for by name."""
    import bie_core
    from bie_backend_cuda import binary as cb
    from bie_core import BinaryLinear
    layer = BinaryLinear(14336, 4096).to(device="cuda", dtype=torch.float16).eval()
    x8, x1 = (torch.randn(m, 14336, device="cuda", dtype=torch.float16) for m in (8, 1))
    limit = cb.GEMV_MAX_WORK_SM90 if torch.cuda.get_device_capability()[0] == 9 else cb.GEMV_MAX_WORK
    assert 8 * 14336 * 4096 > limit >= 14336 * 4096
    with torch.inference_mode():
        assert bie_core.explain(layer, x8).chosen()["binary_linear"] != "cuda:binary_linear_gemv"
        assert bie_core.explain(layer, x1).chosen()["binary_linear"] == "cuda:binary_linear_gemv"
        want = layer(x8)
        layer.backend = "cuda:binary_linear_gemv"
        assert torch.equal(layer(x8), want)

"""Automatic selection among the weight-only GEMM kernels of bie-backend-cuda and bie-backend-cutlass, each
registered on its own, picks the kernel the measured ranges say (no GPU needed: Problems are built by hand).

The oracle is the decision function that chose among the same kernels inside one registered ``wq_gemm`` before
they were registered one by one, with the measured thresholds it used; the registrations (capabilities, ``defer``
and priorities, bie_core/preferences.py for the cross-backend rows) must reproduce it for every
(M, N, K, bits, group size, format, dtypes, architecture) below. The rows of bie-backend-cuda's one-launch binary
GEMV are checked the same way, against their rule.
"""
from __future__ import annotations

import importlib.util
import itertools

import pytest
import torch

from bie_core import dispatch
from bie_core.backend_api import get_op
from bie_core.kernels import Problem
from bie_core.plugins.registry import KernelRegistrar, get_registry

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("bie_backend_cuda") is None,
                                 reason="bie-backend-cuda is not installed"),
              # (the cutlass kernel refusing a call is a fallback to another backend: it warns, as it should)
              pytest.mark.filterwarnings("ignore::bie_core.BieFallbackWarning")]

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


# ------------------------------------------------------------------ the oracle
def oracle_cuda(m, n, k, bits, gs, fmt, sdt, zdt, cc):
    """The kernel the single cuda ``wq_gemm`` ran, as its Python branches chose it."""
    kbits = {1: 2, 2: 2, 3: 4, 4: 4, 8: 8}[bits]
    gs_shift = -1 if gs == -1 else gs.bit_length() - 1
    skinny_ok = sdt in (F16, BF16) and (fmt == "gptq" or zdt == sdt)

    def thin_rows():
        if kbits in (2, 4) and 3 <= m <= 16:
            return True
        if n * k <= 1 << 26:
            return m <= 4
        stages = -(-k // 128)
        fits = m * (stages * 256 + 16) + stages * 4 * ((m + 1) // 2) * 8 <= 128 * 1024
        return m <= 4 and (m == 1 or (fits and k <= 16384))

    thin_ok = kbits in (2, 4, 8) and k % 8 == 0 and (gs == -1 or gs >= 32) and skinny_ok and cc[0] >= 8
    if thin_rows() and thin_ok:
        return "cuda:wq_gemm_thin"
    # the many-row kernel from 129 rows, but not on narrow layers (N <= 1024, K <= 8192) up to 256 rows
    wqm = kbits == 4 and (gs_shift == -1 or gs_shift >= 5) and 129 <= m <= 4096 and not (
        n <= 1024 and k <= 8192 and m <= 256)
    wqw = m <= 256 and not (bits == 8 and m < 17) and (m >= 9 or (m >= 5 and n * k <= 1 << 26))
    if (wqm or wqw) and k % 8 == 0 and skinny_ok and cc[0] == 9:
        return "cuda:wq_gemm_wgmma_rows" if wqm else "cuda:wq_gemm_wgmma"
    if m > 64 and bits in (1, 2, 4, 8):
        return "cuda:wq_gemm_dense"
    if m <= 8 and skinny_ok:
        return "cuda:wq_gemm_skinny"
    if m > 64:
        return "cuda:wq_gemm_dense"
    return "cuda:wq_gemm_mma"


def oracle_cutlass_takes(m, n, k, bits, gs, dtype, cc):
    """Whether the cutlass GEMM (priority above cuda's) ran: its capability, then its deferral to cuda's kernels."""
    if dtype not in (F16, BF16) or bits not in (4, 8) or k % 64 or n % 16 or cc != (9, 0):
        return False
    if (gs != -1 and gs % 64) or n * k >= 2 ** 31:
        return False
    big = 5
    if bits == 4:
        big = max(big, 17 if k > 16384 else 9)
    lo = 65 if n * k <= 1 << 26 else min(65, big)
    if m < lo:
        return False
    if bits == 4 and n <= 1024 and k <= 8192 and 65 <= m <= 256:   # narrow layers: cuda's wgmma kernel
        return False
    return not (bits == 4 and k >= 14336 and 129 <= m <= 256)


# ------------------------------------------------------------------ the registrations
class _On(Problem):
    """A Problem on a CUDA device of a given compute capability (no GPU needed)."""

    cc: tuple = (9, 0)

    @property
    def compute_capability(self):
        return self.cc


def _problem(m, n, k, bits, gs, fmt, dtype, sdt, zdt, cc):
    p = _On(op="wq_gemm", device_type="cuda", device_index=0, dtype=dtype, dims={"M": m, "N": n, "K": k},
            attrs={"bits": bits, "group_size": gs, "act_order": False, "format": fmt, "bias": False,
                   "scale_dtype": sdt, "zero_dtype": zdt})
    object.__setattr__(p, "cc", cc)
    return p


def _kernels(with_cutlass: bool):
    from bie_backend_cuda import plugin as cuda_plugin
    reg = KernelRegistrar(get_registry(), "cuda")
    cuda_plugin.bie_register_kernels(registry=reg)
    kernels = [k for k in reg.kernels if k.op == "wq_gemm"]
    if with_cutlass:
        from bie_backend_cutlass import weight_only as cutlass_wo
        creg = KernelRegistrar(get_registry(), "cutlass")
        cutlass_wo.register(creg, 200)
        kernels += [k for k in creg.kernels if k.op == "wq_gemm"]
    return sorted(kernels, key=lambda k: -k.priority)


def _chosen(kernels, p) -> str:
    return dispatch._decide_auto(get_op(p.op), p, kernels).kernel.qualname


M_VALUES = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 24, 32, 33, 64, 65, 100, 128, 129, 200, 256, 257, 512, 767, 768,
            1024, 4096, 4097)
LAYERS = ((4096, 4096), (28672, 8192), (8192, 28672), (1024, 65536), (8192, 65536), (256, 520), (48, 100),
          (1024, 4096), (1024, 8192), (1024, 8256), (1088, 4096), (4096, 14336), (4096, 14272))
STATS = (("gptq", F16, torch.int32), ("gptq", BF16, torch.int32), ("gptq", F32, torch.int32),
         ("gba", F16, F16), ("gba", BF16, F32))


@pytest.mark.parametrize("cc", [(8, 0), (8, 9), (9, 0)])
def test_cuda_kernels_reproduce_the_measured_choice(cc):
    kernels = _kernels(with_cutlass=False)
    assert [k.name for k in kernels] == ["wq_gemm_thin", "wq_gemm_wgmma_rows", "wq_gemm_wgmma", "wq_gemm_dense",
                                         "wq_gemm_skinny", "wq_gemm_mma"]
    seen, wrong = set(), []
    for m, (n, k), bits, gs, (fmt, sdt, zdt) in itertools.product(M_VALUES, LAYERS, (1, 2, 3, 4, 8),
                                                                 (-1, 16, 32, 128), STATS):
        dtype = sdt if sdt is not F32 else F16
        p = _problem(m, n, k, bits, gs, fmt, dtype, sdt, zdt, cc)
        want, got = oracle_cuda(m, n, k, bits, gs, fmt, sdt, zdt, cc), _chosen(kernels, p)
        seen.add(want)
        if got != want:
            wrong.append(f"{p.describe()} sm_{cc[0]}{cc[1]}: {got}, expected {want}")
    assert not wrong, f"{len(wrong)} choices differ, e.g.\n" + "\n".join(wrong[:10])
    assert len(seen) >= (6 if cc == (9, 0) else 4), seen


@pytest.mark.skipif(importlib.util.find_spec("bie_backend_cutlass") is None,
                    reason="bie-backend-cutlass is not installed")
def test_cutlass_and_cuda_kernels_reproduce_the_measured_choice():
    kernels = _kernels(with_cutlass=True)
    cc = (9, 0)
    wrong, took = [], 0
    for m, (n, k), bits, gs, (fmt, sdt, zdt), dtype in itertools.product(
            M_VALUES, LAYERS, (4, 8, 3), (-1, 32, 128), STATS[:2] + STATS[3:4], (F16, BF16, F32)):
        p = _problem(m, n, k, bits, gs, fmt, dtype, sdt, zdt, cc)
        want = ("cutlass:wq_gemm_sm90" if oracle_cutlass_takes(m, n, k, bits, gs, dtype, cc)
                else oracle_cuda(m, n, k, bits, gs, fmt, sdt, zdt, cc))
        took += want.startswith("cutlass")
        got = _chosen(kernels, p)
        if got != want:
            wrong.append(f"{p.describe()}: {got}, expected {want}")
    assert not wrong, f"{len(wrong)} choices differ, e.g.\n" + "\n".join(wrong[:10])
    assert took > 0


def test_explain_names_the_kernel_and_why_the_others_did_not_serve():
    kernels = _kernels(with_cutlass=False)
    d = dispatch._decide_auto(get_op("wq_gemm"), _problem(300, 4096, 4096, 8, 128, "gptq", F16, F16, torch.int32,
                                                           (9, 0)), kernels)
    assert d.kernel.qualname == "cuda:wq_gemm_dense"
    text = str(d)
    assert "-> cuda:wq_gemm_dense" in text
    assert "rejected: cuda:wq_gemm_thin (priority 106): M=300 > maximum 16" in text, text
    assert "rejected: cuda:wq_gemm_wgmma_rows (priority 105): bits=8 not in [3, 4]" in text, text
    assert "rejected: cuda:wq_gemm_wgmma (priority 104): passes to a faster kernel" in text, text
    # float32 scales: the 16-bit-statistics kernels say so
    d = dispatch._decide_auto(get_op("wq_gemm"), _problem(1, 4096, 4096, 4, 128, "gptq", F32, F32, torch.int32,
                                                           (9, 0)), kernels)
    assert d.kernel.qualname == "cuda:wq_gemm_mma"
    assert "16-bit statistics" in str(d)


def test_each_kernel_computes_beyond_where_it_is_fastest_and_refuses_with_its_reasons():
    """An explicit choice (``backend="cuda:wq_gemm_thin"``) runs a kernel wherever its capability accepts the call:
    the capability holds what the kernel computes, ``defer`` only where another one is faster."""
    by_name = {k.name: k for k in _kernels(with_cutlass=False)}
    p = _problem(16, 28672, 8192, 8, 128, "gptq", F16, F16, torch.int32, (9, 0))
    thin = by_name["wq_gemm_thin"]
    assert thin.reasons(p) == [] and thin.deferral(p)
    assert "M=17 > maximum 16" in thin.reasons(_problem(17, 4096, 4096, 4, 128, "gptq", F16, F16, torch.int32,
                                                        (9, 0)))
    assert any("sm_80 < required sm_90" in r for r in by_name["wq_gemm_wgmma"].reasons(
        _problem(64, 4096, 4096, 4, 128, "gptq", F16, F16, torch.int32, (8, 0))))
    assert "bits=8" in " ".join(by_name["wq_gemm_wgmma_rows"].reasons(
        _problem(512, 4096, 4096, 8, 128, "gptq", F16, F16, torch.int32, (9, 0))))


@pytest.mark.parametrize("op", ["binary_gemm", "binary_linear"])
def test_binary_gemm_kernels_reproduce_the_measured_choice(op):
    """The Hopper 1-bit wgmma kernel from 384 rows where K % 128 == 0 and N % 8 == 0, else the mma.sync kernels
    (the choice binary_gemm made inside one registration); binary_linear's one-launch GEMV for 1-8 rows."""
    from bie_backend_cuda import plugin as cuda_plugin
    reg = KernelRegistrar(get_registry(), "cuda")
    cuda_plugin.bie_register_kernels(registry=reg)
    kernels = sorted((k for k in reg.kernels if k.op == op), key=lambda k: -k.priority)
    for m, n, k, cc in itertools.product((1, 383, 384, 4096), (8, 12, 4096), (128, 200, 4096), ((8, 0), (9, 0))):
        p = _On(op=op, device_type="cuda", device_index=0, dtype=F16, dims={"M": m, "N": n, "K": k},
                attrs={"epilogue": "scale"})
        object.__setattr__(p, "cc", cc)
        want = "wgmma" if cc == (9, 0) and m >= 384 and k % 128 == 0 and n % 8 == 0 else "tc"
        if op == "binary_linear" and m <= 8:
            want = "gemv"
        assert _chosen(kernels, p) == f"cuda:{op}_{want}", p.describe()


# ------------------------------------------------------------------ binary_linear: the one-launch GEMV's rows
def _binary_linear_kernels():
    from bie_backend_cuda import plugin as cuda_plugin
    reg = KernelRegistrar(get_registry(), "cuda")
    cuda_plugin.bie_register_kernels(registry=reg)
    return sorted([k for k in reg.kernels if k.op == "binary_linear"], key=lambda k: -k.priority)


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
def test_binary_linear_gemv_serves_the_rows_its_rule_says(cc):
    """Automatic selection takes the GEMV exactly where its shared memory holds the rows' signs (99 KiB at most),
    M <= 32, K <= 40960 and M*N*K <= 2^28 (past that its GPU time passes the two-launch call's host time); on sm_90,
    where the tensor-core GEMM's bound call is one launch too, M <= 4, N <= 4096 and M*N*K <= 2^26; elsewhere another
    kernel."""
    from bie_backend_cuda import binary as cb
    kernels = _binary_linear_kernels()
    if not any(k.name == "binary_linear_gemv" for k in kernels):
        pytest.skip("bie-core defines no binary_linear op here")
    wrong, served = [], 0
    for m, n, k in itertools.product((1, 2, 8, 9, 16, 17, 32, 33), (1, 64, 1024, 4096, 14336),
                                     (1, 100, 1024, 4096, 14336, 25216, 25344, 40960, 40961)):
        p = _On(op="binary_linear", device_type="cuda", device_index=0, dtype=BF16, dims={"M": m, "N": n, "K": k},
                attrs={})
        object.__setattr__(p, "cc", cc)
        smem = m * (-(-(-(-k // 32)) // 4)) * 16 + 4 * m
        fastest = (m <= 4 and n <= 4096 and m * n * k <= 1 << 26) if cc[0] == 9 else m * n * k <= 1 << 28
        want = m <= 32 and k <= 40960 and smem <= 99 * 1024 and fastest
        got = _chosen(kernels, p) == "cuda:binary_linear_gemv"
        served += want
        if got != want:
            wrong.append(f"M={m} N={n} K={k} sm_{cc[0]}{cc[1]}: gemv {'chosen' if got else 'not chosen'}")
    assert not wrong, f"{len(wrong)} choices differ, e.g.\n" + "\n".join(wrong[:10])
    assert served > 20 and cb.GEMV_MAX_WORK == 1 << 28 and cb.GEMV_MAX_WORK_SM90 == 1 << 26

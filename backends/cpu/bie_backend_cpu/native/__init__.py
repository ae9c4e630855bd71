"""Native C++ CPU kernels of bie-backend-cpu (optional, compiled on first use).

``register_kernels(registry)`` builds (once, cached) and loads the library and
registers its kernels at priority 50, above the plain-PyTorch reference. If
anything stands in the way (no compiler, no ninja, a failed build, a
non-x86/-64-bit oddity, ``BIE_CPU_NATIVE=0``), nothing is registered, the
reason is kept and shown by ``bie backends`` (``report_lines``), and the
reference kernels serve every op: the backend itself never breaks.

Environment:

``BIE_CPU_NATIVE=0``         do not build or use the native kernels
``BIE_CPU_ISA=LEVEL``        cap the instruction set: portable, avx2, avx512, avx512icl
``BIE_CPU_FUSED=0``          keep the kernels but not the fused module (pybind11: binary_linear, the layers' plans)
``BIE_CPU_NATIVE_REBUILD=1`` rebuild even if a cached build exists (or an earlier one failed)
``TORCH_EXTENSIONS_DIR``     where builds are cached (default ``~/.cache/bie/torch_extensions``)
"""
from __future__ import annotations

import os
import threading
import traceback
from dataclasses import dataclass, field
from typing import Optional

PRIORITY = 50

#: int_gemm is exact while |a @ b.T| fits int32 for every int8 input:
#: K * 128 * 128 <= 2**31 - 1.
INT_GEMM_MAX_K = (2 ** 31 - 1) // (128 * 128)


@dataclass
class NativeStatus:
    state: str = "not loaded"        # active | disabled | unavailable | not loaded
    reason: str = ""
    level: str = ""
    max_level: str = ""
    features: list = field(default_factory=list)
    build_dir: str = ""
    build_seconds: Optional[float] = None
    threaded: bool = True
    traceback: str = ""
    #: the fused binary_linear entry (csrc/fused.cpp): active | disabled | unavailable
    fused: str = "not loaded"
    fused_reason: str = ""

    @property
    def active(self) -> bool:
        return self.state == "active"


_status = NativeStatus()
_lib = None
_lock = threading.Lock()


def enabled_by_env() -> bool:
    return os.environ.get("BIE_CPU_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def fused_enabled_by_env() -> bool:
    return os.environ.get("BIE_CPU_FUSED", "1").strip().lower() not in ("0", "false", "no", "off")


def _fused_self_test() -> Optional[str]:
    """The fused entry against the reference, every epilogue form, before it is used."""
    import torch

    from bie_backend_cpu.reference import binary as ref_binary
    from . import kernels
    g = torch.Generator().manual_seed(2)
    for dtype, m, n, k in ((torch.float32, 3, 11, 77), (torch.float16, 1, 8, 64), (torch.bfloat16, 2, 5, 9)):
        x = torch.randn(m, k, generator=g).to(dtype)
        w = ref_binary.pack_signs(torch.randn(n, k, generator=g))
        shift = (torch.randn(k, generator=g) * 0.3).to(dtype)
        sa, sw = torch.rand((), generator=g) + 0.5, torch.rand(n, generator=g) + 0.5
        bias = torch.randn(n, generator=g).to(dtype)
        for args in ((x, None, w, k, None, None, None, None), (x, shift, w, k, sa, sw, bias, dtype),
                     (x, shift, w, k, sa, None, None, torch.float32)):
            if not torch.equal(kernels.binary_linear(*args), ref_binary.binary_linear(*args)):
                return f"self-test failed: fused binary_linear {dtype} M={m} N={n} K={k}"
    return _plans_self_test(g)


def _plans_self_test(g) -> Optional[str]:
    """The layers' bound plans (csrc/fused_plans.cpp) against the reference: the
    quantized linear at two bit widths, one weight-only GEMM, the binary conv and
    the dynamic int8 linear (both activation schemes)."""
    import torch

    from bie_backend_cpu.reference import integer as ref_int
    from bie_backend_cpu.reference import weight_only as ref_wq
    from . import kernels, kernels_wq
    m, k, n = 3, 37, 11
    for bits, dtype in ((8, torch.float32), (4, torch.bfloat16)):
        b = torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), (n, k), dtype=torch.int8, generator=g)
        x, sa, shift = (torch.randn(m, k, generator=g) * 3).to(dtype), torch.tensor(0.05), torch.randn(k, generator=g)
        scale, bias = torch.rand(n, generator=g) + 0.5, torch.randn(n, generator=g)
        quant = kernels.bind_quantize_int(x, sa, bits, shift, None)
        gemm = kernels.bind_int_gemm(quant(x, sa, bits, shift, None), b, bits, bits, scale, bias, dtype,
                                     prepared=kernels.prepare(b))
        plan = gemm.fuse_quantized_input(quant, sa, bits, shift, scale, bias)
        want = ref_int.int_gemm(ref_int.quantize_int(x, sa, bits, shift), b, bits, bits, scale, bias, dtype)
        if plan is None or not torch.equal(plan(x), want):
            return f"self-test failed: int_linear plan {bits}-bit {dtype}"
    qw = torch.randint(-2**31, 2**31 - 1, (64 * 4 // 32, n), dtype=torch.int32, generator=g)
    s = torch.rand(2, n, generator=g) * 0.1 + 0.01
    z = torch.randint(0, 2**31 - 1, (2, (n * 4 + 31) // 32), dtype=torch.int32, generator=g)
    x, bias = torch.randn(2, 64, generator=g), torch.randn(n, generator=g)
    args = (x, qw, s, z, None, bias, 4, 32, "gptq")
    call = kernels_wq.bind_wq_gemm(*args, prepared=kernels_wq.prepare(*args[1:5]))
    if call is None or not torch.allclose(call(*args), ref_wq.wq_gemm(*args), rtol=1e-5, atol=1e-4):
        return "self-test failed: weight-only plan"
    from bie_backend_cpu.reference import binary as ref_binary
    w = ref_binary.pack_signs(torch.randn(5, 3 * 6, generator=g))
    x = torch.randn(2, 3, 5, 4, generator=g)
    args = (x, w, [3, 2], [1, 2], [1, 0], [1, 1], 1, -1.0, torch.rand(5, generator=g) + 0.5, torch.randn(5, generator=g),
            torch.float32)
    call = kernels.bind_binary_conv2d(*args, prepared=kernels.prepare(w))
    if call is None or not torch.equal(call(*args), ref_binary.binary_conv2d(*args)):
        return "self-test failed: binary_conv2d plan"
    from bie_backend_cpu.reference import dynamic as ref_dyn
    from . import kernels_dynamic
    b = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    for scheme, rr, dtype in (("per_tensor_affine", True, torch.float32), ("per_token_symmetric", False, torch.bfloat16)):
        x, ws, bias = (torch.randn(m, k, generator=g) * 2 + 0.3).to(dtype), torch.rand(n, generator=g) * 0.01, None
        args = (x, b, ws, bias, scheme, rr)
        call = kernels_dynamic.bind_dynamic_int8_linear(*args, prepared=kernels.prepare(b))
        if call is not None and not torch.equal(call(*args), ref_dyn.dynamic_int8_linear(*args)):
            return f"self-test failed: dynamic_int8_linear plan {scheme}"
    return None


def _load_fused(lib, st: NativeStatus, force_rebuild: bool, verbose: bool) -> None:
    """Build/import the fused binary_linear entry and hand it the library's
    entry points; on any failure binary_linear keeps the ctypes path."""
    import ctypes

    from . import _build
    from . import kernels
    kernels.set_fused(None)
    if not fused_enabled_by_env():
        st.fused, st.fused_reason = "disabled", "BIE_CPU_FUSED=0"
        return
    try:
        mod, _, _ = _build.load_fused(force_rebuild=force_rebuild, verbose=verbose)
        def addr(fn):
            return ctypes.cast(fn, ctypes.c_void_p).value
        mod.init(addr(lib.bie_pack), addr(lib.bie_bgemm), _build.ABI_VERSION)
        mod.init_plans(addr(lib.bie_quant), addr(lib.bie_dquant), addr(lib.bie_igemm), addr(lib.bie_iconv),
                       addr(lib.bie_wq_gemm), addr(lib.bie_bconv), addr(lib.bie_int_layout), _build.ABI_VERSION)
        kernels.set_fused(mod)
        bad = _fused_self_test()
        if bad:
            kernels.set_fused(None)
            st.fused, st.fused_reason = "unavailable", bad
        else:
            st.fused = "active"
    except Exception as exc:  # noqa: BLE001 - isolation: the ctypes path still serves
        kernels.set_fused(None)
        st.fused = "unavailable"
        st.fused_reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _apply_isa_env(lib) -> None:
    from ._build import LEVEL_NAMES
    want = os.environ.get("BIE_CPU_ISA", "").strip().lower()
    if want:
        if want not in LEVEL_NAMES:
            raise ValueError(f"BIE_CPU_ISA={want!r}; allowed: {', '.join(LEVEL_NAMES)}")
        lib.bie_set_level(LEVEL_NAMES.index(want))


def _self_test() -> Optional[str]:
    """A few tiny exact checks against the reference before registering."""
    import torch

    from ..reference import binary as ref_binary
    from ..reference import integer as ref_integer
    from . import kernels
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 37, generator=g)
    if not torch.equal(kernels.pack_signs(x), ref_binary.pack_signs(x)):
        return "self-test failed: pack_signs"
    a, b = ref_binary.pack_signs(torch.randn(5, 100, generator=g)), ref_binary.pack_signs(torch.randn(9, 100, generator=g))
    if not torch.equal(kernels.binary_gemm(a, b, 100, None, None, None), ref_binary.binary_gemm(a, b, 100, None, None, None)):
        return "self-test failed: binary_gemm"
    qa = torch.randint(-128, 128, (3, 21), generator=g, dtype=torch.int32).to(torch.int8)
    qb = torch.randint(-128, 128, (17, 21), generator=g, dtype=torch.int32).to(torch.int8)
    if not torch.equal(kernels.int_gemm(qa, qb, 8, 8, None, None, None), ref_integer.int_gemm(qa, qb, 8, 8, None, None, None)):
        return "self-test failed: int_gemm"
    qx = torch.randint(-128, 128, (2, 6, 5, 7), generator=g, dtype=torch.int32).to(torch.int8)
    qw = torch.randint(-128, 128, (4, 3, 3, 3), generator=g, dtype=torch.int32).to(torch.int8)
    cargs = (qx, qw, 8, 8, [1, 2], [1, 1], [1, 1], 2, None, None, None)
    if not torch.equal(kernels.int_conv2d(*cargs), ref_integer.int_conv2d(*cargs)):
        return "self-test failed: int_conv2d"
    if not torch.equal(kernels.binary_bmm(a[None], b[None], 100, None, None), ref_binary.binary_bmm(a[None], b[None], 100, None, None)):
        return "self-test failed: binary_bmm"
    from ..reference import weight_only as ref_wq
    from . import kernels_wq
    for fmt in ("gptq", "gba"):
        codes = torch.randint(0, 16, (70, 19), generator=g, dtype=torch.int32)
        qw = ref_wq.wq_pack(codes, 4, 0)
        s = torch.rand(3, 19, generator=g) + 0.5
        z = ref_wq.wq_pack(torch.randint(0, 16, (3, 19), generator=g, dtype=torch.int32), 4, 1) if fmt == "gptq" else s
        wargs = (qw, s, z, None, 4, 32, 70, fmt, torch.float32)
        if not torch.equal(kernels_wq.wq_dequantize(*wargs), ref_wq.wq_dequantize(*wargs)):
            return f"self-test failed: wq_dequantize {fmt}"
        xw = torch.randn(2, 70, generator=g)
        y, r = kernels_wq.wq_gemm(xw, qw, s, z, None, None, 4, 32, fmt), ref_wq.wq_gemm(xw, qw, s, z, None, None, 4, 32, fmt)
        if not torch.allclose(y, r, rtol=1e-4, atol=1e-3):
            return f"self-test failed: wq_gemm {fmt}"
    from . import kernels_mbwq
    gbits, grows = [5, 3], [20, 12]
    codes = torch.cat([torch.randint(0, 1 << b, (r, 9), generator=g, dtype=torch.int32) for b, r in zip(gbits, grows)])
    mq = ref_wq.mbwq_pack(codes, gbits, grows)
    ms, mz = torch.rand(2, 9, generator=g) + 0.5, torch.rand(2, 9, generator=g)
    mperm = torch.randperm(32, generator=g)
    margs = (mq, ms, mz, mperm, gbits, grows, torch.float32)
    if not torch.equal(kernels_mbwq.mbwq_dequantize(*margs), ref_wq.mbwq_dequantize(*margs)):
        return "self-test failed: mbwq_dequantize"
    return None


def load(force_rebuild: bool = False, verbose: bool = False) -> NativeStatus:
    """Build if needed and load; never raises (the status says what happened)."""
    global _lib, _status
    with _lock:
        if _status.state != "not loaded" and not force_rebuild:
            return _status
        st = NativeStatus()
        if not enabled_by_env():
            st.state, st.reason = "disabled", "BIE_CPU_NATIVE=0"
            _status = st
            return st
        try:
            from . import _build
            from . import kernels
            lib, d, secs, threaded = _build.load(force_rebuild=force_rebuild, verbose=verbose)
            st.build_dir, st.build_seconds, st.threaded = str(d), secs, threaded
            _apply_isa_env(lib)
            kernels.set_library(lib)
            from . import kernels_wq
            kernels_wq.set_library(lib)
            st.level = _build.LEVEL_NAMES[lib.bie_get_level()]
            st.max_level = _build.LEVEL_NAMES[lib.bie_max_level()]
            st.features = _build.feature_names(lib.bie_cpu_features())
            bad = _self_test()
            if bad:
                kernels.set_library(None)
                st.state, st.reason = "unavailable", bad
            else:
                _lib = lib
                st.state = "active"
                _load_fused(lib, st, force_rebuild, verbose)
        except Exception as exc:  # noqa: BLE001 - isolation: record, never break the backend
            st.state = "unavailable"
            st.reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            st.traceback = traceback.format_exc()
        _status = st
        return st


def status() -> NativeStatus:
    return _status if _status.state != "not loaded" else load()


def library():
    """The loaded ctypes library, or None."""
    return _lib if status().active else None


def set_level(name: Optional[str]) -> str:
    """Switch the instruction-set level at run time (tests, benchmarks);
    ``None`` restores the best one this CPU supports. Returns the level in use."""
    from ._build import LEVEL_NAMES
    lib = library()
    if lib is None:
        raise RuntimeError(f"native CPU kernels are not active: {status().reason}")
    before = lib.bie_get_level()
    lvl = lib.bie_set_level(-1 if name is None else LEVEL_NAMES.index(name))
    _status.level = LEVEL_NAMES[lvl]
    if lvl != before:
        # prepared layouts and bound calls are made for one level's weight layout: drop them (with the
        # cached decisions) so that they are made again
        from bie_core.backend_api import capabilities_changed
        capabilities_changed()
    return _status.level


def available_levels() -> list:
    from ._build import LEVEL_NAMES
    lib = library()
    return [] if lib is None else list(LEVEL_NAMES[: lib.bie_max_level() + 1])


def register_kernels(registry) -> NativeStatus:
    """Register the native kernels (if they can be had) at priority 50."""
    if not enabled_by_env():          # re-read at every registration (registry resets, tests)
        return NativeStatus(state="disabled", reason="BIE_CPU_NATIVE=0")
    st = status()
    if not st.active:
        return st
    import torch

    from bie_core.backend_api import DYNAMIC_MAX_K, FLOAT_DTYPES, Capability
    from bie_core.backend_api import PACKABLE_DTYPES as PACKABLE

    from . import kernels, kernels_mbwq, kernels_wq
    from . import kernels_dynamic as nd
    cpu = ("cpu",)
    max_k = 2 ** 31 - 1
    tag = f"native C++ ({st.level})"

    def reg(module, op: str, description: str, **kw):
        """``module.<op>`` registered as ``native.<op>``."""
        registry.register(op, getattr(module, op), priority=PRIORITY, name=f"native.{op}",
                          description=f"{tag}: {description}", **kw)

    floats = Capability(devices=cpu, dtypes=FLOAT_DTYPES)
    binary_k = Capability(devices=cpu, dtypes=FLOAT_DTYPES, max_dims={"K": max_k})
    int_k = Capability(devices=cpu, dtypes=FLOAT_DTYPES, attrs={"bits": (4, 8)}, max_dims={"K": INT_GEMM_MAX_K})
    reg(kernels, "pack_signs", "vector compare to bit masks", capability=Capability(devices=cpu, dtypes=PACKABLE))
    reg(kernels, "binary_gemm", "XOR-popcount GEMM, fused scale/bias epilogue", prepare=kernels.prepare,
        capability=binary_k)
    reg(kernels, "binary_linear", "fused shift + sign + pack + XOR-popcount GEMM + epilogue", prepare=kernels.prepare,
        capability=binary_k)
    reg(kernels, "binary_conv2d", "bit-packed im2col + XOR-popcount GEMM, any pad value", prepare=kernels.prepare,
        bind=kernels.bind_binary_conv2d,
        capability=Capability(devices=cpu, dtypes=PACKABLE, min_dims={"K": 1}, max_dims={"K": max_k}))
    reg(kernels, "int_gemm", "int8 GEMM, exact int32 accumulation", prepare=kernels.prepare,
        bind=kernels.bind_int_gemm, capability=Capability(devices=cpu, dtypes=FLOAT_DTYPES, attrs={"a_bits": (4, 8), "b_bits": (4, 8)},
                              max_dims={"K": INT_GEMM_MAX_K}))
    reg(kernels, "int_conv2d", "implicit int8 im2col + int GEMM, exact int32, scale/bias epilogue",
        prepare=kernels.prepare, bind=kernels.bind_int_conv2d, capability=int_k)
    reg(kernels, "int_bmm", "batched int8 GEMM, exact int32 accumulation", capability=int_k)
    reg(kernels, "binary_bmm", "batched XOR-popcount GEMM (b packed into panels per call)", capability=binary_k)
    reg(kernels, "sign_embedding", "gather + bit expansion to +-scale", capability=floats)
    reg(kernels, "sign_embedding_bag", "gather + per-bit majority vote", capability=floats)
    reg(kernels, "quantize_int", "true division, round half to even, clamp; any broadcast scale",
        bind=kernels.bind_quantize_int, capability=Capability(devices=cpu, dtypes=FLOAT_DTYPES, attrs={"bits": (4, 8)}))
    reg(kernels, "lsq_backward", "one pass: the STE mask, the codes and the scale and shift partial sums",
        bind=kernels.bind_lsq_backward, capability=Capability(devices=cpu, dtypes=FLOAT_DTYPES, attrs={"bits": (4, 8)}))
    wq_cap = Capability(devices=cpu, dtypes=FLOAT_DTYPES, attrs={"bits": kernels_wq.BITS, "format": ("gptq", "gba")})
    reg(kernels_wq, "wq_gemm", f"fused dequant-in-registers GEMM for M <= {kernels_wq.FUSED_MAX_M}, else native "
        "dequantization + torch matmul; float32 accumulation", prepare=kernels_wq.prepare, capability=wq_cap,
        bind=kernels_wq.bind_wq_gemm)
    reg(kernels_wq, "wq_dequantize", "float32 dequantization from the prepared panels (bit-exact)",
        prepare=kernels_wq.prepare, capability=wq_cap)
    reg(kernels_wq, "wq_gemm_grad_input", "native dequantization + torch matmul (grad @ W.T)",
        prepare=kernels_wq.prepare, capability=wq_cap)
    reg(kernels_mbwq, "mbwq_gemm", "per-width segments (2/3/4/8 bits; 5/6 as 8-bit codes) on the wq kernels, "
        f"summed: fused GEMV for M <= {kernels_wq.FUSED_MAX_M}, else dequant slabs + torch matmul; q_perm and "
        "channel_scale on x", prepare=kernels_mbwq.prepare, bind=kernels_mbwq.bind_mbwq_gemm, capability=floats)
    reg(kernels_mbwq, "mbwq_dequantize", "float32 q*s - z per width segment, rows scattered by q_perm (bit-exact)",
        prepare=kernels_mbwq.prepare, capability=floats)
    reg(kernels_mbwq, "mbwq_gemm_grad_input", "native dequantization per width segment + torch matmul, "
        "* channel_scale", prepare=kernels_mbwq.prepare, capability=floats)
    reg(nd, "dynamic_quantize_act", "per-row abs-max and quantization in one pass (vector extensions)",
        capability=floats)
    reg(nd, "dynamic_int8_linear", "vectorised activation quantization + int8 GEMM, zero-point correction, "
        "per-row x per-column scales and bias in the epilogue", prepare=kernels.prepare,
        bind=nd.bind_dynamic_int8_linear,
        capability=Capability(devices=cpu, dtypes=FLOAT_DTYPES, max_dims={"K": DYNAMIC_MAX_K}))
    del torch
    return st


def report_lines() -> list:
    st = _status if enabled_by_env() else NativeStatus(state="disabled")
    if st.state == "active":
        line = (f"native kernels: active, ISA {st.level} (CPU supports up to {st.max_level}: "
                f"{', '.join(st.features) or '-'}), priority {PRIORITY}")
        out = [line]
        lib = _lib
        if lib is not None:
            threads = (f"{lib.bie_num_threads()} threads (torch.set_num_threads)" if st.threaded else
                       "single-threaded (built without OpenMP: the compiler does not support -fopenmp)")
            out.append(f"native kernels: {threads}; build cache {st.build_dir}")
        if st.fused == "active":
            out.append("native kernels: fused binary_linear entry (pybind11): active")
        else:
            out.append(f"native kernels: fused binary_linear entry (pybind11): {st.fused}"
                       f"{': ' + st.fused_reason if st.fused_reason else ''}; binary_linear uses the ctypes entry points")
        return out
    if st.state == "disabled":
        return ["native kernels: disabled (BIE_CPU_NATIVE=0); the plain PyTorch kernels serve every op"]
    if st.state == "not loaded":
        return ["native kernels: not loaded yet"]
    return [f"native kernels: unavailable: {st.reason}; the plain PyTorch kernels serve every op"]


def build(verbose: bool = False) -> str:
    """``bie build cpu``: build (or rebuild) now; raise with the reason on failure."""
    cur = _status
    if cur.active and cur.build_seconds is not None:
        # the plugin's first use compiled the kernels (and the fused entry)
        # a moment ago in this process (``bie build`` loads the plugins
        # first): compiling again would print every compiler message twice
        st = cur
    else:
        st = load(force_rebuild=True, verbose=verbose)
    if st.state == "disabled":
        return "native kernels disabled by BIE_CPU_NATIVE=0 (nothing built)"
    if not st.active:
        raise RuntimeError(f"bie-backend-cpu native build failed: {st.reason}")
    fused = "active" if st.fused == "active" else f"{st.fused}: {st.fused_reason}"
    return f"native kernels built in {st.build_dir} (ISA {st.level}); fused binary_linear entry: {fused}"

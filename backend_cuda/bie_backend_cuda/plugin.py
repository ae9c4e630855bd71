"""Kernel registration of bie-backend-cuda (loaded on first use).

Importing this module compiles nothing: the extension is built or loaded the
first time a kernel runs (or by ``bie build cuda``).
"""
from __future__ import annotations

import dataclasses

import torch

from bie_core.backend_api import FLOAT_DTYPES as FLOATS
from bie_core.backend_api import PACKABLE_DTYPES as PACKABLE
from bie_core.backend_api import DYNAMIC_MAX_K, Capability, conv_out_size, handoff, has_op, hookimpl

from . import _build, binary, integer, mbwq, weight_only

PRIORITY = 100
SIMT_PRIORITY = 90
SM80 = ((8, 0), None)
SM90 = ((9, 0), (9, 0))


def _wq_check(p):
    gs = p.attrs.get("group_size")
    if gs is not None and not weight_only.group_size_ok(gs):
        return f"group_size={gs} not served (needs -1 or a power of two >= 16)"
    return None


# K words (32 channels of one tap each) the conv kernel keeps a shared-memory offset table for: <= 94 KiB of shared
# memory in all, within every sm_80+ GPU's per-block limit
CONV_MAX_KWORDS = 6144


def _conv_check(p):
    d = p.dims
    n, c, h, w, o, kh, kw = d["N"], d["C"], d["H"], d["W"], d["O"], d["KH"], d["KW"]
    if p.attrs.get("groups", 1) != 1:
        return f"groups={p.attrs.get('groups')} (the direct conv serves groups=1)"
    if p.attrs.get("pad_value") == 0.0 and kh * kw > 32:
        return f"pad_value 0 with a {kh}x{kw} kernel (more than 32 taps)"
    cw = -(-c // 32)
    if kh * kw * cw > CONV_MAX_KWORDS:
        return f"K of {kh * kw * cw} words of 32 channels > {CONV_MAX_KWORDS}"
    st, pd, dl = p.attrs["stride"], p.attrs["padding"], p.attrs["dilation"]
    ho, wo = conv_out_size(h, kh, st[0], pd[0], dl[0]), conv_out_size(w, kw, st[1], pd[1], dl[1])
    hp, wp = h + 2 * pd[0], w + 2 * pd[1]
    if n * hp * wp * cw >= 2 ** 31 - 1024 or n * ho * wo >= 2 ** 31 - 1024 or o >= 65535 * 32:
        return f"conv of {n}x{c}x{h}x{w} (output {o}x{ho}x{wo}) outside the 32-bit index range served"
    return None


#: the dtypes transpose_2d's kernel moves (elements of 1, 2, 4 or 8 bytes)
_REAL_DTYPES = (torch.bool, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.float16,
                torch.bfloat16, torch.float32, torch.float64)


@hookimpl
def bie_register_kernels(registry):
    cuda = ("cuda",)
    registry.register("pack_signs", binary.pack_signs, priority=PRIORITY, name="pack_signs",
                      capability=Capability(devices=cuda, dtypes=PACKABLE),
                      description="one thread per packed byte, 16/32-byte vector loads when aligned")
    registry.register("unpack_signs", binary.unpack_signs, priority=PRIORITY, name="unpack_signs",
                      capability=Capability(devices=cuda, dtypes=PACKABLE))
    wgmma = Capability(devices=cuda, dtypes=FLOATS, compute_capability=SM90, divisibility={"K": 128, "N": 8},
                       min_dims={"N": 1}, defer=binary.wgmma_faster_elsewhere)
    registry.register("binary_gemm", binary.binary_gemm_wgmma, priority=PRIORITY + 1, name="binary_gemm_wgmma",
                      capability=wgmma, prepare=binary.prepare_weight, prepare_static=("k",),
                      description="persistent 1-bit wgmma kernel (sm_90: TMA-fed weights and activations, A by "
                                  "ldmatrix, bulk-copy stores); K % 128 == 0, N % 8 == 0")
    registry.register("binary_gemm", binary.binary_gemm, priority=PRIORITY, name="binary_gemm_tc",
                      capability=Capability(devices=cuda, dtypes=FLOATS, compute_capability=SM80),
                      prepare=binary.prepare_weight, prepare_static=("k",),
                      description="1-bit tensor cores (mma m16n8k256 AND+popc, popcount correction), "
                                  "cp.async pipeline, fused scale/bias/dtype epilogue; any M, N, K")
    registry.register("binary_gemm", binary.binary_gemm_simt, priority=SIMT_PRIORITY, name="binary_gemm_simt",
                      capability=Capability(devices=cuda, dtypes=FLOATS),
                      description="SIMT XOR+popcount for GPUs without 1-bit MMA")
    if has_op("binary_linear"):
        registry.register("binary_linear", binary.binary_linear_gemv, priority=PRIORITY + 2,
                          name="binary_linear_gemv",
                          capability=Capability(devices=cuda, dtypes=FLOATS, compute_capability=SM80,
                                                min_dims={"M": 1, "N": 1},
                                                max_dims={"M": binary.GEMV_MAX_M, "K": binary.GEMV_MAX_K},
                                                check=binary.check_gemv, defer=binary.gemv_faster_elsewhere),
                          prepare=binary.prepare_weight, prepare_static=("k",), bind=binary.bind_binary_linear_gemv,
                          description="fused GEMV, one launch: the signs of x + shift taken by every block (a "
                                      "thread makes a 32-bit word of four rows), AND+popc products against 16-byte "
                                      "loads of the weight rows, popcount correction, the epilogue fused; 1-32 rows")
        registry.register("binary_linear", binary.binary_linear_wgmma, priority=PRIORITY + 1,
                          name="binary_linear_wgmma", capability=wgmma, prepare=binary.prepare_weight,
                          prepare_static=("k",),
                          bind=binary.bind_binary_linear_wgmma,
                          description="pack_signs(x + shift) kernel, then the 1-bit wgmma GEMM")
        registry.register("binary_linear", binary.binary_linear, priority=PRIORITY, name="binary_linear_tc",
                          capability=Capability(devices=cuda, dtypes=FLOATS, compute_capability=SM80),
                          prepare=binary.prepare_weight, prepare_static=("k",), bind=binary.bind_binary_linear,
                          description="the 1-bit tensor-core GEMM; its bound call at 1-32 rows one launch that "
                                      "takes the signs of x + shift into shared memory itself (the fused form), "
                                      "otherwise a pack_signs(x + shift) kernel first")
    registry.register("binary_bmm", binary.binary_bmm, priority=PRIORITY, name="binary_bmm_tc",
                      capability=Capability(devices=cuda, dtypes=FLOATS, compute_capability=SM80))
    registry.register("binary_bmm", binary.binary_bmm_simt, priority=SIMT_PRIORITY, name="binary_bmm_simt",
                      capability=Capability(devices=cuda, dtypes=FLOATS))
    registry.register("binary_conv2d", binary.binary_conv2d, priority=PRIORITY, name="binary_conv2d_direct",
                      capability=Capability(devices=cuda, dtypes=PACKABLE, compute_capability=SM80,
                                            check=_conv_check),
                      prepare=binary.prepare_conv, bind=binary.bind_binary_conv2d,
                      description="direct conv on 1-bit tensor cores (mma m16n8k256 AND+popc): one kernel packs "
                                  "the padded input's sign words, the conv reads each window straight from them "
                                  "(no im2col), popcount correction, scale/bias/dtype and the NCHW store fused; "
                                  "groups=1, any kernel/stride/padding/dilation, pad -1/+1/0")
    registry.register("sign_embedding", binary.sign_embedding, priority=PRIORITY, name="sign_embedding",
                      capability=Capability(devices=cuda, dtypes=FLOATS))
    registry.register("sign_embedding_bag", binary.sign_embedding_bag, priority=PRIORITY,
                      name="sign_embedding_bag", capability=Capability(devices=cuda, dtypes=FLOATS))
    registry.register("quantize_int", integer.quantize_int, priority=PRIORITY, name="quantize_int",
                      capability=Capability(devices=cuda, dtypes=FLOATS, attrs={"bits": (4, 8)}),
                      bind=integer.bind_quantize_int,
                      description="one pass: shift, IEEE division, round half to even, clamp; any broadcast scale "
                                  "(runs along the trailing dims), codes as int8 or floats")
    if has_op("transpose_2d"):
        registry.register("transpose_2d", integer.transpose_2d, priority=PRIORITY, name="transpose_2d_tiled",
                          capability=Capability(devices=cuda, dtypes=_REAL_DTYPES),
                          description="128-row x 128-byte tiles through swizzled shared memory, 16 bytes a thread on "
                                      "both sides (whole tiles of aligned rows); elements of 1, 2, 4 or 8 bytes")
    if has_op("int_gemm"):
        registry.register("int_gemm", integer.int_gemm_gemv, priority=PRIORITY, name="int_gemm_gemv",
                          capability=Capability(devices=cuda, dtypes=FLOATS, compute_capability=SM80,
                                                attrs={"a_bits": (4, 8), "b_bits": (4, 8), "bits": (4, 8)},
                                                min_dims={"M": 1, "N": 1, "K": 1},
                                                max_dims={"M": integer.GEMV_MAX_M, "K": 65535},
                                                check=integer.check_gemv),
                          prepare=integer.prepare_gemv, bind=integer.bind_int_gemm_gemv,
                          description="GEMV, one launch: int8 mma.m16n8k32 on fragment-ordered weight codes "
                                      "streamed through a cp.async ring, split-K over warps with exact int32 sums, "
                                      "the epilogue fused; its bound call quantizes x inside the launch "
                                      "(fuse_quantized_input); 1-32 rows (from 9 on sm_90 in clusters of 8 blocks "
                                      "that share the codes of x through distributed shared memory)")
    wq_cap = Capability(devices=cuda, dtypes=FLOATS, compute_capability=SM80,
                        attrs={"bits": (1, 2, 3, 4, 8), "format": ("gptq", "gba")}, check=_wq_check)
    _register_wq_gemm(registry, wq_cap)
    registry.register("wq_gemm_grad_input", weight_only.wq_gemm_grad_input, priority=PRIORITY,
                      name="wq_gemm_grad_input", capability=wq_cap, prepare=weight_only.prepare,
                      description="dequantize (fused kernel) + cuBLAS")
    registry.register("wq_dequantize", weight_only.wq_dequantize, priority=PRIORITY, name="wq_dequantize",
                      capability=wq_cap, prepare=weight_only.prepare)
    _register_mbwq(registry, cuda)
    if has_op("dynamic_int8_linear"):
        from . import dynamic
        registry.register("dynamic_quantize_act", dynamic.dynamic_quantize_token, priority=PRIORITY + 1,
                          name="dynamic_quantize_token", bind=dynamic.bind_dynamic_quantize_token,
                          capability=Capability(devices=cuda, dtypes=FLOATS, compute_capability=SM80,
                                                attrs={"scheme": ("per_token_symmetric",)}),
                          description="one pass per token: a row's 8-element chunks in registers (16-byte loads), "
                                      "abs-max in shared memory, IEEE scale, codes by reciprocal with the exact "
                                      "division near ties, 8-byte stores; a transposed x in two passes, its codes "
                                      "written transposed")
        registry.register("dynamic_quantize_act", dynamic.dynamic_quantize_act, priority=PRIORITY,
                          name="dynamic_quantize_act", capability=Capability(devices=cuda, dtypes=FLOATS),
                          description="eager element-wise passes (row abs-max + codes in place)")
        registry.register("dynamic_int8_linear", dynamic.dynamic_int8_gemv, priority=PRIORITY + 1,
                          name="dynamic_int8_gemv", prepare=dynamic.prepare_gemv, bind=dynamic.bind_dynamic_int8_gemv,
                          capability=Capability(devices=cuda, dtypes=FLOATS, compute_capability=SM80,
                                                attrs={"scheme": ("per_token_symmetric",)},
                                                min_dims={"M": 1, "N": 1, "K": 1},
                                                max_dims={"M": dynamic.GEMV_MAX_M, "K": DYNAMIC_MAX_K},
                                                check=dynamic.check_gemv, defer=handoff("cuda:dynamic_int8_gemv")),
                          description="fused per-token GEMV, one launch: x quantized per row in every block, int8 "
                                      "mma.m16n8k32 on fragment-ordered weights streamed by 16-byte loads, split-K "
                                      "over warps with exact int32 sums, the reference's epilogue; 1-16 rows")
        registry.register("dynamic_int8_linear", dynamic.dynamic_int8_linear, priority=PRIORITY,
                          name="dynamic_int8_linear_int_mm", prepare=dynamic.prepare, prepare_static=("scheme",),
                          capability=Capability(devices=cuda, dtypes=FLOATS, compute_capability=SM80,
                                                divisibility={"K": 8, "N": 8}),
                          description="activation quantization + torch._int_mm (cuBLASLt int8) + one fused "
                                      "(torch.compile) scale/zero-point/bias epilogue")


def _register_mbwq(registry, cuda) -> None:
    """The mixed-width ops (MBWQLinear): one layout per weight version and group layout (mbwq.prepare)."""
    cap = Capability(devices=cuda, dtypes=FLOATS, compute_capability=SM80)
    common = dict(prepare=mbwq.prepare, prepare_static=("group_bits", "group_rows"))
    registry.register("mbwq_gemm", mbwq.mbwq_gemv, priority=PRIORITY + 1, name="mbwq_gemv",
                      capability=dataclasses.replace(cap, max_dims={"M": mbwq.GEMV_MAX_M}), bind=mbwq.bind_mbwq_gemv,
                      description="GEMV in one launch: x gathered by q_perm and scaled into shared memory per block, "
                                  "codes of every width decoded in registers from coalesced int32 loads, float32 "
                                  "accumulation, split-K with a deterministic last-block reduction, bias and cast "
                                  f"fused; 1-{mbwq.GEMV_MAX_M} rows", **common)
    registry.register("mbwq_gemm", mbwq.mbwq_gemm_skinny, priority=PRIORITY + 2, name="mbwq_gemm_skinny",
                      capability=dataclasses.replace(cap, dtypes=(torch.float16, torch.bfloat16),
                                                     max_dims={"M": mbwq.SKINNY_MAX_M},
                                                     defer=mbwq.skinny_faster_elsewhere),
                      bind=mbwq.bind_mbwq_gemm_skinny,
                      description="skinny tensor-core GEMM in one cooperative launch: every block first writes its "
                                  "share of x[:, k] * channel_scale[k] into a scratch in the mma's order (prepared "
                                  "per input row), then after a grid-wide barrier streams the weight's chunks, their "
                                  "scales and zeros and that scratch through a cp.async ring, decodes the codes of "
                                  "every width to fp16 / bf16 q*s - z in registers and issues mma.m16n8k16 with "
                                  "float32 accumulation; K splits summed in split order by the splits' own blocks, "
                                  "bias and cast fused; no weight-sized allocation; fp16 / bf16, 1-"
                                  f"{mbwq.SKINNY_MAX_M} rows (automatic at "
                                  f"{mbwq.GEMV_MAX_M + 1}-{mbwq.SKINNY_AUTO_MAX_M})", **common)
    registry.register("mbwq_gemm", mbwq.mbwq_gemm_dense, priority=PRIORITY, name="mbwq_gemm_dense", capability=cap,
                      bind=mbwq.bind_mbwq_gemm_dense,
                      description="dequantize (one kernel, channel_scale folded, x's dtype) + cuBLAS in one library "
                                  "call; any rows",
                      **common)
    registry.register("mbwq_gemm_grad_input", mbwq.mbwq_gemm_grad_input, priority=PRIORITY,
                      name="mbwq_gemm_grad_input", capability=cap,
                      description="dequantize (one kernel, channel_scale folded) + cuBLAS grad @ W.T", **common)
    registry.register("mbwq_dequantize", mbwq.mbwq_dequantize, priority=PRIORITY, name="mbwq_dequantize",
                      capability=cap, description="float32 q*s - z per 32-row chunk, rows scattered by q_perm",
                      **common)


#: The wq_gemm kernels, highest priority first. Automatic selection takes the first that accepts the call and does
#: not defer it (its ``defer`` names where another kernel was measured faster); ``backend="cuda:<name>"`` runs one
#: of them wherever its capability accepts the call.
WQ_GEMM_KERNELS = (
    ("wq_gemm_thin", weight_only.wq_gemm_thin,
     dict(max_dims={"M": weight_only.THIN_MAX_M}, check=weight_only.check_thin,
          defer=weight_only.thin_faster_elsewhere),
     "thin GEMV: weights as the MMA A operand, a cp.async ring per warp, x staged per block or per K slice; "
     "up to 16 rows, K % 8 == 0, groups of 32 or more, 16-bit statistics"),
    ("wq_gemm_wgmma_rows", weight_only.wq_gemm_wgmma_rows,
     dict(attrs={"bits": (3, 4)}, compute_capability=SM90, check=weight_only.check_wgmma_rows,
          defer=weight_only.wgmma_rows_faster_elsewhere),
     "Hopper pipelined many-row wgmma: 256x128 tiles, a producer warpgroup issuing TMA copies, register-A wgmmas "
     "three deep, the last partial wave split in K; 3/4-bit codes, groups of 32 or more, 16-bit statistics"),
    ("wq_gemm_wgmma", weight_only.wq_gemm_wgmma,
     dict(compute_capability=SM90, check=weight_only.check_wgmma, defer=weight_only.wgmma_faster_elsewhere),
     "Hopper wgmma with the codes dequantized in registers into the A operand, 16-128 rows a block; "
     "K % 8 == 0, 16-bit statistics"),
    ("wq_gemm_dense", weight_only.wq_gemm_dense,
     dict(defer=weight_only.dense_faster_elsewhere),
     "dequantize (one fused pass) + cuBLAS"),
    ("wq_gemm_skinny", weight_only.wq_gemm_skinny,
     dict(max_dims={"M": weight_only.SKINNY_MAX_M}, check=weight_only.check_skinny,
          defer=weight_only.skinny_faster_elsewhere),
     "skinny memory-bound kernel: A-fragment ordered codes, 16-bit statistics, up to 16 rows"),
    ("wq_gemm_mma", weight_only.wq_gemm_mma, {},
     "fp16/bf16 tensor-core GEMM on fragment-ordered codes, split-K with deterministic reductions; any M"),
)


def _register_wq_gemm(registry, wq_cap: Capability) -> None:
    """One registration per kernel: each narrows the op's common capability (devices, dtypes, bits, group sizes)."""
    n = len(WQ_GEMM_KERNELS)
    for i, (name, fn, narrow, description) in enumerate(WQ_GEMM_KERNELS):
        cap = wq_cap
        for field, value in narrow.items():
            if field == "check":
                value = _both(wq_cap.check, value)
            elif field == "attrs":
                value = {**wq_cap.attrs, **value}
            cap = dataclasses.replace(cap, **{field: value})
        # the layers' eager inference call (bind_<name>: the launch bound to its layout; none for dequantize + cuBLAS)
        registry.register("wq_gemm", fn, priority=PRIORITY + n - i, name=name, capability=cap,
                          prepare=weight_only.prepare, description=description,
                          bind=getattr(weight_only, "bind_" + name, None))


def _both(first, second):
    def check(p):
        return first(p) or second(p)
    return check


@hookimpl
def bie_build(verbose):
    path = _build.load(verbose=bool(verbose), force=not _build.is_built())
    return f"CUDA kernels ready: {path}"


@hookimpl
def bie_report():
    try:
        name = torch.cuda.get_device_name()
        cc = torch.cuda.get_device_capability()
        built = _build.is_built()
        d = _build.build_dir()
    except Exception as exc:  # noqa: BLE001 - a report line, never an error
        return [f"cuda: {exc}"]
    state = f"built ({d})" if built else "not built yet: compiled on first use, or run `bie build cuda`"
    return [f"device: {name} (sm_{cc[0]}{cc[1]})", f"kernels: {state}"]

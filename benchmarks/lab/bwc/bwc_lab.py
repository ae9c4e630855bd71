"""Drives bwc_lab.so (see bwc_lab.h): checks every variant bit-exact against a float64 product, then
times each at a few shapes, alone, after the popcount pass, and after it with programmatic dependent
launch (PDL). Timing: benchmarks/gpu_timing.py (CUDA graphs over > 256 MB of rotated weights).

    python3 benchmarks/lab/bwc/bwc_lab.py [--variants 0,1,2] [--shapes 4096x4096x4096,...] [--json f]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from gpu_timing import pool_size, time_graph, warm_gpu  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = {0: "coop128x256 c2x1 (CFG0)", 1: "pp64x256 c2x1 (CFG2)", 2: "coop128x256 c1x1", 3: "pp64x256 c1x1",
         4: "coop128x256 c1x1 D8", 5: "coop128x256 c2x1 D8", 6: "pp64x256 c1x1 D8", 7: "coop128x256 c1x1 epi128x64",
         8: "coop128x256 c2x1 D8, epilogue dot only", 9: "coop128x256 c2x1 D8, epilogue acc only",
         11: "coop128x256 c2x1 lean epilogue, mainloop not waiting for the pass (no GDC)",
         12: "pp64x256 c2x1 lean epilogue", 13: "coop128x256 c1x1 lean epilogue",
         14: "coop128x256 c2x1 lean epilogue (the product's wg128x256, 16-bit out)",
         17: "v14 + the tile's term loads all in flight (cp.async) before the stage wait (session 14)",
         18: "v17 with the row terms counted in the mainloop (shared loads + POPC): no popcount pass",
         19: "pp64x256 c2x1, row terms counted in the mainloop", 20: "coop128x256 c1x1, row terms counted in the mainloop",
         21: "pp64x128 c1x1, row terms counted in the mainloop"}


class WgArgs(ctypes.Structure):
    _fields_ = [("a", ctypes.c_void_p), ("b", ctypes.c_void_p), ("d", ctypes.c_void_p),
                ("M", ctypes.c_int), ("N", ctypes.c_int), ("Kb", ctypes.c_int), ("L", ctypes.c_int),
                ("lda", ctypes.c_int64), ("ldb", ctypes.c_int64), ("a_bs", ctypes.c_int64), ("b_bs", ctypes.c_int64),
                ("ldd", ctypes.c_int64), ("d_bs", ctypes.c_int64),
                ("row_term", ctypes.c_void_p), ("row_bs", ctypes.c_int64),
                ("col_term", ctypes.c_void_p), ("col_bs", ctypes.c_int64),
                ("s1", ctypes.c_void_p), ("s1_vec", ctypes.c_int), ("s2", ctypes.c_void_p), ("s2_vec", ctypes.c_int),
                ("bias", ctypes.c_void_p), ("device", ctypes.c_int), ("sm_count", ctypes.c_int),
                ("workspace", ctypes.c_void_p)]


LIB = ctypes.CDLL(os.path.join(HERE, "bwc_lab.so"))
SMS = torch.cuda.get_device_properties(0).multi_processor_count


def variants():
    return [v for v in range(32) if hasattr(LIB, f"bwc_run_{v}")]


class Gemm:
    """One variant bound to one problem; call(w, d) launches on the current stream."""

    def __init__(self, v, a, n, k, row, col, s2):
        self.fn = getattr(LIB, f"bwc_run_{v}")
        self.fn.restype = ctypes.c_int
        m = a.shape[0]
        self.args = WgArgs(a.data_ptr(), 0, 0, m, n, k // 8, 1, k // 8, k // 8, 0, 0, n, 0,
                           row.data_ptr(), 0, col.data_ptr(), 0, None, 0, s2.data_ptr(), 1, None,
                           torch.cuda.current_device(), SMS, None)
        self.keep = (a, row, col, s2)
        ws = ctypes.c_size_t(0)
        self.err = ctypes.create_string_buffer(512)
        rc = self.fn(ctypes.byref(self.args), ctypes.byref(ws), None, 0, self.err, 512)
        assert rc == 0, self.err.value
        self.ws = torch.empty(max(ws.value, 16), dtype=torch.uint8, device="cuda")
        self.args.workspace = self.ws.data_ptr()

    def __call__(self, w, d, pdl=False):
        self.args.b = w.data_ptr()
        self.args.d = d.data_ptr()
        rc = self.fn(ctypes.byref(self.args), None, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
                     int(pdl), self.err, 512)
        if rc:
            raise RuntimeError(self.err.value.decode())


def popc(a, k, c0, c1, term):
    rc = LIB.bwc_popc(ctypes.c_void_p(a.data_ptr()), a.shape[0], k // 32, ctypes.c_longlong(a.stride(0) // 4),
                      c0, c1, ctypes.c_void_p(term.data_ptr()), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    assert rc == 0


def popc_thin(a, k, c0, c1, term):
    """popc.cu's one-warp-per-SM pass (session 15): leaves room for a PDL-launched GEMM block beside it."""
    rc = LIB.bwc_popc_thin(ctypes.c_void_p(a.data_ptr()), a.shape[0], k // 32, ctypes.c_longlong(a.stride(0) // 4),
                           c0, c1, ctypes.c_void_p(term.data_ptr()),
                           ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), SMS)
    assert rc == 0


def unpack(t, k):
    bits = (t.unsqueeze(-1) >> torch.arange(8, device=t.device, dtype=torch.uint8)) & 1
    return bits.reshape(t.shape[0], -1)[:, :k]


def check(vs):
    out = []
    g = torch.Generator(device="cuda").manual_seed(1234)
    for (m, n, k) in [(300, 520, 2048), (129, 264, 1152), (1024, 768, 4096)]:
        a = torch.randint(0, 256, (m, k // 8), dtype=torch.uint8, device="cuda", generator=g)
        w = torch.randint(0, 256, (n, k // 8), dtype=torch.uint8, device="cuda", generator=g)
        s2 = torch.rand(n, device="cuda", generator=g) + 0.5
        ua, uw = unpack(a, k).double(), unpack(w, k).double()
        row = (k - 2 * ua.sum(1)).int()
        col = (-2 * uw.sum(1)).int()
        dot = (4 * (ua @ uw.T)).round().long() + row.long()[:, None] + col.long()[None, :]
        ref = (dot.float() * s2).bfloat16()
        for v in vs:
            d = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            row2 = torch.empty(m, dtype=torch.int32, device="cuda")
            popc(a, k, k, -2, row2)
            assert torch.equal(row2, row), "popc pass"
            row2.zero_()
            popc_thin(a, k, k, -2, row2)
            assert torch.equal(row2, row), "thin popc pass"
            Gemm(v, a, n, k, row2, col, s2)(w, d, pdl=True)
            torch.cuda.synchronize()
            ok = torch.equal(d, ref)
            out.append(dict(variant=v, shape=f"{m}x{n}x{k}", exact=ok,
                            mismatches=int((d != ref).sum()) if not ok else 0))
            if not ok:   # a wrong row term shifts a whole row by one constant; a broken product does not
                err = d.double() / s2.double()[None, :] - dot.double()
                spread = (err - err.median(1, keepdim=True).values).abs().max(1).values
                out[-1]["rows_off_by_a_constant"] = int((spread < 0.02 * (k + 1)).sum())
                out[-1]["row_offset_sample"] = [round(float(x), 1) for x in err.median(1).values[:4]]
            print(out[-1], flush=True)
    return out


def bench(vs, shapes, rows):
    for (m, n, k) in shapes:
        kb = k // 8
        a = torch.randint(0, 256, (m, kb), dtype=torch.uint8, device="cuda")
        ws = [torch.randint(0, 256, (n, kb), dtype=torch.uint8, device="cuda") for _ in range(pool_size(n * kb))]
        col = torch.randint(-k, 0, (n,), dtype=torch.int32, device="cuda") * 2
        s2 = torch.rand(n, device="cuda") + 0.5
        row = torch.empty(m, dtype=torch.int32, device="cuda")
        popc(a, k, k, -2, row)
        d = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        t_popc = time_graph([lambda: popc(a, k, k, -2, row)] * 2)
        t_thin = time_graph([lambda: popc_thin(a, k, k, -2, row)] * 2)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(pool_size(n * k * 2))]
        cublas = time_graph([lambda w=w: F.linear(x, w) for w in wb])
        del wb
        for v in vs:
            G = Gemm(v, a, n, k, row, col, s2)
            r = dict(variant=v, name=NAMES.get(v, str(v)), shape=f"{m}x{n}x{k}", popc_us=t_popc, thin_popc_us=t_thin,
                     cublas_us=cublas)
            try:
                r["gemm_us"] = time_graph([lambda w=w: G(w, d) for w in ws])
                r["popc_gemm_us"] = time_graph([lambda w=w: (popc(a, k, k, -2, row), G(w, d)) for w in ws])
                r["popc_gemm_pdl_us"] = time_graph([lambda w=w: (popc(a, k, k, -2, row), G(w, d, True)) for w in ws])
                r["gemm_pdl_us"] = time_graph([lambda w=w: G(w, d, True) for w in ws])
                r["thin_popc_gemm_pdl_us"] = time_graph(
                    [lambda w=w: (popc_thin(a, k, k, -2, row), G(w, d, True)) for w in ws])
                best = min(r["popc_gemm_us"], r["popc_gemm_pdl_us"])
                r["speedup_best"] = cublas / best
                r["pct_peak_gemm"] = 100 * 2.0 * m * n * k / (r["gemm_us"] * 1e-6) / 15.9e15
            except Exception as e:  # noqa: BLE001
                r["error"] = str(e)
            rows.append(r)
            print(json.dumps(r), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants")
    ap.add_argument("--shapes", default="4096x4096x4096,8192x8192x8192,4096x4096x1024,4096x4096x16384,1024x4096x4096")
    ap.add_argument("--json")
    ap.add_argument("--nocheck", action="store_true")
    ap.add_argument("--profile", help="v:MxNxK,... : two launches of each (for ncu), nothing timed")
    ap.add_argument("--bandwidth", action="store_true", help="time fill_ / copy_ of bf16 outputs")
    args = ap.parse_args()
    if args.profile:
        for item in args.profile.split(","):
            v, shp = item.split(":")
            m, n, k = (int(x) for x in shp.split("x"))
            a = torch.randint(0, 256, (m, k // 8), dtype=torch.uint8, device="cuda")
            w = torch.randint(0, 256, (n, k // 8), dtype=torch.uint8, device="cuda")
            row = torch.zeros(m, dtype=torch.int32, device="cuda")
            col = torch.zeros(n, dtype=torch.int32, device="cuda")
            s2 = torch.ones(n, device="cuda")
            d = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            G = Gemm(int(v), a, n, k, row, col, s2)
            G(w, d)
            G(w, d)
            torch.cuda.synchronize()
        return
    if args.bandwidth:
        for mb in (32, 128):
            n = mb * 2 ** 20 // 2
            pool = [torch.empty(n, dtype=torch.bfloat16, device="cuda") for _ in range(max(2, 512 // mb))]
            src = torch.randn(n, device="cuda").bfloat16()
            tf = time_graph([lambda t=t: t.fill_(1.0) for t in pool])
            tc = time_graph([lambda t=t: t.copy_(src) for t in pool])
            print(json.dumps(dict(mb=mb, fill_us=tf, fill_tbs=mb * 2 ** 20 / tf / 1e6,
                                  copy_us=tc, copy_write_tbs=mb * 2 ** 20 / tc / 1e6)), flush=True)
        return
    vs = [int(v) for v in args.variants.split(",")] if args.variants else variants()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    res = dict(device=torch.cuda.get_device_name(), variants={v: NAMES.get(v) for v in vs})
    for v in vs:
        if hasattr(LIB, f"bwc_smem_{v}"):
            res[f"smem_{v}"] = (getattr(LIB, f"bwc_smem_{v}")(), getattr(LIB, f"bwc_stages_{v}")())
            print(f"variant {v}: dynamic shared memory {res[f'smem_{v}'][0]} B, {res[f'smem_{v}'][1]} stages")
    if not args.nocheck:
        res["check"] = check(vs)
    warm_gpu(2.0)
    res["bench"] = []
    bench(vs, shapes, res["bench"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

"""Drives wql_lab.so (see wql_lab.h): checks each variant against a float32 product, then times it
at few tokens under several stream-K scheduler settings, against bf16 cuBLAS. Timing:
benchmarks/gpu_timing.py (CUDA graphs over > 256 MB of rotated weights).

    python3 benchmarks/lab/wql/wql_lab.py [--variants 0,1] [--ms 16] [--json f]
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
NAMES = {0: "s256x16", 1: "s512x16", 2: "s384x16", 3: "s512x32"}
# (splits, decomposition, reduction): CUTLASS heuristic; split-K 2/3/4; stream-K forced; unordered reduction
MODES = {"heur": (1, 0, 0), "split2": (2, 2, 0), "split3": (3, 2, 0), "split4": (4, 2, 0), "sk": (1, 3, 0),
         "heur_nd": (1, 0, 1)}


class WqArgs(ctypes.Structure):
    _fields_ = [("a", ctypes.c_void_p), ("x", ctypes.c_void_p), ("scale", ctypes.c_void_p),
                ("zero", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("d", ctypes.c_void_p),
                ("n_out", ctypes.c_int), ("tokens", ctypes.c_int), ("k", ctypes.c_int), ("group_size", ctypes.c_int),
                ("ldx", ctypes.c_int64), ("device", ctypes.c_int), ("sm_count", ctypes.c_int),
                ("workspace", ctypes.c_void_p), ("stream", ctypes.c_void_p),
                ("splits", ctypes.c_int), ("decomposition", ctypes.c_int), ("reduction", ctypes.c_int)]


LIB = ctypes.CDLL(os.path.join(HERE, "wql_lab.so"))
SMS = torch.cuda.get_device_properties(0).multi_processor_count
G = 128


def variants():
    return [v for v in range(16) if hasattr(LIB, f"wql_run_{v}")]


def make_weight(n, k, gen=None):
    codes = torch.randint(-8, 8, (n, k), dtype=torch.int8, device="cuda", generator=gen)
    a = torch.empty(n * k // 2, dtype=torch.uint8, device="cuda")
    rc = LIB.wql_reorder(ctypes.c_void_p(codes.data_ptr()), ctypes.c_void_p(a.data_ptr()), n, k, 4,
                         ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    assert rc == 0
    scale = (torch.rand(k // G, n, device="cuda", generator=gen) * 0.02 + 0.005).bfloat16()
    zero = (torch.randn(k // G, n, device="cuda", generator=gen) * 0.05).bfloat16()
    return codes, a, scale, zero


class Call:
    def __init__(self, v, n, k, x, mode):
        self.fn = getattr(LIB, f"wql_run_{v}")
        s, dm, rm = MODES[mode]
        self.args = WqArgs(None, x.data_ptr(), None, None, None, None, n, x.shape[0], k, G, x.stride(0),
                           torch.cuda.current_device(), SMS, None, None, s, dm, rm)
        self.x = x
        self.err = ctypes.create_string_buffer(512)
        ws = ctypes.c_size_t(0)
        rc = self.fn(ctypes.byref(self.args), ctypes.byref(ws), self.err, 512)
        assert rc == 0, self.err.value
        self.ws = torch.empty(max(ws.value, 16), dtype=torch.uint8, device="cuda")
        self.args.workspace = self.ws.data_ptr()

    def __call__(self, a, scale, zero, d):
        self.args.a, self.args.scale, self.args.zero, self.args.d = a.data_ptr(), scale.data_ptr(), zero.data_ptr(), d.data_ptr()
        self.args.stream = torch.cuda.current_stream().cuda_stream
        if self.fn(ctypes.byref(self.args), None, self.err, 512):
            raise RuntimeError(self.err.value.decode())


def check(vs):
    out = []
    gen = torch.Generator(device="cuda").manual_seed(7)
    for (n, k, m) in [(4096, 4096, 16), (1536, 2048, 5), (8192, 1024, 32)]:
        codes, a, scale, zero = make_weight(n, k, gen)
        w = (codes.float() * scale.float().repeat_interleave(G, 0).T + zero.float().repeat_interleave(G, 0).T)
        x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
        ref = x.float() @ w.T
        for v in vs:
            for mode in MODES:
                d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                Call(v, n, k, x, mode)(a, scale, zero, d)
                torch.cuda.synchronize()
                err = ((d.float() - ref).abs().max() / ref.abs().max()).item()
                out.append(dict(variant=v, mode=mode, shape=f"{n}x{k} M={m}", rel_err=err, ok=err < 1e-2))
                if not out[-1]["ok"]:
                    print(out[-1], flush=True)
    print("check:", sum(o["ok"] for o in out), "/", len(out), "ok; max rel err",
          max(o["rel_err"] for o in out), flush=True)
    return out


def bench(vs, ms, modes, rows):
    for (n, k) in [(28672, 8192), (8192, 28672), (4096, 4096)]:
        sets = [make_weight(n, k)[1:] for _ in range(pool_size(n * k // 2, cap=16))]
        for m in ms:
            x = torch.randn(m, k, device="cuda").bfloat16()
            d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            wb = [torch.randn(n, k, device="cuda").bfloat16() for _ in range(2)]
            cublas = time_graph([lambda w=w: F.linear(x, w) for w in wb])
            del wb
            for v in vs:
                for mode in (modes if m == 16 else ["heur"]):
                    r = dict(n=n, k=k, m=m, variant=v, name=NAMES.get(v), mode=mode, cublas_us=cublas)
                    try:
                        c = Call(v, n, k, x, mode)
                        r["us"] = time_graph([lambda s=s: c(*s, d) for s in sets])
                        r["speedup"] = cublas / r["us"]
                        r["tbs"] = (n * k / 2 + 2 * n * k / G * 2) / r["us"] / 1e6
                    except Exception as e:  # noqa: BLE001
                        r["error"] = str(e)[:200]
                    rows.append(r)
                    print(json.dumps(r), flush=True)
        del sets


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants")
    ap.add_argument("--ms", default="16,8,32")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json")
    args = ap.parse_args()
    vs = [int(v) for v in args.variants.split(",")] if args.variants else variants()
    res = dict(device=torch.cuda.get_device_name(), variants={v: NAMES.get(v) for v in vs}, modes=MODES)
    res["check"] = check(vs)
    warm_gpu(2.0)
    res["bench"] = []
    bench(vs, [int(m) for m in args.ms.split(",")], args.modes.split(","), res["bench"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

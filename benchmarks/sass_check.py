"""SASS checks of the bie-backend-cuda kernels (run on the GPU machine on `cuobjdump -sass` of the built library).

    python3 benchmarks/sass_check.py /tmp/all.sass [binary] [wqv] [wqt] [wqm] [dyn]     (default: all five)

binary: every 1-bit GEMM kernel uses the native AND+popc MMA (BMMA / BGMMA), never XOR+popc (emulated on sm_90), no
call and no local memory; wqv / wqt: the skinny and thin weight-only kernels use HMMA and their cp.async / ldmatrix
paths, no call, no local memory; wqm: the many-row wgmma weight-only kernels use wgmma (HGMMA), no call, no local
memory; dyn: the fused per-token GEMV kernels use the int8 MMA (IMMA) on 16-byte weight loads, no local memory
(calls allowed: the IEEE division's special-case subroutines). One line per family says OK or FAIL with the
offending kernels.
"""
from __future__ import annotations

import collections
import re
import sys

OPS = {
    "binary": ("BMMA.168256.AND.POPC", "BMMA.168256.XOR.POPC", "BGMMA.64x256x256.AND.POPC", "XOR.POPC", "CALL",
               "LDSM", "LDGSTS", "LDL", "STL"),
    "wqv": ("HMMA.16816.F32", "LDGSTS.E.BYPASS.128", "LDS.128", "CALL", "LDL", "STL", "I2F", "F2F"),
    "wqt": ("HMMA.16816.F32", "LDGSTS.E.BYPASS.128", "LDSM.16.M88.4", "CALL", "LDL", "STL"),
    "wqm": ("HGMMA", "CALL", "LDL", "STL"),
    # (an op starting with "re:" is a regular expression: 16-byte global loads with any cache qualifiers)
    "dyn": ("IMMA.16832.S8.S8", r"re:LDG\.E\S*\.128", "LDGSTS.E.BYPASS.128", "CALL", "LDL", "STL"),
}
KERNEL = {"binary": "bgemm", "wqv": "wq_skinny_kernel", "wqt": "wq_thin_kernel", "wqm": "wq_rows_kernel",
          "dyn": "dynamic_gemv_kernel"}


def counts(path: str) -> dict:
    """{family: {kernel: Counter(op -> lines)}} over one SASS listing."""
    out = {fam: collections.defaultdict(collections.Counter) for fam in OPS}
    fn = None
    for line in open(path):
        m = re.search(r"Function : (\S+)", line)
        if m:
            fn = m.group(1)
            continue
        if not fn:
            continue
        for fam, key in KERNEL.items():
            if key in fn:
                for op in OPS[fam]:
                    if (re.search(op[3:], line) if op.startswith("re:") else op in line):
                        out[fam][fn][op] += 1
    return out


def report(fam: str, stats: dict) -> str:
    no_local = lambda c: not (c["CALL"] or c["LDL"] or c["STL"])  # noqa: E731
    if fam == "binary":
        for f, c in stats.items():
            print(f, dict(c))
        bad = [f for f, c in stats.items() if not no_local(c) or c["XOR.POPC"]
               or ("wgmma" in f and not c["BGMMA.64x256x256.AND.POPC"])]
        nw = sum(1 for f in stats if "wgmma" in f)
        return "SASS check: " + ("FAIL " + str(bad) if bad else
                                 f"OK (native BMMA / BGMMA AND.POPC, no XOR, no CALL, no local memory in "
                                 f"{len(stats)} binary GEMM kernels, {nw} of them wgmma)")
    if fam == "wqv":
        for f, c in sorted(stats.items()):
            print(f, dict(c))
        bad = [f for f, c in stats.items() if not no_local(c) or not c["HMMA.16816.F32"]
               or not c["LDGSTS.E.BYPASS.128"]]
        return "SASS check (wqv): " + ("FAIL " + str(bad) if bad or not stats else
                                       f"OK ({len(stats)} skinny kernels: HMMA, 16-byte cp.async ring, no CALL, "
                                       "no local memory)")
    if fam == "wqm":
        bad = [f for f, c in stats.items() if not no_local(c) or not c["HGMMA"]]
        return "SASS check (wqm): " + ("FAIL " + str(bad) if bad or not stats else
                                       f"OK ({len(stats)} many-row kernels: HGMMA, no CALL, no local memory)")
    if fam == "dyn":
        for f, c in sorted(stats.items()):
            print(f, dict(c))
        # CALLs are allowed here: the quantization of x needs the IEEE division and reciprocal (__fdiv_rn,
        # __frcp_rn) to be bit-exact, and ptxas puts their special-case paths (and the 64-bit integer divisions of
        # the work split) in subroutines, run per row or per thread, never per weight tile
        # 16-byte weight loads: into registers (LDG.128), or into shared memory by cp.async (LDGSTS, the shared-memory
        # staging variant)
        bad = [f for f, c in stats.items() if c["LDL"] or c["STL"] or not c["IMMA.16832.S8.S8"]
               or not (c[r"re:LDG\.E\S*\.128"] or c["LDGSTS.E.BYPASS.128"])]
        return "SASS check (dyn): " + ("FAIL " + str(bad) if bad or not stats else
                                       f"OK ({len(stats)} fused GEMV kernels: IMMA, 16-byte weight loads, "
                                       "no local memory)")
    bad = [f for f, c in stats.items() if not no_local(c) or not c["HMMA.16816.F32"] or not c["LDSM.16.M88.4"]]
    return "SASS check (wqt): " + ("FAIL " + str(bad) if bad or not stats else
                                   f"OK ({len(stats)} thin kernels: HMMA, LDSM, cp.async ring, no CALL, "
                                   "no local memory)")


def main(argv) -> int:
    fams = argv[2:] or list(OPS)
    stats = counts(argv[1])
    failed = False
    for f in fams:
        line = report(f, stats[f])
        print(line, flush=True)
        failed |= "FAIL" in line
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

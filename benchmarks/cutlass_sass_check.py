"""SASS checks of bie-backend-cutlass's kernel families, on `cuobjdump -sass` of a built library:

    python3 benchmarks/cutlass_sass_check.py <listing.sass> binary|integer|weight_only

binary: every 1-bit GEMM kernel uses the native AND+popc MMA (BMMA.168256 / BGMMA), never XOR+popc (emulated on
sm_90); integer: every GEMM kernel issues IGMMA (no IMMA, i.e. no int4 emulation); weight_only: every GEMM kernel
issues HGMMA. In all: no CALL, no local memory (LDL/STL). Prints one line per kernel, then one line that says OK
or FAIL with the offending kernels (exit status 1 on FAIL).
"""
from __future__ import annotations

import collections
import re
import sys

OPS = {
    "binary": ("BMMA.168256.AND.POPC", "BGMMA", "AND.POPC", "XOR.POPC", "CALL", "LDSM", "LDGSTS", "UTMALDG",
               "UTMASTG", "LDL", "STL"),
    "integer": ("IGMMA", "IMMA", "HGMMA", "HMMA", "CALL", "LDL", "STL", "UTMALDG", "UTMASTG", "I2F"),
    "weight_only": ("HGMMA", "HMMA", "CALL", "LDL", "STL", "UTMALDG", "UTMASTG", "I2F", "PRMT", "LOP3"),
}


def counts(path: str, ops) -> dict:
    """{kernel: Counter(op -> lines)}; substring matches for the 1-bit opcodes, whole-word (or opcode prefix,
    as in IGMMA.64x...) matches for the others."""
    stats = collections.defaultdict(collections.Counter)
    fn = None
    for line in open(path):
        m = re.search(r"Function : (\S+)", line)
        if m:
            fn = m.group(1)
            continue
        if fn is None:
            continue
        for op in ops:
            if "." in op or "POPC" in op or op == "BGMMA":
                hit = op in line
            else:
                hit = re.search(r"\b" + op + r"\b", line) is not None
            if hit:
                stats[fn][op] += 1
        m = re.search(r"BGMMA\.\S+", line)
        if m:
            stats[fn]["form " + m.group(0)] += 1
    return stats


def check(path: str, family: str) -> bool:
    stats = counts(path, OPS[family])
    local = ("CALL", "LDL", "STL")
    if family == "binary":
        ks = {f: c for f, c in stats.items() if c["BMMA.168256.AND.POPC"] or c["XOR.POPC"] or c["BGMMA"]}
        bad = [f for f, c in ks.items() if c["XOR.POPC"] or any(c[o] for o in local)]
        wg = [f for f, c in ks.items() if c["BGMMA"] and c["AND.POPC"] >= c["BGMMA"]]
        head = f"SASS check: {len(ks)} 1-bit GEMM kernels ({len(wg)} wgmma BGMMA .AND.POPC);"
        ok = "OK (native BMMA.168256.AND.POPC / BGMMA.64xNx256.AND.POPC, no CALL, no XOR.POPC, no local memory)"
    else:
        ks = {f: c for f, c in stats.items() if "GemmUniversal" in f or "device_kernel" in f}
        need = "IGMMA" if family == "integer" else "HGMMA"
        bad = [f for f, c in ks.items() if not c[need] or c["IMMA"] or any(c[o] for o in local)]
        head = f"{len(ks)} GEMM kernels; SASS check:"
        ok = (f"OK ({need} in every GEMM kernel; " + ("no IMMA/int4 emulation, " if family == "integer" else "")
              + "no CALL, no local memory)")
    for f, c in ks.items():
        print(f[:110], dict(c))
    good = bool(ks) and not bad
    print(head, ok if good else "FAIL " + str([b[:80] for b in bad] or "no kernels found"))
    return good


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in OPS:
        sys.exit(__doc__)
    sys.exit(0 if check(sys.argv[1], sys.argv[2]) else 1)

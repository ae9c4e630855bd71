"""Instructions per ring stage of the thin kernels (wqt), from their SASS: compile-time only, no GPU.

Splits each wqt kernel at its cp.async waits (DEPBAR) and counts the instructions of every segment that holds mma
instructions, up to the first shared store or barrier (the finish-item code that can follow a stage), with the
opcode histogram. Session 10 used it for the one-row variant (2-bit g64: 263 -> 185 fp16 / 192 bf16 per stage).

    nvcc -arch=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -cubin -o /tmp/w2.cubin \\
         backend_cuda/bie_backend_cuda/csrc/wq_thin_w2_bf16.cu
    python3 benchmarks/lab/sass_stage_count.py /tmp/w2.cubin "2, __nv_bfloat16, true, false, 1, 4, true"

The second argument selects the template arguments (BITS, T, GPTQ, SBF, MX, FS, ONE) as c++filt prints them; without
it every wqt kernel's first stage is listed. Needs cuobjdump (and nvdisasm) and c++filt on PATH (on a machine
without the CUDA toolkit's binaries: the pip wheels nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm carry them).
"""
from __future__ import annotations

import collections
import re
import subprocess
import sys

INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def stages(func_text: str):
    lines = [ln for ln in func_text.split("\n") if INSN.search(ln)]
    seg, out = None, []
    for ln in lines:
        if "DEPBAR" in ln:
            if seg:
                out.append(seg)
            seg = []
        if seg is not None:
            seg.append(ln)
    if seg:
        out.append(seg)
    for s in out:
        if not any("HMMA" in ln for ln in s):
            continue
        cut = next((i for i, ln in enumerate(s) if " STS" in ln or "BAR.SYNC" in ln), len(s))
        yield cut, collections.Counter(INSN.search(ln).group(2) for ln in s[:cut])


def main():
    sass = subprocess.run(["cuobjdump", "-sass", sys.argv[1]], capture_output=True, text=True, check=True).stdout
    want = sys.argv[2] if len(sys.argv) > 2 else None
    for f in re.split(r"\n\s+Function : ", sass)[1:]:
        name = subprocess.run(["c++filt"], input=f.split("\n", 1)[0], capture_output=True, text=True).stdout.strip()
        m = re.search(r"wqt_kernel<(.*)>", name)
        if not m or (want and m.group(1) != want):
            continue
        for i, (n, hist) in enumerate(stages(f)):
            top = ", ".join(f"{k} {v}" for k, v in hist.most_common(8))
            print(f"<{m.group(1)}> stage {i}: {n} instructions ({top})")
            if not want:
                break


if __name__ == "__main__":
    main()

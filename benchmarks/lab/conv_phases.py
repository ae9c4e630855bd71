"""Lab: where a block of the direct binary conv kernel spends its time. Needs bie-backend-cuda built with
BIE_CUDA_DEFINES=BIE_CONV_PHASES (thread 0 of each block prints clock64 at the phase boundaries, and the global
timer at its end).
    python conv_phases.py run C HW [cl]   > log     (3 warm-up calls, then MEASURE and one call)
    python conv_phases.py show log"""
import os
import statistics
import sys

if sys.argv[1] == "run":
    import torch
    from bie_backend_cuda import binary as cb
    c, hw = int(sys.argv[2]), int(sys.argv[3])
    x = torch.randn(64, c, hw, hw, device="cuda", dtype=torch.bfloat16)
    if len(sys.argv) > 4:
        x = x.contiguous(memory_format=torch.channels_last)
    wb = torch.randint(0, 256, (c, c * 9 // 8), dtype=torch.uint8, device="cuda")
    p = cb.prepare_conv(wb)
    scale = torch.rand(c, device="cuda")
    args = ([3, 3], [1, 1], [1, 1], [1, 1], 1, -1.0, scale, None, torch.bfloat16)
    for _ in range(3):
        cb.binary_conv2d(x, wb, *args, prepared=p)
    torch.cuda.synchronize()
    sys.stdout.flush()
    os.write(1, b"MEASURE\n")
    cb.binary_conv2d(x, wb, *args, prepared=p)
    torch.cuda.synchronize()
else:
    lines = open(sys.argv[2]).read().split("MEASURE")[-1].splitlines()
    rows = [list(map(int, l.split()[1:])) for l in lines if l.startswith("PH ")]
    names = ["tables", "wait data", "main loop", "staging", "store"]
    d = {n: [r[5 + i] - r[4 + i] for r in rows] for i, n in enumerate(names)}
    tot = [r[9] - r[4] for r in rows]
    print(f"{len(rows)} blocks; cycles per block (median / max):", ", ".join(
        f"{n} {statistics.median(v):.0f}/{max(v)}" for n, v in d.items()), f"| total {statistics.median(tot):.0f}/{max(tot)}")
    ends = sorted(r[3] for r in rows)
    print(f"block end times (globaltimer, ns after the first): median {ends[len(ends) // 2] - ends[0]}, "
          f"last {ends[-1] - ends[0]}")
    per_sm = {}
    for r in rows:
        per_sm.setdefault(r[2], []).append(r)
    print("blocks per SM:", sorted(set(len(v) for v in per_sm.values())))

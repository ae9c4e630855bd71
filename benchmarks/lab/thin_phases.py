"""Lab (session 20, not yet run): where a block of bie-backend-cuda's thin weight-only kernel spends its time at
5-16 rows (x staged per K slice). Needs bie-backend-cuda built with BIE_CUDA_DEFINES=BIE_WQT_PHASES (thread 0 of
each block prints clock64 deltas between: entry, first ring stages issued, griddepcontrol.wait returned, x staged,
loop done; plus the global timer at entry and end).
    python thin_phases.py run MxNxKxBITSxGS [n]   > log    (3 warm-up calls, then MEASURE and n calls back to back)
    python thin_phases.py show log
Why: at 16 rows the block stages its K slice of x (112-128 KiB on the big layers) before its first MMA; if that
phase is a large part of a call, pipelining x with the codes is the next change for #6's W4 M = 16 target."""
import os
import statistics
import sys

if sys.argv[1] == "run":
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from bench_cuda import _wq_pool
    m, n, k, bits, gs = (int(v) for v in sys.argv[2].split("x"))
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    if "BIE_LAB_XPRE" in os.environ:   # (session 26: a forced way of staging x, cw.THIN_XPRE)
        from bie_backend_cuda import weight_only as cw
        cw.THIN_XPRE = int(os.environ["BIE_LAB_XPRE"])
    gen = torch.Generator(device="cuda").manual_seed(20)
    _, _, _, fns = _wq_pool(m, n, k, bits, gs, gen)
    for i in range(3):
        fns[i % len(fns)]()
    torch.cuda.synchronize()
    sys.stdout.flush()
    os.write(1, b"MEASURE\n")
    for i in range(reps):
        fns[i % len(fns)]()
    torch.cuda.synchronize()
else:
    lines = open(sys.argv[2]).read().split("MEASURE")[-1].splitlines()
    rows = [list(map(int, l.split()[1:])) for l in lines if l.startswith("PH ")]
    names = ["issue first stages", "wait previous kernel", "stage x + sums", "main loop",
             "of which the first chunk of x (xpre -3)"][:len(rows[0]) - 4]
    t0 = min(r[2] for r in rows)
    print(f"{len(rows)} blocks; cycles per block (median / max):",
          ", ".join(f"{nm} {statistics.median(r[4 + i] for r in rows):.0f}/{max(r[4 + i] for r in rows)}"
                    for i, nm in enumerate(names)))
    print(f"block entry (ns after the first): median {statistics.median(r[2] - t0 for r in rows):.0f}, "
          f"last {max(r[2] - t0 for r in rows)}; block end: median {statistics.median(r[3] - t0 for r in rows):.0f}, "
          f"last {max(r[3] - t0 for r in rows)}")

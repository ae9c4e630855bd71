"""Lab (session 23): sum the warp-stall samples of `ncu --page source --csv --print-source sass` output over the
code regions of the wgmma binary GEMM, told apart by their instructions: the math warps' main loop (from the
first BGMMA's WARPGROUP.ARRIVE to the WARPGROUP.DEPBAR that retires the previous stage), the epilogue (the
conversion: I2FP / F2FP / STSM and what lies between them), and everything else (producer, column and store warps,
waits). Also the stall reasons summed per region.
python benchmarks/lab/ncu_regions.py bw_src.csv"""
import collections
import csv
import sys

rows = list(csv.reader(open(sys.argv[1])))
hdr_i = next(i for i, r in enumerate(rows) if any("Source" in c for c in r) and len(r) > 5)
hdr = rows[hdr_i]
body = [r for r in rows[hdr_i + 1:] if len(r) == len(hdr)]
src = next(i for i, h in enumerate(hdr) if h.strip() == "Source")
samp = next(i for i, h in enumerate(hdr) if h.strip() in ("Warp Stall Sampling (All Samples)",
                                                           "Warp Stall Sampling (All Cycles)"))
stall_cols = [i for i, h in enumerate(hdr) if h.startswith("stall_")]


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


first_conv = next((i for i, r in enumerate(body) if "I2FP" in r[src] or "F2FP" in r[src]), None)
last_conv = max((i for i, r in enumerate(body) if "I2FP" in r[src] or "F2FP" in r[src] or "STSM" in r[src]),
                default=None)
region = []
state = "other"
for i, r in enumerate(body):
    s = r[src]
    if "WARPGROUP.ARRIVE" in s:
        state = "mainloop"
    if first_conv is not None and first_conv - 40 <= i <= last_conv:
        region.append("epilogue")
        continue
    region.append(state)
    if "WARPGROUP.DEPBAR" in s and state == "mainloop":
        state = "other"
tot = sum(num(r[samp]) for r in body) or 1.0
by = collections.Counter()
reasons = collections.defaultdict(collections.Counter)
for reg, r in zip(region, body):
    by[reg] += num(r[samp])
    for c in stall_cols:
        reasons[reg][hdr[c]] += num(r[c])
for reg, v in by.most_common():
    top = ", ".join(f"{k} {n / max(v, 1):.0%}" for k, n in reasons[reg].most_common(5) if n > 0)
    print(f"{reg:9s} {v / tot:6.1%}  ({top})")

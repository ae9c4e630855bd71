"""Lab: read `ncu --page source --csv --print-source sass` output and print the SASS lines with the most
warp-stall samples (and the columns that hold them)."""
import csv
import sys

rows = list(csv.reader(open(sys.argv[1])))
hdr_i = next(i for i, r in enumerate(rows) if any("Source" == c or "Source" in c for c in r) and len(r) > 5)
hdr = rows[hdr_i]
body = [r for r in rows[hdr_i + 1:] if len(r) == len(hdr)]
def col(name):
    for i, h in enumerate(hdr):
        if h.strip() == name:
            return i
    return None
src = col("Source")
samp = col("Warp Stall Sampling (All Samples)") or col("Warp Stall Sampling (All Cycles)")
print("columns:", [h for h in hdr][:40])
if samp is None:
    sys.exit("no sampling column")
def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0
tot = sum(num(r[samp]) for r in body)
stall_cols = [i for i, h in enumerate(hdr) if h.startswith("stall_") or "Stall" in h]
for r in sorted(body, key=lambda r: -num(r[samp]))[:int(sys.argv[2]) if len(sys.argv) > 2 else 30]:
    extra = {hdr[i]: r[i] for i in stall_cols if num(r[i]) > 0.05 * num(r[samp]) and i != samp}
    print(f"{num(r[samp]) / tot:6.1%}  {r[src][:90]:90s} {extra}")

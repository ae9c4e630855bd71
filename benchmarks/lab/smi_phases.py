"""Lab (session 32): joins wqm_power.py's phase stamps with a background nvidia-smi log (timestamp, clocks.sm,
power.draw, ...): the mean SM clock and power of every timed phase.

    python3 benchmarks/lab/smi_phases.py wqm_power.txt smi.csv
"""
import datetime
import re
import statistics
import sys

#: the nvidia-smi fields read_samples expects, in this order (after --query-gpu=)
SMI_FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"


def read_samples(path):
    """(unix time, SM clock MHz, power W, clock-event reasons) of each line of an `nvidia-smi --query-gpu=SMI_FIELDS
    --format=csv,noheader[,nounits]` log (timestamps are UTC)."""
    samples = []
    for line in open(path):
        f = [v.strip() for v in line.split(",")]
        try:
            t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc).timestamp()
            samples.append((t, float(f[1].split()[0]), float(f[2].split()[0]), f[4] if len(f) > 4 else ""))
        except (ValueError, IndexError):
            continue
    return samples


def main():
    samples = read_samples(sys.argv[2])
    pat = re.compile(r"phase (\S+) M=(\d+) (\S+) round (\d+) ([\d.]+)-([\d.]+) med ([\d.]+) min ([\d.]+) max ([\d.]+)")
    for line in open(sys.argv[1]):
        m = pat.search(line)
        if not m:
            if not line.startswith("  "):
                print(line.rstrip())
            continue
        shape, rows, name, rnd, t0, t1, med, mn, mx = m.groups()
        t0, t1 = float(t0), float(t1)
        inside = [s for s in samples if t0 + 0.05 <= s[0] <= t1]
        clk = statistics.mean(s[1] for s in inside) if inside else float("nan")
        pw = statistics.mean(s[2] for s in inside) if inside else float("nan")
        reasons = sorted({s[3] for s in inside})
        print(f"{shape} M={rows} {name:5s} r{rnd} {med:>7s} us [{mn}-{mx}]  {clk:6.0f} MHz {pw:5.0f} W  n={len(inside)} "
              f"{' '.join(reasons)}")


if __name__ == "__main__":
    main()

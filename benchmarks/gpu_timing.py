"""Timing shared by the GPU benchmarks (bench_cuda, bench_cutlass_binary, bench_cutlass_integer, bench_qat_conv).

Each measured call is captured in a CUDA graph together with CALLS - 1 more calls that rotate over
a pool of distinct weight (or input) sets larger than the L2, so operands stream from memory as in a
model; the graph is replayed and timed with CUDA events; the figure is the median replay / CALLS.
"""
from __future__ import annotations

import math
import statistics

import torch

#: total bytes of the rotated operand sets (> 5x the H100's 50 MB L2)
POOL_BYTES = 256 * 2 ** 20
#: calls captured per graph
CALLS = 32
#: untimed replays of each graph before the timed ones
WARM_REPLAYS = 10


def pool_size(bytes_per_set: int, cap: int = 64) -> int:
    """How many distinct operand sets make up POOL_BYTES (at least 2, at most ``cap``)."""
    return max(2, min(cap, math.ceil(POOL_BYTES / max(1, bytes_per_set))))


def warm_gpu(seconds: float = 1.0) -> None:
    """Busy the GPU for a while before timing: an idle GPU starts at low clocks (345 MHz on the H100), and the first
    graphs timed while it ramps up read slow."""
    import time
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t0 = time.time()
    while time.time() - t0 < seconds:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def capture_graph(fns, calls: int = CALLS):
    """A CUDA graph of ``calls`` calls cycling through fns (zero-arg callables, one per weight / input set), after one
    eager call of each (builds, prepares, tunes, allocates) and one eager pass of the sequence on a side stream."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    seq = [fns[i % len(fns)] for i in range(calls)]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in seq:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in seq:
            f()
    return g


def replay_us(g, reps: int, calls: int = CALLS) -> list:
    """µs per call of each of `reps` timed replays of a graph from capture_graph (of ``calls`` calls)."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return times


def time_graph(fns, repeats: int = 7, calls: int = CALLS) -> float:
    """µs per call: fns is a list of zero-arg callables (one per weight / input set), ``calls`` of them captured
    (cycling through fns; len(fns) for a sequence captured once, such as a model's chain of layers)."""
    g = capture_graph(fns, calls)
    for _ in range(WARM_REPLAYS):   # (the first replays of a new graph over new weights read slow)
        g.replay()
    torch.cuda.synchronize()
    times = replay_us(g, repeats, calls)
    del g
    return statistics.median(times)


def time_interleaved(variants: dict, rounds: int = 5, phase_s: float = 0.3) -> dict:
    """Compute-bound comparisons at the card's steady power state: {name: fns} -> {name: µs per call, one per round}.

    A dense GEMM of 1024+ rows holds the H100 at its 700 W cap (SM clock 1.3-1.5 GHz instead of 1.98;
    benchmarks/results/cuda_h100.md): a baseline timed alone, first, on a card still below the cap reads fast, so
    single timings of one case move by several percent between calls. Here each variant's graph (CALLS calls over its pool)
    is captured once, then every round replays each variant in turn for about `phase_s` seconds (the median replay
    is that round's figure). A first, untimed round brings the card to the cap; callers compare variants round by
    round (the ratios of one round share its power state)."""
    graphs = {name: capture_graph(fns) for name, fns in variants.items()}
    reps = {}
    for name, g in graphs.items():   # replays per phase, from one timed replay after an untimed one
        g.replay()
        torch.cuda.synchronize()
        once_ms = replay_us(g, 1)[0] * CALLS / 1000.0
        reps[name] = max(3, min(200, int(phase_s * 1000.0 / max(once_ms, 1e-3))))
    out = {name: [] for name in graphs}
    for r in range(rounds + 1):
        for name, g in graphs.items():
            times = replay_us(g, reps[name])
            if r > 0:
                out[name].append(statistics.median(times))
    del graphs
    return out


def time_eager(fn, iters: int = 10, repeats: int = 5) -> float:
    """µs per eager call: CUDA events around `iters` calls after three warm-up calls, median of `repeats`
    (launch and host time included, unlike the graph replays above)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / iters)
    return statistics.median(times)


def issue_us(fn, x, calls: int = 300) -> float:
    """Host time, µs per call, to issue ``calls`` eager calls ``fn(x)``: synchronized before and after, not inside,
    so that the GPU's own time is left out while the host stays ahead of it."""
    import time
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn(x)
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return dt / calls * 1e6


def host_against(layer, twin, x, rounds: int = 9) -> tuple:
    """Host time to issue eager calls of ``layer`` and of its float ``twin`` on x, in alternating rounds (the host's
    speed drifts): (fastest µs of the layer, fastest of the twin, median of the rounds' ratios)."""
    hs, ht = [], []
    for _ in range(rounds):
        hs.append(issue_us(layer, x))
        ht.append(issue_us(twin, x))
    return min(hs), min(ht), statistics.median(p / q for p, q in zip(hs, ht))


def run_meta(**extra) -> dict:
    """What a GPU results page records about the run: device, SM count, torch and CUDA versions, UTC date and the
    commit measured (bench_env.git_commit), plus any extra fields."""
    import datetime

    from bench_env import git_commit
    p = torch.cuda.get_device_properties(0)
    return dict(device=p.name, sms=p.multi_processor_count, torch=torch.__version__, cuda=torch.version.cuda,
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                commit=git_commit(), **extra)


def write_json(path, meta: dict, rows: list) -> None:
    """Write {meta, rows} to path (nothing when path is empty)."""
    if path:
        import json
        with open(path, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)

"""Per-GPU choice of kernel configuration, timed once and cached on disk.

No GPU tables are hard-coded: for a (op, problem bucket) the family module
offers its candidate configurations, each as a callable that runs the kernel on
the real arguments. The first time a bucket is seen on a GPU, every candidate
is timed with CUDA events — interleaved rounds, the median, the L2 flushed
before each sample (a candidate that raises is skipped) — and the fastest is stored in ``<cache>/tuning/<gpu key>.json``
with the names it was chosen among; later calls and later processes read it, and a bucket whose candidate set
changed (a configuration added in an upgrade) is tuned again. The GPU key is the device name, compute capability, SM count and this
backend's version, so a different GPU (or driver-visible variant) tunes afresh.

Tuning synchronises the device, so it never runs where that would be wrong or
surprising: while a CUDA graph is being captured, or when ``BIE_CUTLASS_TUNE=0``.
There the default candidate (the first one) is used, and nothing is stored.
``python -m bie_backend_cutlass.tuning --show`` prints the cache.
"""
from __future__ import annotations

import functools
import json
import os
import re
import statistics
import threading
from pathlib import Path
from typing import Callable, Sequence

import torch

from . import __version__, _build

_lock = threading.Lock()
_tables: dict[str, dict] = {}


def enabled() -> bool:
    return os.environ.get("BIE_CUTLASS_TUNE", "1") != "0"


def sm_count(device=None) -> int:
    """Streaming multiprocessors of ``device`` (a torch.device; None or no index: the current one)."""
    index = getattr(device, "index", None)
    return _sm_count(index if index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def gpu_key(device=None) -> str:
    if isinstance(device, int):
        index = device
    else:
        index = getattr(device, "index", None)
        if index is None:
            index = torch.cuda.current_device()
    return _gpu_key(index)


@functools.lru_cache(maxsize=None)
def _gpu_key(index: int) -> str:
    # cached: every tuned launch looks its table up, and reading the device properties and formatting the
    # name on every call would add host time to each launch
    p = torch.cuda.get_device_properties(index)
    name = re.sub(r"[^A-Za-z0-9]+", "_", p.name).strip("_")
    return f"{name}-sm{p.major}{p.minor}-{p.multi_processor_count}sm-v{__version__}"


def bucket(v: int) -> int:
    """``v`` (a problem dimension) rounded up to a quarter octave: 1, 2, 4, 8, 16, 20, 24, 28, 32, 40, ..., 256, 320,
    384, 448, 512, 640, ... A configuration is tuned once per bucket and reused for every size in it, and the best
    tile changes within an octave: how full the last wave of tiles is moves with the size (a weight-only GEMM of
    4096 x 14336 tuned at 384 rows kept 128 x 128 tiles, which took 110-116 us at 512 rows against 94-104 for
    128 x 256). Power-of-two buckets made the choice depend on which size a process happened to meet first."""
    v = int(v)
    if v <= 16:
        return 1 << max(0, (v - 1).bit_length())
    step = 1 << ((v - 1).bit_length() - 3)
    return -(-v // step) * step


def table_path(device=None) -> Path:
    return _build.cache_root() / "tuning" / f"{gpu_key(device)}.json"


#: (GPU key, the environment that places the cache) -> (table path, its text): an unbound CUTLASS call (a training
#: step's GEMM on codes made that step) looks its table up on every call, and building the path anew each time cost
#: more host time than the rest of the lookup
_paths: dict = {}


def _table(device) -> tuple[dict, Path]:
    gk, env = gpu_key(device), os.environ
    where = (gk, env.get("BIE_CUTLASS_CACHE"), env.get("XDG_CACHE_HOME"), env.get("HOME"))
    known = _paths.get(where)
    if known is None:
        path = table_path(device)
        known = _paths[where] = (path, str(path))
    path, key = known
    table = _tables.get(key)
    if table is None:
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            table = {}
        _tables[key] = table
    return table, path


def _save(table: dict, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
        os.replace(tmp, path)  # atomic: concurrent processes never read half a file
    except OSError:
        pass  # a read-only cache only costs re-tuning in the next process


def _capturing() -> bool:
    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except RuntimeError:  # a torch without CUDA
        return False


#: GPU cycles the stream is held before a sample (about 1 ms): the host queues the sample's calls
#: meanwhile, so the events time the GPU's work, not the host's launch path — otherwise a
#: configuration with a longer Python wrapper loses on small shapes it runs faster on the GPU
HOLD_CYCLES = 2_000_000


def _time(fn: Callable[[], object], reps: int) -> float:
    """Milliseconds of GPU time per call of ``reps`` back-to-back calls, by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    try:
        torch.cuda._sleep(HOLD_CYCLES)
    except Exception:  # noqa: BLE001 - without the hold the timing includes launch gaps
        pass
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def _flusher(device):
    """A buffer twice the GPU's L2: writing it before a sample evicts the operands, so
    candidates are compared as they run in a model (weights streamed from memory), not
    on an L2-resident weight that favours different tiles."""
    try:
        l2 = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device()).L2_cache_size
        return torch.empty(max(2 * int(l2), 1 << 20), dtype=torch.uint8, device=device or "cuda")
    except Exception:  # noqa: BLE001 - no flushing is only less faithful
        return None


def _flush(buf) -> None:
    if buf is not None:
        buf.zero_()


#: samples per candidate; candidates are sampled in interleaved rounds and ranked by their
#: median, so a clock or thermal drift during tuning does not favour the first or the last
ROUNDS = 7
#: a sample repeats a call until about this long (ms; at most 16 calls, well inside the hold)
SAMPLE_MS = 0.02
#: the default (first) candidate is kept unless another is faster by more than this fraction: medians of
#: 7 one-call samples differ by about 2% between equal kernels, so a closer win is noise and would make the
#: choice flip between processes
KEEP_DEFAULT = 0.02


def measure(candidates: Sequence[tuple[str, Callable[[], object]]], device=None,
            rounds: int = ROUNDS) -> dict[str, float]:
    """Median ms per call of every candidate that runs (one that raises is left out)."""
    alive = []
    for name, fn in candidates:
        try:
            fn()  # warm-up: first-launch costs, and a config that cannot run this shape raises here
            t = _time(fn, 1)
        except Exception:  # noqa: BLE001 - a config that cannot run this shape is skipped
            continue
        reps = 1 if t >= SAMPLE_MS else min(16, int(SAMPLE_MS / max(t, 1e-6)) + 1)
        alive.append((name, fn, reps))
    buf = _flusher(device) if alive else None
    samples: dict[str, list] = {name: [] for name, _, _ in alive}
    for _ in range(rounds):
        for name, fn, reps in alive:
            _flush(buf)
            samples[name].append(_time(fn, reps))
    del buf
    return {name: statistics.median(v) for name, v in samples.items()}


def choose(op: str, bucket: str, candidates: Sequence[tuple[str, Callable[[], object]]],
           device=None) -> str:
    """Name of the fastest candidate for (op, bucket) on this GPU.

    ``candidates``: (config name, zero-argument callable running it). The first
    is the default, used untimed when tuning is off or impossible (and when no
    candidate runs). Returns a name that is in ``candidates`` (a stale cached
    name is re-tuned).
    """
    names = [n for n, _ in candidates]
    if not names:
        raise ValueError(f"tuning {op}: no candidate configurations")
    if len(names) == 1:
        return names[0]
    table, path = _table(device)
    entry = f"{op}/{bucket}"
    hit = _cached(table.get(entry), names)
    if hit is not None:
        return hit
    if not enabled() or _capturing():
        return names[0]
    with _lock:
        hit = _cached(table.get(entry), names)
        if hit is not None:
            return hit
        times = measure(candidates, device)
        best = min(times, key=times.get) if times else names[0]
        if names[0] in times and times[names[0]] <= (1 + KEEP_DEFAULT) * times[best]:
            best = names[0]   # within the noise of the fastest: the default stays (no flip-flop between runs)
        table[entry] = {"best": best, "candidates": sorted(names),
                        "us": {n: round(1000 * t, 2) for n, t in sorted(times.items(), key=lambda kv: kv[1])}}
        _save(table, path)
        return best


def _cached(stored, names) -> str | None:
    """The stored winner if it was chosen among exactly these candidates: a bucket tuned before a
    configuration was added (or removed) is tuned again, so new kernels get timed after an upgrade."""
    if isinstance(stored, dict) and stored.get("candidates") == sorted(names) and stored.get("best") in names:
        return stored["best"]
    return None


def clear(device=None) -> None:
    """Forget the tuning results of this GPU (memory and disk)."""
    path = table_path(device)
    _tables.pop(str(path), None)
    try:
        path.unlink()
    except OSError:
        pass


def _main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description="bie-backend-cutlass tuning cache")
    ap.add_argument("--show", action="store_true", help="print this GPU's tuning table")
    ap.add_argument("--clear", action="store_true", help="forget this GPU's tuning table")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bie-backend-cutlass tuning: no CUDA device here, so no tuning table (tables are per GPU)")
        return 1
    if args.clear:
        clear()
    table, path = _table(None)
    print(f"{path}:")
    for k, v in sorted(table.items()):
        best = v.get("best") if isinstance(v, dict) else v
        n = len(v.get("candidates", ())) if isinstance(v, dict) else "?"
        us = v.get("us") if isinstance(v, dict) else None
        print(f"  {k}: {best} (of {n})" + (" " + ", ".join(f"{c} {t} us" for c, t in us.items()) if us else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())

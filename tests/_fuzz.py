"""A seeded generator of careless and hostile calls to every bie op and layer,
and the worker process that runs them (used by tests/test_fuzz.py).

Each case is a function of (seed, index) alone, so any case can be replayed:
``python tests/_fuzz.py --mode native --seed S --start I --count 1 -v``.

Op cases start from a valid call (the first conformance cases of the op, kept
small) and apply 0-2 mutations chosen from the op's schema: another dtype,
shape, an empty or stride-0 tensor, NaN/inf or out-of-range values, dirty
padding bits, the meta device, a wrong Python type, zero/negative/huge
integers, unknown strings. Layer cases build every public layer with careless
arguments and feed it careless inputs, pack it and reload its state.

Every case ends in one of:

* ``ok``: it ran; for an op the output equals the plain-PyTorch reference
  (bit for bit for integer outputs; NaN and inf where the reference has them,
  finite values within a relative tolerance);
* ``clear``: a Python exception of an expected type whose message names the
  op or layer (and, for a mutated argument, that argument or its value);
* ``unclear``: any other exception;
* ``mismatch``: it ran but disagrees with the reference;
* ``refused``: an unmutated, valid call raised;
* ``crash``: the process died (detected by the parent, which restarts the
  worker after the case).

Modes: ``auto`` (automatic selection), ``native`` (``use_backend("cpu")``
with the native CPU kernels), ``reference`` (``use_backend("cpu")`` with
``BIE_CPU_NATIVE=0``), ``mlx`` (``use_backend("mlx")``).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import sys
import time
import traceback
import warnings

MODES = ("auto", "native", "reference", "mlx")

# Exception types a careless call may get (everything else is unclear).
CLEAR_TYPES = ("ValueError", "TypeError", "IndexError", "MemoryError", "NoKernelError", "UnknownBackendError",
               "BackendUnavailableError", "CheckpointError", "NotImplementedError", "RuntimeError")

MAX_ELEMENTS = 1 << 16   # baseline cases larger than this are not used (speed)


# ------------------------------------------------------------------ baselines
def _small(args) -> bool:
    import torch
    return all(a.numel() <= MAX_ELEMENTS for a in args if isinstance(a, torch.Tensor))


_BASE: dict = {}


def baselines(op):
    """Valid argument tuples of ``op``: its first small conformance cases."""
    import torch
    if op.name not in _BASE:
        gen = torch.Generator().manual_seed(1234)
        out = []
        for case in itertools.islice(op.cases(torch.device("cpu"), gen), 60):
            if case.expect_error is None and _small(case.args):
                out.append((case.args, case.tol))
            if len(out) >= 12:
                break
        _BASE[op.name] = out
    return _BASE[op.name]


# ------------------------------------------------------------------ mutations
def _arg_types(op):
    from bie_core.ops._opdef import _arg_types as schema_types
    out = []
    for t in schema_types(op.schema):      # as written in the schema: ScalarType stays ScalarType
        base = t.rstrip("?")
        out.append(f"List[{base[:base.index('[')]}]" if base.endswith("]") else
                   f"Optional[{base}]" if t.endswith("?") else base)
    return out


DTYPES = None


def _dtypes():
    import torch
    global DTYPES
    if DTYPES is None:
        DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
                  torch.int16, torch.int32, torch.int64, torch.bool]
    return DTYPES


def _mutate_tensor(t, rng):
    import torch
    kind = rng.choice(["dtype", "drop_dim", "add_dim", "resize", "empty", "stride0", "noncontig", "nan", "inf",
                       "extreme", "neg", "huge_index", "dirty", "meta", "not_tensor", "big_values", "transpose"])
    if kind == "dtype":
        return kind, t.to(rng.choice(_dtypes())) if t.dtype != torch.bool else t.to(torch.float32)
    if kind == "drop_dim":
        return kind, t.reshape(-1) if t.dim() > 1 else t.reshape(())[()] if t.numel() == 1 else t[:0].reshape(0)
    if kind == "add_dim":
        return kind, t.unsqueeze(rng.randrange(t.dim() + 1))
    if kind == "resize" and t.dim():
        d = rng.randrange(t.dim())
        n = max(0, t.shape[d] + rng.choice([-1, 1, 2, 7]))
        shape = list(t.shape)
        shape[d] = n
        return kind, _fill(torch.empty(shape, dtype=t.dtype), rng)
    if kind == "empty" and t.dim():
        d = rng.randrange(t.dim())
        return kind, t.narrow(d, 0, 0)
    if kind == "stride0" and t.dim() and t.numel():
        d = rng.randrange(t.dim())
        return kind, t.narrow(d, 0, 1).expand(t.shape)
    if kind == "noncontig" and t.dim() and t.numel():
        d = rng.randrange(t.dim())
        big = torch.cat([t, t], dim=d)
        return kind, big.narrow(d, 0, t.shape[d] * 2)[(slice(None),) * d + (slice(None, None, 2),)]
    if kind == "transpose" and t.dim() >= 2:
        return kind, t.transpose(-1, -2)
    if kind in ("nan", "inf", "big_values") and t.is_floating_point() and t.numel():
        t = t.clone(memory_format=torch.contiguous_format)
        flat = t.view(-1)
        v = {"nan": float("nan"), "inf": rng.choice([float("inf"), -float("inf")]),
             "big_values": rng.choice([3e38, -3e38, 6e4, 1e30])}[kind]
        for _ in range(rng.randint(1, 3)):
            flat[rng.randrange(flat.numel())] = v
        return kind, t
    if kind in ("extreme", "neg", "huge_index") and not t.is_floating_point() and t.dtype != torch.bool and t.numel():
        t = t.clone(memory_format=torch.contiguous_format)
        flat = t.view(-1)
        info = torch.iinfo(t.dtype)
        v = {"extreme": rng.choice([info.min, info.max]), "neg": max(info.min, -1),
             "huge_index": min(info.max, rng.choice([t.shape[0] if t.dim() else 1, 1 << 20, 10 ** 9]))}[kind]
        flat[rng.randrange(flat.numel())] = v
        return kind, t
    if kind == "dirty" and t.dtype == torch.uint8 and t.numel():
        return kind, torch.randint(0, 256, t.shape, dtype=torch.uint8, generator=_tg(rng))
    if kind == "meta":
        return kind, t.to("meta")
    if kind == "not_tensor":
        return kind, rng.choice([3, 2.5, [1, 2], "x"])
    return "dtype", t.to(torch.float32) if t.dtype != torch.float32 else t.to(torch.int64)


def _tg(rng):
    import torch
    return torch.Generator().manual_seed(rng.randrange(1 << 31))


def _fill(t, rng):
    import torch
    if t.is_floating_point():
        return torch.randn(t.shape, generator=_tg(rng)).to(t.dtype)
    if t.dtype == torch.bool:
        return torch.rand(t.shape, generator=_tg(rng)) > 0.5
    return torch.randint(0, 4, t.shape, generator=_tg(rng)).to(t.dtype)


def _mutate_int(v, rng):
    v = v if isinstance(v, int) else 1
    return rng.choice([0, -1, -(1 << 31), 1 << 40, v + 1, v - 1, v * 2, 7, True, 1.5, None, "3"])


def _mutate_list(v, rng):
    v = list(v)
    c = rng.choice(["len", "zero", "neg", "huge", "type"])
    if c == "len":
        return v + [1] if rng.random() < 0.5 else v[:-1]
    if v and c in ("zero", "neg", "huge"):
        i = rng.randrange(len(v))
        v[i] = {"zero": 0, "neg": -2, "huge": 1 << 31}[c]
        return v
    return [str(x) for x in v] if v else 5


def _mutate_scalar_type(v, rng):
    import torch
    return rng.choice([None, torch.float64, torch.int32, torch.int8, torch.bool, "float32", 3,
                       torch.float16 if v != torch.float16 else torch.float32])


def _mutate_str(v, rng):
    return rng.choice(["", "bogus", "GPTQ", "gba" if v == "gptq" else "gptq", None, 4])


def mutate(op, args: tuple, rng) -> tuple:
    """(new args, (argument name, mutation) or None)."""
    types = _arg_types(op)
    i = rng.randrange(len(args))
    t, v, name = types[i], args[i], op.arg_names[i]
    import torch
    if isinstance(v, torch.Tensor):
        kind, new = _mutate_tensor(v, rng)
    elif v is None and "Tensor" in t:
        kind, new = "tensor_for_none", _fill(torch.empty(rng.choice([(1,), (3,), (2, 3)])), rng)
    elif t in ("int", "SymInt"):
        kind, new = "int", _mutate_int(v, rng)
    elif t.startswith("List[") or t.endswith("[]") or "int[" in t:
        kind, new = "list", _mutate_list(v, rng)
    elif "ScalarType" in t:
        kind, new = "dtype_arg", _mutate_scalar_type(v, rng)
    elif t == "float":
        kind, new = "float", rng.choice([float("nan"), float("inf"), 0.5, 2.0, -3.0])
    elif t == "str":
        kind, new = "str", _mutate_str(v, rng)
    elif t == "bool":
        kind, new = "bool", rng.choice([2, None, "yes"])
    else:
        return args, None
    args = args[:i] + (new,) + args[i + 1:]
    return args, (name, kind)


# ------------------------------------------------------------------ op cases
def op_case(seed: int, index: int):
    """(op, args, tol, mutations) of case ``index``."""
    from bie_core.ops import all_ops
    rng = random.Random(f"{seed}:{index}")
    ops_ = [o for o in all_ops() if o.cases is not None]
    op = ops_[index % len(ops_)]
    base = baselines(op)
    if not base:
        return op, None, None, []
    args, tol = base[rng.randrange(len(base))]
    muts = []
    for _ in range(rng.choices([0, 1, 2], weights=[15, 55, 30])[0]):
        args, m = mutate(op, args, rng)
        if m is not None:
            muts.append(m)
    return op, args, tol, muts


def _names_op(msg: str, op_name: str) -> bool:
    return op_name in msg


def _names_arg(msg: str, muts) -> bool:
    if not muts:
        return True
    low = msg.lower()
    # a message about any mutated argument counts (two mutations: either may be refused first); messages
    # about devices, dtypes and sizes name what they concern
    for name, kind in muts:
        if name.lower() in low or name.rstrip("s").lower() in low:
            return True
    generic = ("device", "dtype", "shape", "must", "expected", "allowed", "cannot", "no kernel", "not supported",
               "too small", "at most", "empty")
    return any(g in low for g in generic)


def classify_error(e: BaseException, subject: str, muts) -> tuple:
    tname = type(e).__name__
    msg = str(e)
    if tname not in CLEAR_TYPES and not any(c.__name__ in CLEAR_TYPES for c in type(e).__mro__):
        return "unclear", f"{tname}: {msg[:300]}"
    if not _names_op(msg, subject):
        return "unclear", f"{tname} without '{subject}': {msg[:300]}"
    if not _names_arg(msg, muts):
        return "unclear", f"{tname} not naming {muts}: {msg[:300]}"
    return "clear", f"{tname}: {msg[:160]}"


def _close(out, exp) -> str:
    """'' if ``out`` matches the reference output ``exp``, else what differs."""
    import torch
    if isinstance(exp, (tuple, list)):
        if not isinstance(out, (tuple, list)) or len(out) != len(exp):
            return "arity"
        for o, e in zip(out, exp):
            r = _close(o, e)
            if r:
                return r
        return ""
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}"
    o, e = out.detach().cpu(), exp.detach().cpu()
    if o.shape != e.shape or o.dtype != e.dtype:
        return f"shape/dtype {tuple(o.shape)}/{o.dtype} vs {tuple(e.shape)}/{e.dtype}"
    if not e.is_floating_point():
        return "" if torch.equal(o, e) else f"{int((o != e).sum())} of {e.numel()} integer elements differ"
    o64, e64 = o.to(torch.float64), e.to(torch.float64)
    if not torch.equal(o64.isnan(), e64.isnan()):
        return "NaN positions differ"
    einf, oinf = torch.isinf(e64), torch.isinf(o64)
    if not torch.equal(einf, oinf) or not torch.equal(o64[einf], e64[einf]):
        return "inf positions differ"
    fin = torch.isfinite(e64)
    if not fin.any():
        return ""
    scale = float(e64[fin].abs().max())
    tol = 2e-2 if e.dtype in (torch.float16, torch.bfloat16) else 1e-4
    bad = (o64[fin] - e64[fin]).abs() > tol * e64[fin].abs() + tol * scale + 1e-6
    return f"{int(bad.sum())} of {int(fin.sum())} values differ beyond {tol}" if bad.any() else ""


def run_op_case(seed, index, mode):
    import torch
    from bie_core import dispatch, ops as bops
    from bie_core.errors import NoKernelError
    from bie_core.plugins.registry import get_registry
    from bie_core.testing.conformance import call_kernel
    op, args, tol, muts = op_case(seed, index)
    label = f"{op.name} {muts}"
    if args is None:
        return "ok", label, "no baseline"
    via_library = random.Random(f"{seed}:{index}:lib").random() < 0.2
    fn = getattr(torch.ops.bie, op.name) if via_library else getattr(bops, op.name)
    try:
        with _mode_ctx(mode), torch.no_grad():
            out = fn(*args)
    except NoKernelError as e:   # a backend's capability declining the call: a clear, legitimate refusal
        return ("clear", label, str(e)[:160]) if op.name in str(e) else ("unclear", label, str(e)[:300])
    except Exception as e:
        if not muts:   # the unmutated baseline is a valid call: refusing it is a bug
            return "refused", label, f"a valid call raised {type(e).__name__}: {str(e)[:300]}"
        status, detail = classify_error(e, op.name, muts)
        return status, label, detail
    if any(isinstance(a, torch.Tensor) and a.device.type == "meta" for a in args):
        return "ok", label, "meta"
    ref = get_registry().reference_kernel(op.name)
    try:
        with torch.no_grad():
            exp = call_kernel(ref, op, args)
    except Exception as e:  # the op accepted what the reference cannot compute: validation let it through
        return "mismatch", label, f"accepted, but the reference raises {type(e).__name__}: {str(e)[:200]}"
    diff = _close(out, exp)
    dispatch  # (kept imported: the mode contexts use it)
    return ("mismatch", label, diff) if diff else ("ok", label, "")


def _mode_ctx(mode):
    import contextlib
    import bie_core
    if mode == "auto":
        return contextlib.nullcontext()
    return bie_core.use_backend("mlx" if mode == "mlx" else "cpu")


# ------------------------------------------------------------------ layer cases
def _careless_int(rng, good):
    return rng.choice([good, good, good, 0, -1, 1.5, True, None, "8", 1 << 40])


def layer_case(seed: int, index: int):
    """(name, thunk, mutated argument names) of layer case ``index``."""
    import torch
    import bie_core
    rng = random.Random(f"L{seed}:{index}")
    kind = rng.choice(["BinaryLinear", "QLinear", "BinaryConv2d", "QConv2d", "BinaryEmbedding",
                       "BinaryEmbeddingBag", "BinaryMatMul", "QMatMul", "BinaryMultiheadAttention", "MPQLinear",
                       "MBWQLinear"])
    bad = []

    def pick(name, good):
        v = _careless_int(rng, good) if rng.random() < 0.25 else good
        if v is not good:
            bad.append(name)
        return v

    def inp(shape, dtype=torch.float32):
        r = rng.random()
        if r < 0.08:
            shape = shape[:-1] + (shape[-1] + rng.choice([-1, 1]),)
            bad.append("input")
        elif r < 0.12:
            shape = (0,) + shape[1:]
        elif r < 0.16:
            dtype = rng.choice([torch.float64, torch.int32, torch.bool])
            bad.append("input")
        elif r < 0.2:
            shape = shape[1:] if len(shape) > 1 else ()
        x = torch.randn(shape, generator=_tg(rng)) if shape != () else torch.randn(())
        if rng.random() < 0.1:
            x.view(-1)[0:1] = float("nan") if x.numel() else 0
        return x.to(dtype) if dtype != torch.bool else x > 0

    k, n = rng.choice([(8, 4), (13, 5), (64, 16), (1, 1)])
    if kind in ("BinaryLinear", "QLinear"):
        extra = {"w_bits": pick("w_bits", 4)} if kind == "QLinear" else {}
        ctor = lambda: getattr(bie_core, kind)(pick("in_features", k), pick("out_features", n),  # noqa: E731
                                               bias=rng.random() < 0.5, **extra)
        x = lambda: inp((3, k))  # noqa: E731
    elif kind in ("BinaryConv2d", "QConv2d"):
        c = max(1, k % 5)
        ctor = lambda: getattr(bie_core, kind)(pick("in_channels", c), pick("out_channels", n),  # noqa: E731
                                               pick("kernel_size", 3), padding=pick("padding", 1),
                                               stride=pick("stride", 1), groups=pick("groups", 1))
        x = lambda: inp((2, c, 5, 6))  # noqa: E731
    elif kind in ("BinaryEmbedding", "BinaryEmbeddingBag"):
        ctor = lambda: getattr(bie_core, kind)(pick("num_embeddings", 10), pick("embedding_dim", k))  # noqa: E731

        def x():
            hi = rng.choice([10, 10, 10, 11, 1 << 40])
            lo = rng.choice([0, 0, 0, -1])
            if hi != 10 or lo != 0:
                bad.append("indices")
            shape = (2, 3) if kind == "BinaryEmbeddingBag" or rng.random() < 0.5 else (4,)
            return torch.randint(lo, hi, shape, generator=_tg(rng))
    elif kind in ("BinaryMatMul", "QMatMul"):
        ctor = lambda: getattr(bie_core, kind)(**({"bits": pick("bits", 8)} if kind == "QMatMul" else {}))  # noqa: E731
        x = lambda: (inp((2, 3, k)), inp((2, k, n)))  # noqa: E731
    elif kind == "BinaryMultiheadAttention":
        ctor = lambda: bie_core.BinaryMultiheadAttention(pick("embed_dim", 8), pick("num_heads", 2))  # noqa: E731
        x = lambda: (inp((2, 3, 8)),) * 3  # noqa: E731
    else:
        kk = rng.choice([64, 96, 32])
        kw = {"bits": pick("bits", 4), "group_size": pick("group_size", 32)}
        if kind == "MPQLinear":
            kw["format"] = rng.choice(["gptq", "gba", "gptq", "gba", "bogus"])
            if kw["format"] == "bogus":
                bad.append("format")
        ctor = lambda: getattr(bie_core, kind)(pick("in_features", kk), pick("out_features", 8),  # noqa: E731
                                               dtype=torch.float32, **kw)
        x = lambda: inp((3, kk))  # noqa: E731

    action = rng.choice(["forward", "forward", "train", "pack", "reload", "backend"])

    def thunk():
        layer = ctor()
        xs = x()
        xs = xs if isinstance(xs, tuple) else (xs,)
        if action == "backend":
            layer.backend = None
            with bie_core.use_backend(rng.choice(["cpu", "mlx", "cpu,mlx"])):
                return layer(*xs)
        if action == "train":
            layer.train()
            with torch.enable_grad():
                y = layer(*xs)
                y = y[0] if isinstance(y, tuple) else y
                if y.is_floating_point() and y.requires_grad:
                    y.float().sum().backward()
            return y
        layer.eval()
        if action == "pack" and hasattr(layer, "pack"):
            layer.train()
            layer(*xs)
            layer.eval()
            layer.pack()
        if action == "reload":
            sd = layer.state_dict()
            layer.load_state_dict(sd)
        with torch.no_grad():
            return layer(*xs)
    return kind, thunk, bad


def run_layer_case(seed, index, mode):
    kind, thunk, bad = layer_case(seed, index)
    try:
        with _mode_ctx(mode):
            thunk()
    except Exception as e:
        label = f"{kind} careless={bad}"
        tname, msg = type(e).__name__, str(e)
        if not any(c.__name__ in CLEAR_TYPES for c in type(e).__mro__):
            return "unclear", label, f"{tname}: {msg[:300]}"
        # a NoKernelError names the op the layer called and every kernel's reasons
        if kind not in msg and "bie::" not in msg and tname != "NoKernelError":
            return "unclear", label, f"{tname} without '{kind}': {msg[:300]}"
        return "clear", label, f"{tname}: {msg[:160]}"
    return "ok", f"{kind} careless={bad}", ""


# ------------------------------------------------------------------ worker
LAYER_EVERY = 5   # every 5th case is a layer case


def run_case(seed, index, mode):
    if index % LAYER_EVERY == LAYER_EVERY - 1:
        return run_layer_case(seed, index, mode)
    return run_op_case(seed, index, mode)


def drive(mode: str, seed: int, start: int, count: int, timeout: float = 600.0) -> list:
    """Run cases [start, start + count) of ``mode`` in worker processes;
    returns one record per case. A worker that dies is a ``crash`` of the case
    it was running (its progress file says which); a new worker continues
    after it. A worker past ``timeout`` (it runs every remaining case: on a
    slow, shared machine that can take longer than the timeout) is restarted at
    the case it was running; that case is a ``crash`` (a hang) only when it
    runs past the timeout again."""
    import subprocess
    import tempfile
    env = dict(os.environ)
    env["BIE_CPU_NATIVE"] = "0" if mode == "reference" else env.get("BIE_CPU_NATIVE", "1")
    env.pop("BIE_BACKEND", None)
    records: dict = {}
    nxt, end = start, start + count
    timed_out_at = None   # the case a worker was running when it ran past the timeout
    while nxt < end:
        with tempfile.NamedTemporaryFile("r", suffix=".progress") as prog:
            cmd = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--seed", str(seed), "--start",
                   str(nxt), "--count", str(end - nxt), "--progress", prog.name]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
                out, err, rc = r.stdout, r.stderr, r.returncode
            except subprocess.TimeoutExpired as e:
                out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                err, rc = "timeout", "timeout"
            for line in out.splitlines():
                if line.startswith("{"):
                    rec = json.loads(line)
                    records[rec["i"]] = rec
            started = [int(x) for x in open(prog.name).read().split()]
        if rc == 0 and all(i in records for i in range(nxt, end)):
            break
        last = max(started) if started else nxt
        if rc == "timeout" and last not in records and last != timed_out_at:
            timed_out_at, nxt = last, last   # a fresh worker from that case on
            continue
        if last not in records:
            label = "?"
            try:
                op, _, _, muts = op_case(seed, last) if last % LAYER_EVERY != LAYER_EVERY - 1 else (None,) * 4
                label = f"{op.name} {muts}" if op is not None else "layer case"
            except Exception:
                pass
            records[last] = {"i": last, "status": "crash", "label": label,
                             "detail": f"worker exited with {rc}: {err[-500:]}"}
        nxt = last + 1
    return [records[i] for i in sorted(records)]


def summary(records) -> dict:
    out: dict = {}
    for r in records:
        out[r["status"]] = out.get(r["status"], 0) + 1
    return out


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--progress", help="file that gets each case index before it runs")
    p.add_argument("-v", action="store_true")
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")
    import torch
    torch.set_num_threads(1)
    import bie_core  # noqa: F401
    prog = open(a.progress, "a", buffering=1) if a.progress else None
    # the harness's own tests: die at a case; stall at a case (every time, or only while a marker file is absent)
    crash_at = int(os.environ.get("BIE_FUZZ_SELFTEST_CRASH", "-1"))
    stall = os.environ.get("BIE_FUZZ_SELFTEST_STALL", "-1:").split(":", 1)
    for i in range(a.start, a.start + a.count):
        if prog:
            prog.write(f"{i}\n")
            prog.flush()
        if i == crash_at:
            os.abort()
        if i == int(stall[0]):
            if not stall[1]:
                time.sleep(3600)
            elif not os.path.exists(stall[1]):
                open(stall[1], "w").close()
                time.sleep(3600)
        try:
            status, label, detail = run_case(a.seed, i, a.mode)
        except BaseException as e:  # a bug in the harness itself, reported as such
            status, label, detail = "harness", f"case {i}", "".join(traceback.format_exception(e))[-800:]
        print(json.dumps({"i": i, "status": status, "label": label, "detail": detail}), flush=True)
        if a.v:
            print(status, label, detail, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What every MLX kernel checks itself before MLX sees its arguments.

MLX array operations do not bound-check: ``mx.take`` with an index past the
end reads outside the array (SIGSEGV), ``conv2d`` with no output channels or
``quantized_matmul`` with an empty batch end the process. The dispatcher
validates a call before it reaches a kernel, but only once per argument
signature, and a kernel may also be called directly (a test, another
backend's decomposition). So, as the native CPU kernels do in C++, the MLX
kernels refuse bad input themselves:

* :func:`guarded` wraps every registered kernel: the op's own validation
  (shapes, dtypes, devices, sizes; the same clear ``bie::OP: ...`` errors)
  once per argument signature, and results with no elements are produced
  without calling MLX at all;
* :func:`checked_index` bound-checks an index array on the very MLX copy the
  kernel indexes with, on every call: a value written into the torch tensor
  behind autograd's back (a numpy view, ``.data``) cannot slip past a check
  made on earlier values.
"""
from __future__ import annotations

import functools

import mlx.core as mx
import torch

#: Argument signatures validated per op before the oldest are forgotten.
MAX_SIGNATURES = 1024


def guarded(op_name: str, fn):
    """``fn`` (an MLX kernel of ``op_name``) preceded by the op's validation."""
    from bie_core.backend_api import arg_types, call_key_fn, get_op

    op = get_op(op_name)
    validate = op.validate
    nargs = len(op.arg_names)
    defaults = op.defaults
    key_fn = call_key_fn(op)
    seen: set = set()
    types = arg_types(op)
    int_args = tuple(i for i, t in enumerate(types) if t.rstrip("?") == "int")
    list_args = tuple(i for i, t in enumerate(types) if t.startswith("int["))

    def plain_ints(args):
        # a bool is an int to bie (and to Python), not to MLX's slicing and conv arguments
        if any(type(args[i]) is bool for i in int_args) or \
                any(isinstance(args[i], (list, tuple)) and any(type(v) is bool for v in args[i]) for i in list_args):
            args = list(args)
            for i in int_args:
                if type(args[i]) is bool:
                    args[i] = int(args[i])
            for i in list_args:
                if isinstance(args[i], (list, tuple)):
                    args[i] = [int(v) if type(v) is bool else v for v in args[i]]
            args = tuple(args)
        return args

    @functools.wraps(fn)
    def wrapper(*args, **kw):
        if len(args) < nargs:
            args = tuple(args) + defaults[len(args):]
        try:
            key = key_fn(*args[:nargs])
            known = key in seen
        except (AttributeError, TypeError):  # not the types the schema names: validation says what is wrong
            key, known = None, False
        if not known:
            if validate is not None:
                validate(*args[:nargs])
            if key is not None:
                if len(seen) >= MAX_SIGNATURES:
                    seen.clear()
                seen.add(key)
        empty = _empty_result(op, args[:nargs])
        if empty is not None:
            return empty
        args = plain_ints(args)
        try:
            return fn(*args, **kw)
        except (TypeError, ValueError, RuntimeError) as e:
            if str(e).startswith("bie::"):
                raise
            # MLX refuses what validation let through (sizes beyond its int32 arguments, say)
            raise ValueError(f"bie::{op_name}: bie-backend-mlx cannot compute this call: "
                             f"{(str(e).splitlines() or [type(e).__name__])[0][:300]}") from e

    wrapper.__wrapped_kernel__ = fn
    return wrapper


def _empty_result(op, args):
    """The op's output when it has no elements (computed from the fake kernel's
    shapes), else None. Only calls with an empty tensor argument can have one."""
    if not any(isinstance(a, torch.Tensor) and a.numel() == 0 for a in args):
        return None
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    meta = op.fake(*(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args))
    outs = meta if isinstance(meta, (tuple, list)) else (meta,)
    if any(o.numel() for o in outs):
        return None
    # (in the fake's memory format: an op whose contract fixes it, channels_last, keeps it when empty too)
    real = tuple(torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device=device) for o in outs)
    return real if isinstance(meta, (tuple, list)) else real[0]


def checked_index(a: "mx.array", hi: int, op: str, name: str) -> "mx.array":
    """``a`` as int32 after checking that every value is in [0, hi)."""
    if a.size:
        lo, top = mx.min(a), mx.max(a)
        mx.eval(lo, top)
        lo, top = lo.item(), top.item()
        if lo < 0 or top >= hi:
            raise IndexError(f"bie::{op}: {name} values must be in [0, {hi}), got values in [{lo}, {top}] "
                             f"(checked by bie-backend-mlx)")
    return a.astype(mx.int32)

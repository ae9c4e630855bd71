"""The conformance checks run by ``pytest --bie-backend=NAME``.

For every kernel the backend declares and every conformance case of its op
(``OpDef.cases``: fresh random inputs, M=1, odd sizes, large K, non-contiguous
inputs, every dtype and bit width):

* **matches** — if the kernel's capability accepts the case, its output equals
  the reference's (bit for bit for integer results, within the case's stated
  tolerance for float results), with the same shape and dtype; a reference
  kernel is checked against an independent oracle instead of itself;
* **honesty** — if the capability rejects the case, dispatching the case to
  this backend explicitly never calls the kernel (another kernel of the
  backend serves it, or a NoKernelError explains why);
* **prepared layouts** — ``prepare`` is deterministic, ``unprepare`` (when
  declared) gives the canonical weights back, the layout keeps no weight
  alive, and an in-place change of a weight is seen on the next call (no
  stale cache);
* **bind plans** — a kernel's ``bind`` plan matches the reference like its
  ``fn``, and for an op without weights on new values of the signature too;
* **opcheck** — ``torch.library.opcheck`` on each op through this backend.

Results are tallied per (op, backend) into the coverage matrix printed at the
end of the run.
"""
from __future__ import annotations

import contextlib
import gc
import weakref
from collections import defaultdict
from dataclasses import dataclass

import torch

from .. import dispatch
from ..errors import NoKernelError
from ..kernels import Kernel
from ..ops import Case, OpDef, get_op
from ..plugins.registry import get_registry
from . import oracles

#: (op, backend) -> {"pass": n, "fail": n, "rejected": n}
COVERAGE: dict = defaultdict(lambda: defaultdict(int))
#: ops whose reference kernel had no independent oracle: checked for shape and
#: dtype only (the coverage matrix marks them)
SHAPE_ONLY: set = set()


@dataclass
class KernelCase:
    kernel: Kernel
    op: OpDef
    case: Case
    accepted: bool
    reasons: list

    @property
    def id(self):
        state = "run" if self.accepted else "rejected"
        return f"{self.kernel.qualname}::{self.case.label}::{state}"


def _to_cpu(a):
    """a tensor, or each tensor of a tuple of outputs, on the CPU (what compare() takes as the expectation)"""
    if isinstance(a, torch.Tensor):
        return a.detach().cpu()
    if isinstance(a, (tuple, list)) and any(isinstance(e, torch.Tensor) for e in a):
        return type(a)(_to_cpu(e) for e in a) if type(a) in (tuple, list) else tuple(_to_cpu(e) for e in a)
    return a


def _prepare(kernel: Kernel, op: OpDef, args: tuple):
    """The kernel's prepared object for the weights of ``args``, made anew (not the dispatcher's cache)."""
    weights, static = kernel.prepare_inputs(op, args)
    return kernel.prepare(*weights, **static)


def call_kernel(kernel: Kernel, op: OpDef, args: tuple):
    if kernel.prepare is None:
        return kernel.fn(*args)
    return kernel.fn(*args, prepared=_prepare(kernel, op, args))


def expected(kernel: Kernel, op: OpDef, args: tuple):
    """The output the kernel must produce: the reference's, or for the
    reference itself an independent oracle's (None when none exists)."""
    cpu_args = tuple(_to_cpu(a) for a in args)
    if kernel.reference:
        fn = oracles.get(op.name)
        return None if fn is None else fn(*cpu_args)
    ref = get_registry().reference_kernel(op.name)
    if ref is None:
        raise RuntimeError(f"no reference kernel for {op.name}: is bie-backend-cpu installed?")
    return call_kernel(ref, op, cpu_args)


def compare(out, exp, tol, what: str) -> None:
    if isinstance(exp, (tuple, list)):
        assert isinstance(out, (tuple, list)) and len(out) == len(exp), f"{what}: output arity differs"
        for i, (o, e) in enumerate(zip(out, exp)):
            compare(o, e, tol, f"{what}[{i}]")
        return
    assert isinstance(out, torch.Tensor), f"{what}: kernel returned {type(out).__name__}, not a tensor"
    o = out.detach().cpu()
    assert o.shape == exp.shape, f"{what}: shape {tuple(o.shape)} != expected {tuple(exp.shape)}"
    assert o.dtype == exp.dtype, f"{what}: dtype {o.dtype} != expected {exp.dtype}"
    if tol == "exact" or not exp.is_floating_point():
        if not torch.equal(o, exp):
            diff = (o.to(torch.float64) - exp.to(torch.float64)).abs()
            bad = int((diff > 0).sum())
            raise AssertionError(f"{what}: not bit-exact; {bad} of {o.numel()} elements differ "
                                 f"(max abs diff {float(diff.max()) if diff.numel() else 0})")
        return
    rtol, atol = tol
    torch.testing.assert_close(o.to(torch.float64), exp.to(torch.float64), rtol=rtol, atol=atol,
                               msg=lambda m: f"{what}: {m}")


def check_matches(kc: KernelCase) -> None:
    out = call_kernel(kc.kernel, kc.op, kc.case.args)
    exp = expected(kc.kernel, kc.op, kc.case.args)
    if exp is None:  # reference without oracle: at least the fake must agree on shape and dtype
        SHAPE_ONLY.add(kc.op.name)
        for f, o in _with_fakes(kc, out):
            assert tuple(f.shape) == tuple(o.shape) and f.dtype == o.dtype, \
                f"{kc.id}: fake says {tuple(f.shape)}/{f.dtype}, kernel gave {tuple(o.shape)}/{o.dtype}"
        return
    compare(out, exp, kc.case.tol, kc.id)
    if kc.kernel.bind is not None:
        check_bind(kc, exp)
    if kc.op.memory_format_checked:
        check_memory_format(kc, out)
    # fresh inputs every run are not enough if a kernel is nondeterministic: run twice
    if kc.case.tol == "exact":
        again = call_kernel(kc.kernel, kc.op, kc.case.args)
        compare(again, _to_cpu(out), "exact",
                kc.id + " (second run)")


def _scaled(a):
    """A floating tensor argument's values times 0.75 (a new tensor of the same signature; still a valid argument:
    scales stay positive, zero stays zero, non-finite stays non-finite); anything else as it is."""
    if isinstance(a, torch.Tensor) and a.is_floating_point():
        return (a * 0.75).to(a.dtype)
    return a


def check_bind(kc: KernelCase, exp) -> None:
    """A kernel's ``bind`` plan computes what the op defines, as its ``fn`` must: for the arguments it was made
    with, and, for an op without weight arguments, for new tensors of the same signature (a dispatched call of
    such an op runs the plan made on an earlier call of that signature: bie_core/dispatch.py). An input-only plan
    is called as the layers call it, with the input alone."""
    k, op, args = kc.kernel, kc.op, kc.case.args
    fn = k.bind(*args) if k.prepare is None else k.bind(*args, prepared=_prepare(k, op, args))
    if fn is None:
        return
    input_only = getattr(fn, "input_only", False)
    compare(fn(args[0]) if input_only else fn(*args), exp, kc.case.tol, kc.id + " (bind plan)")
    if not op.weight_args and not input_only:
        new = tuple(_scaled(a) for a in args)
        compare(fn(*new), expected(k, op, new), kc.case.tol, kc.id + " (bind plan, new values of the signature)")


def _with_fakes(kc: KernelCase, out) -> list:
    """(fake output, kernel output) pairs: the op's fake kernel run on the case's arguments."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fargs = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in kc.case.args)
        fake = kc.op.fake(*fargs)
    fakes = fake if isinstance(fake, (tuple, list)) else (fake,)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return list(zip(fakes, outs))


def check_memory_format(kc: KernelCase, out) -> None:
    """Each output in the memory format the op's fake kernel gives (contiguous, or channels_last for 4-D)."""
    for f, o in _with_fakes(kc, out):
        formats = [torch.contiguous_format] + ([torch.channels_last] if o.dim() == 4 else [])
        for mf in formats:
            assert o.is_contiguous(memory_format=mf) == f.is_contiguous(memory_format=mf), \
                (f"{kc.id}: output strides {o.stride()} are {'' if o.is_contiguous(memory_format=mf) else 'not '}"
                 f"{str(mf)[6:]}, the op's fake kernel says {f.stride()}")


@contextlib.contextmanager
def _spy(kernel: Kernel):
    calls = []
    original = kernel.fn

    def spy(*args, **kw):
        calls.append(args)
        return original(*args, **kw)
    kernel.fn = spy
    dispatch.clear_caches()
    try:
        yield calls
    finally:
        kernel.fn = original
        dispatch.clear_caches()


def check_honesty(kc: KernelCase) -> None:
    """A disclaimed case never reaches the kernel, even when its backend is chosen explicitly."""
    with _spy(kc.kernel) as calls:
        try:
            kc.op(*kc.case.args, backend=kc.kernel.backend)
        except NoKernelError as err:
            assert kc.kernel.qualname in str(err), \
                f"{kc.id}: NoKernelError does not list the rejected kernel:\n{err}"
        assert not calls, f"{kc.id}: kernel was called on a case its capability rejects ({kc.reasons})"


def check_prepared(kernel: Kernel, op: OpDef, case: Case) -> None:
    weights, static = kernel.prepare_inputs(op, case.args)
    p1, p2 = kernel.prepare(*weights, **static), kernel.prepare(*weights, **static)
    o1 = kernel.fn(*case.args, prepared=p1)
    o2 = kernel.fn(*case.args, prepared=p2)
    compare(o2, _to_cpu(o1), "exact" if case.tol == "exact" else case.tol,
            f"{kernel.qualname}: prepare is not deterministic")
    check_prepared_keeps_no_weight(kernel, op, case)
    if kernel.unprepare is not None:
        back = kernel.unprepare(p1)
        back = back if isinstance(back, (tuple, list)) else (back,)
        for w, b in zip(weights, back):
            if isinstance(w, torch.Tensor):
                compare(b, w.detach().cpu(), "exact", f"{kernel.qualname}: unprepare(prepare(w)) != w")


def check_prepared_keeps_no_weight(kernel: Kernel, op: OpDef, case: Case) -> None:
    """A prepared layout must not hold its weights (the tensors or views of their memory). The dispatcher keeps a
    layout until the weight's storage dies; a layout holding that storage would never die, and every weight version
    prepared (a training step's fresh codes or sign bits) would stay in memory for good. Pass what the kernel needs
    of the weight at call time through the call's own weight argument."""
    args = list(case.args)
    refs = []
    for i in op.weight_args:
        if isinstance(args[i], torch.Tensor):
            args[i] = args[i].detach().clone()
            refs.append((i, weakref.ref(args[i].untyped_storage())))
    prepared = _prepare(kernel, op, tuple(args))
    kernel.fn(*args, prepared=prepared)   # (layouts built on first use count too)
    del args
    gc.collect()
    kept = [i for i, r in refs if r() is not None]
    assert not kept, (f"{kernel.qualname}: its prepared layout ({type(prepared).__name__}) keeps weight argument(s) "
                      f"{kept} of the op alive: the dispatcher's cache entry for them would never be freed")
    del prepared


def check_cache_invalidation(kernel: Kernel, op: OpDef, case: Case, gen: torch.Generator) -> None:
    """After an in-place update of the weights the dispatcher must re-prepare.

    The new weights are the old ones with rows permuted (still a valid
    canonical format), written in place with ``copy_``.
    """
    args = list(a.clone() if isinstance(a, torch.Tensor) else a for a in case.args)
    new = {}
    for i in op.weight_args:
        w = args[i]
        if isinstance(w, torch.Tensor) and w.dim() >= 1 and w.shape[0] > 1:
            perm = torch.randperm(w.shape[0], generator=gen).to(w.device)
            new[i] = w[perm].clone()
    if not new:
        return

    def cached():
        return dispatch.prepared_cache.get(kernel, *kernel.prepare_inputs(op, tuple(args)))
    kernel.fn(*args, prepared=cached())  # caches the old layout
    for i, w in new.items():
        args[i].copy_(w)
    out = kernel.fn(*args, prepared=cached())
    exp = call_kernel(kernel, op, tuple(args))
    compare(out, _to_cpu(exp), "exact" if case.tol == "exact" else case.tol,
            f"{kernel.qualname}: stale prepared layout after an in-place weight update")


def check_opcheck(op: OpDef, backend: str, case: Case) -> None:
    args = tuple(case.args) + tuple(op.defaults[len(case.args):])   # the backend follows every argument
    torch.library.opcheck(op.overload, args + (backend,),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def plan(backend: str, device: torch.device, seed: int):
    """Every (kernel, case) pair to check for ``backend`` on ``device``."""
    reg = get_registry()
    rec = reg.record(backend)
    if rec is None:
        raise ValueError(f"--bie-backend={backend}: unknown backend; installed: {sorted(reg.names())}")
    if not rec.ok:
        return rec, []
    gen = torch.Generator().manual_seed(seed)
    cases_by_op: dict = {}
    out = []
    for k in rec.kernels:
        op = get_op(k.op)
        if op.name not in cases_by_op:
            cases_by_op[op.name] = list(op.cases(device, gen)) if op.cases else []
        for c in cases_by_op[op.name]:
            reasons = k.reasons(op.problem(*c.args))
            out.append(KernelCase(k, op, c, not reasons, reasons))
    return rec, out

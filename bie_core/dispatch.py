"""The dispatcher: which kernel serves a call, and why the others do not.

Precedence, most specific first (docs/spec.md §1):

1. per-layer ``backend=`` (passed to every op as its trailing ``backend`` argument)
2. ``with bie_core.use_backend(...)`` (a ContextVar: thread- and task-local)
3. ``bie_core.set_backend(...)`` (process-wide; ``None`` resets)
4. environment ``BIE_BACKEND`` (ordered list such as ``cutlass,cuda,cpu``)
5. automatic: the highest-priority kernel whose capability fits.

Levels 1–4 are *explicit*: only the named backends are considered, in the
given order, and if none can serve the call a :class:`NoKernelError` lists
every kernel considered with all its reasons. A name may also be one kernel,
``backend:kernel`` (``"cuda:wq_gemm_thin"``): then only that kernel serves
the op it implements, wherever its capability accepts the call. Automatic selection may fall
back to a slower kernel but warns once per (op, reason); ``BIE_STRICT=1``
turns that fallback into an error.

Decisions are cached per call site: (op, preference, argument signature:
device, dtype, shape, requires_grad, contiguity of each tensor and the value
of every other argument). The cached path is a few dictionary lookups.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import re
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import torch

from .errors import BackendUnavailableError, BieFallbackWarning, NoKernelError, UnknownBackendError
from .graph_pool import outside_graph_pool
from .kernels import ANY_DEVICE, Kernel, Problem
from .optable import get_op
from .plugins.registry import LOADED, get_registry

_REG = get_registry()
#: ``logging.getLogger("bie.dispatch").setLevel(logging.INFO)`` logs every new decision
_log = logging.getLogger("bie.dispatch")

# Where an accelerated kernel for a device type would come from (for messages only:
# core never imports a backend by name).
_INSTALL_HINTS = {
    "cuda": "pip install bie-backend-cutlass (and/or bie-backend-cuda)",
    "mps": "pip install bie-backend-mlx",
}

# ----------------------------------------------------------------- preferences
# A preference is None (automatic) or a tuple (names, source).
_context_pref: contextvars.ContextVar = contextvars.ContextVar("bie_backend", default=None)
_global_pref: Optional[tuple] = None
_env_pref: Optional[tuple] = None
_env_read = False
#: per-layer backend strings already parsed; a few per model, so a small cap
#: only matters to a caller that makes up new strings (it is then cleared)
_parse_cache: dict = {}
_MAX_PARSED = 256


def _parse(spec: Union[str, Sequence[str]], source: str) -> tuple:
    if isinstance(spec, str):
        names = tuple(s.strip() for s in spec.split(",") if s.strip())
    elif isinstance(spec, (list, tuple)) and all(isinstance(s, str) for s in spec):
        names = tuple(s.strip() for s in spec)
    else:
        raise TypeError(f"{source}: a backend choice is a name ('cpu'), a comma-separated list ('mlx,cpu'), a "
                        f"list of names or None (automatic); got {spec!r} of type {type(spec).__name__}")
    if not names or not all(names):
        raise ValueError(f"{source}: empty backend name in {spec!r}; give a name such as 'cpu', a "
                         f"comma-separated list such as 'mlx,cpu', or None (automatic)")
    return (names, source)


def _read_env() -> Optional[tuple]:
    global _env_pref, _env_read
    raw = os.environ.get("BIE_BACKEND", "").strip()
    _env_pref = _parse(raw, "env BIE_BACKEND") if raw else None
    _env_read = True
    if _env_pref is not None:
        known = set(_REG.names())
        unknown = [n for n in _env_pref[0] if n.partition(":")[0] not in known]
        if unknown:
            warnings.warn(f"bie: BIE_BACKEND names {unknown} that no installed plugin provides "
                          f"(installed: {sorted(known)})", BieFallbackWarning, stacklevel=3)
    return _env_pref


def _layer_pref(spec: str) -> tuple:
    p = _parse_cache.get(spec)
    if p is None:
        p = _parse(spec, f"backend={spec!r}")
        if len(_parse_cache) >= _MAX_PARSED:
            _parse_cache.clear()
        _parse_cache[spec] = p
    return p


def current_preference(layer_backend: str = "") -> Optional[tuple]:
    """The effective ``(names, source)`` for a call, or None for automatic."""
    if layer_backend:
        return _layer_pref(layer_backend)
    p = _context_pref.get()
    if p is not None:
        return p
    if _global_pref is not None:
        return _global_pref
    if not _env_read:
        _read_env()
    return _env_pref


def validate_choice(spec: Union[str, Sequence[str], None], source: str = "backend") -> Optional[tuple]:
    """Check an explicit choice; return its ``(names, source)``.

    A single name is strict: an unknown name raises
    :class:`UnknownBackendError` listing the installed ones, and a backend
    that is broken, incompatible or unavailable here raises
    :class:`BackendUnavailableError` chained with its original exception.
    An ordered list (``"cuda,cpu"``) means "the first of these that works
    here", as ``BIE_BACKEND`` does: entries that cannot run here are skipped
    (names no installed plugin provides with a :class:`BieFallbackWarning`,
    since they may be typos), and only a list with no usable entry raises.
    """
    if spec is None:
        return None
    pref = _parse(spec, source)
    names = pref[0]
    problems = []           # (exception, its cause, one-line reason) for every unusable entry
    unknown = []
    for qualname in names:
        name, _, kernel = qualname.partition(":")   # "cuda" or one kernel: "cuda:wq_gemm_thin"
        rec = _REG.record(name)
        if rec is None:
            unknown.append(name)
            problems.append((UnknownBackendError(
                f"{source}: unknown backend {name!r}; installed backends: {sorted(_REG.names())}. "
                f"Install it (e.g. pip install bie-backend-{name}) or pick one of those."), None,
                f"{name}: not installed"))
        elif rec.status != LOADED:
            from .plugins.hints import fix_hint
            reason = f"{rec.status}: {rec.cause}" if rec.cause else rec.status
            hint = fix_hint(rec)
            if hint:
                reason += f" ({hint})"
            msg = f"{source}: backend {name!r} cannot be used here: {reason}"
            if rec.traceback:
                msg += "\n--- original error ---\n" + rec.traceback
            problems.append((BackendUnavailableError(msg), rec.exception, f"{name}: {reason}"))
        elif kernel and not any(k.name == kernel for k in rec.kernels):
            problems.append((UnknownBackendError(
                f"{source}: backend {name!r} has no kernel named {kernel!r}; its kernels: "
                f"{sorted({k.name for k in rec.kernels})}"), None, f"{qualname}: no such kernel"))
    if len(names) == 1 and problems:
        err, cause, _ = problems[0]
        raise err from cause
    if len(problems) == len(names):
        lines = "\n".join(f"  {reason}" for _, _, reason in problems)
        raise BackendUnavailableError(f"{source}: none of the backends {list(names)} can be used here:\n{lines}")
    if unknown:
        warnings.warn(f"bie: {source} names {unknown} that no installed plugin provides (skipped; installed: "
                      f"{sorted(_REG.names())})", BieFallbackWarning, stacklevel=3)
    return pref


def set_backend(spec: Union[str, Sequence[str], None]) -> None:
    """Choose the backend(s) for the whole process (``None``: automatic again).

    ``spec`` is a name (``"mlx"``), a comma-separated ordered list or a
    sequence of names. Raises at once if a name is unknown or cannot run here.
    """
    global _global_pref
    _global_pref = validate_choice(spec, "set_backend")


def get_backend() -> Optional[tuple]:
    """The process-wide choice as a tuple of names, or None (automatic)."""
    return None if _global_pref is None else _global_pref[0]


@contextlib.contextmanager
def use_backend(spec: Union[str, Sequence[str], None]):
    """Choose the backend(s) inside a ``with`` block (thread- and task-local).

    ``use_backend(None)`` restores automatic selection inside the block.
    """
    pref = validate_choice(spec, "use_backend") if spec is not None else None
    token = _context_pref.set(pref if spec is not None else _AUTO)
    try:
        yield
    finally:
        _context_pref.reset(token)


# use_backend(None) must override an outer set_backend: a distinct marker that
# current_preference() maps to automatic.
class _Auto(tuple):
    pass


_AUTO = _Auto()


# ------------------------------------------------------------------- decisions
@dataclass
class Rejection:
    who: str            # "cuda:wq_gemv" or "backend mlx"
    priority: Optional[int]
    reasons: list

    def __str__(self):
        pr = f" (priority {self.priority})" if self.priority is not None else ""
        return f"{self.who}{pr}: " + "; ".join(self.reasons)


@dataclass
class Decision:
    op: str
    problem: Problem
    kernel: Kernel
    source: str                 # "automatic" or where the explicit choice came from
    rejections: list = field(default_factory=list)
    also_ok: list = field(default_factory=list)   # lower-priority kernels that could serve
    fallback: list = field(default_factory=list)  # reasons automatic selection fell back
    #: a kernel without weights: its call for this signature (its ``bind`` plan, or its general entry), made on
    #: the first call routed here (``_weightless_call``)
    call: Optional[Callable] = field(default=None, repr=False, compare=False)

    def __str__(self):
        lines = [f"{self.problem.describe()}",
                 f"  -> {self.kernel.qualname} (priority {self.kernel.priority}; {self.source})"]
        for k in self.also_ok:
            lines.append(f"     also able: {k.qualname} (priority {k.priority})")
        for r in self.rejections:
            lines.append(f"     rejected: {r}")
        for f_ in self.fallback:
            lines.append(f"     fallback: {f_}")
        return "\n".join(lines)


#: op name -> {(preference, argument signature): Decision}
_tables: dict = {}
_MAX_DECISIONS = 4096
_warned: set = set()
_warn_lock = threading.Lock()


def _strict() -> bool:
    return os.environ.get("BIE_STRICT", "").strip() not in ("", "0", "false", "False")


def _reference_hint(device_type: str) -> str:
    """What to do when only the reference serves an op on an accelerator: install a backend for the device, or,
    where backends for it are loaded, know that none of them implements the op."""
    loaded = [rec.name for rec in _REG.records()
              if rec.status == LOADED and rec.devices and device_type in rec.devices]
    if loaded:
        return f"no kernel for it in the loaded {device_type} backends: {', '.join(sorted(loaded))}"
    return _INSTALL_HINTS.get(device_type, "install a bie backend for this device")


def _backend_rejections(problem: Problem, only: Optional[Iterable[str]] = None) -> list:
    """Backends that would serve this device but are not loaded."""
    out = []
    for rec in _REG.records():
        if rec.status == LOADED or (only is not None and rec.name not in only):
            continue
        devs = rec.devices or ()
        if only is None and devs and ANY_DEVICE not in devs and problem.device_type not in devs:
            continue
        reason = f"{rec.status}: {rec.cause}" if rec.cause else rec.status
        from .plugins.hints import fix_hint
        hint = fix_hint(rec)
        if hint:
            reason += f" ({hint})"
        out.append(Rejection(f"backend {rec.name}", None, [reason]))
    return out


DECOMPOSITION_PRIORITY = 1  # above the reference (0), below every real kernel


def _decomposition(op, backend: str) -> Kernel:
    """A kernel that computes a fused op through its parts (``op.decompose``),
    each part dispatched with ``backend`` as its per-call choice."""
    fn = op.decompose

    def run(*args):
        return fn(*args, backend=backend)
    return Kernel(backend="bie", op=op.name, fn=run, priority=DECOMPOSITION_PRIORITY,
                  name=f"decomposition[{backend or 'automatic'}]",
                  description="the fused op computed with its parts, each dispatched on its own")


def decide(op, args: tuple, pref: Optional[tuple]) -> Decision:
    """Choose a kernel for ``op`` called with ``args`` (uncached)."""
    problem = op.problem(*args)
    kernels = _REG.kernels(op.name)
    if op.decompose is not None and kernels:
        kernels = sorted(list(kernels) + [_decomposition(op, "")], key=lambda k: -k.priority)
    if pref is None or isinstance(pref, _Auto):
        d = _decide_auto(op, problem, kernels)
    else:
        d = _decide_explicit(op, problem, kernels, pref)
    # once per new call site class (decisions are cached): which kernel, and why
    if _log.isEnabledFor(logging.INFO):
        _log.info("%s -> %s (priority %d; %s)%s", problem.describe(), d.kernel.qualname, d.kernel.priority,
                  d.source, "".join(f"\n  rejected {r}" for r in d.rejections))
    return d


def _auto_choice(problem: Problem, kernels: list) -> tuple:
    """Automatic selection's kernel for ``problem`` among ``kernels`` (highest priority first), or None:
    (chosen, rejections, deferred, also_ok), the last three lists of (kernel, reasons) / kernels."""
    chosen = None
    rejections, deferred, also_ok = [], [], []
    for k in kernels:
        r = k.reasons(problem)
        if not r and chosen is None:
            why = k.deferral(problem)
            if why:   # correct here, but a later kernel is faster: not a fallback
                deferred.append((k, [f"passes to a faster kernel: {why}"]))
                continue
        if r:
            rejections.append((k, r))
        elif chosen is None:
            chosen = k
        else:
            also_ok.append(k)
    if deferred and (chosen is None or (chosen.reference and problem.device_type not in ("cpu", "meta"))):
        # nothing faster accepted it (the plain-PyTorch reference on an accelerator does not count as
        # faster): the deferring kernel serves after all
        if chosen is not None:
            also_ok.insert(0, chosen)
        chosen = deferred.pop(0)[0]
    return chosen, rejections, deferred, also_ok


def _decide_auto(op, problem: Problem, kernels: list) -> Decision:
    chosen, rejections, deferred, also_ok = _auto_choice(problem, kernels)
    backend_rej = _backend_rejections(problem)
    rej = ([Rejection(k.qualname, k.priority, r) for k, r in rejections + deferred]
           + backend_rej)
    if chosen is None:
        msg = [f"no kernel can serve {problem.describe()} (automatic selection). Considered:"]
        msg += [f"  - {r}" for r in rej] or ["  - (no kernel is registered for this op: is bie-backend-cpu installed?)"]
        raise NoKernelError("\n".join(msg), rej)
    # What made this a fallback: a better kernel for this device that said no,
    # a backend for this device that is not loaded, or the reference running
    # on an accelerator.
    # A kernel of the *same* backend taking over (a GEMV limited to small M
    # handing larger M to the backend's GEMM) is specialisation, not fallback.
    fallback = []
    for k, r in rejections:
        if (k.priority > chosen.priority and k.backend != chosen.backend
                and k.capability.serves_device(problem.device_type)):
            fallback.append(f"{k.qualname} rejected: {'; '.join(r)}")
    for b in backend_rej:
        fallback.append(f"{b.who} {b.reasons[0]}")
    if chosen.reference and problem.device_type not in ("cpu", "meta"):
        fallback.append(f"only the plain-PyTorch reference serves {problem.device_type} tensors "
                        f"for this op ({_reference_hint(problem.device_type)})")
    d = Decision(op.name, problem, chosen, "automatic", rej, also_ok, fallback)
    if fallback:
        if _strict():
            raise NoKernelError(
                f"BIE_STRICT is set and {problem.describe()} would fall back to "
                f"{chosen.qualname}:\n" + "\n".join(f"  - {f}" for f in fallback), rej)
        for reason in fallback:
            _warn_once(op.name, f"{op.name} falls back to {chosen.qualname} because {reason}")
    return d


def _warn_once(op_name: str, message: str) -> None:
    # once per (op, reason): sizes inside a reason ("K=100 is not a multiple
    # of 128") do not make it a new reason
    key = (op_name, re.sub(r"\d+", "#", message))
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(f"bie: {message}", BieFallbackWarning, stacklevel=6)


def _decide_explicit(op, problem: Problem, kernels: list, pref: tuple) -> Decision:
    names, source = pref
    rej, causes, missing = [], [], []
    chosen, also_ok = None, []
    for qualname in names:
        name, _, kernel = qualname.partition(":")   # a backend, or one kernel of it
        rec = _REG.record(name)
        if rec is None:
            rej.append(Rejection(f"backend {name}", None,
                                 [f"not installed (installed: {sorted(_REG.names())})"]))
            continue
        if rec.status != LOADED:
            rej.append(Rejection(f"backend {name}", None, [f"{rec.status}: {rec.cause}"]))
            if rec.exception is not None:
                causes.append(rec.exception)
            continue
        own = [k for k in kernels if k.backend == name and (not kernel or k.name == kernel)]
        if not own:
            rej.append(Rejection(f"backend {name}", None, [f"has no kernel {kernel + ' ' if kernel else ''}"
                                                            f"for op {op.name}"]))
            missing.append(name)
        deferred = []
        for k in own:
            r = k.reasons(problem)
            if r:
                rej.append(Rejection(k.qualname, k.priority, r))
            elif chosen is None:
                # among the kernels of a chosen backend, one that defers passes the call to the next of them that
                # accepts it; a kernel chosen by name always runs
                why = None if kernel else k.deferral(problem)
                if why:
                    deferred.append(k)
                    rej.append(Rejection(k.qualname, k.priority, [f"passes to a faster kernel: {why}"]))
                else:
                    chosen = k
            else:
                also_ok.append(k)
        if chosen is None and deferred:
            chosen = deferred[0]
            rej = [r for r in rej if r.who != chosen.qualname]
        if chosen is not None:
            break
    if chosen is None and len(missing) == len(names) and op.decompose is not None:
        # a fused op the chosen backends do not implement: run its parts, each
        # under the same explicit choice (strict again for every part)
        k = _decomposition(op, ",".join(names))
        return Decision(op.name, problem, k, source, rej, [], [])
    if chosen is None and len(missing) == len(names):
        # None of the chosen backends implements this op at all (say, a helper
        # op such as pack_signs that MLX leaves to others): the choice says
        # nothing about it, so automatic selection serves it, loudly.
        d = _decide_auto(op, problem, kernels)
        reason = (f"{source} chose {', '.join(names)}, which has no kernel for {op.name}; "
                  f"{d.kernel.qualname} serves it")
        if _strict():
            raise NoKernelError(f"BIE_STRICT is set and {reason}", rej)
        _warn_once(op.name, reason)
        d.source = f"automatic ({reason})"
        d.rejections = rej + d.rejections
        return d
    if chosen is None:
        msg = [f"{source} chose {', '.join(names)}, which cannot serve {problem.describe()}. "
               "Every kernel considered:"]
        msg += [f"  - {r}" for r in rej]
        others = sorted({k.backend for k in kernels if k.backend not in names and not k.reasons(problem)})
        if others:
            msg.append(f"  (backends that could serve it: {', '.join(others)})")
        err = NoKernelError("\n".join(msg), rej)
        if len(causes) == 1:
            raise err from causes[0]
        raise err
    return Decision(op.name, problem, chosen, source, rej, also_ok, [])


def _argkey(args: tuple) -> tuple:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append((a.device, a.dtype, a.shape, a.requires_grad, a.is_contiguous()))
        elif type(a) is list:
            out.append(tuple(a))
        else:
            out.append(a)
    return tuple(out)


# ---------------------------------------------------------- recording (explain)
_recorder: contextvars.ContextVar = contextvars.ContextVar("bie_recorder", default=None)
_layer_name: contextvars.ContextVar = contextvars.ContextVar("bie_layer", default="")


# ------------------------------------------------------------- prepared layouts
_single_use: contextvars.ContextVar = contextvars.ContextVar("bie_single_use_weights", default=False)
_single_use_get = _single_use.get


class single_use_weights:
    """Within this context, the weights of routed calls are made for that call alone (a training step's weight
    codes, quantized from the latent weight on every forward): a kernel's layout of them is prepared inline and
    kept nowhere. Caching it would cost the cache's bookkeeping on every call (keys, weak references, the
    registered ops' bound-call memo) for an entry no later call can hit, and would hold the layout until the
    codes die. The QAT layers' autograd Functions enter it around their products."""

    __slots__ = ("_tok",)

    def __enter__(self):
        # traced by torch.compile: nothing to mark (the compiled graph calls the ops later, outside this context)
        self._tok = None if torch.compiler.is_compiling() else _single_use.set(True)
        return self

    def __exit__(self, *exc):
        if self._tok is not None:
            _single_use.reset(self._tok)
        return False


class _PreparedCache:
    """Backend layouts derived from canonical weights, per (kernel, weight tensors).

    An entry is valid while the same bytes, viewed the same way (storage, data
    pointer, shape, strides, dtype), are alive at the same version counter: an
    in-place update (``load_state_dict``, an optimizer step), a move to another
    device or a new tensor re-prepares; another view object of the same bytes
    (what a compiled graph passes on every call) does not. Entries die with
    their storages.
    """

    def __init__(self):
        self._d: dict = {}
        self._lock = threading.Lock()

    def get(self, kernel: Kernel, weights: tuple, static: dict | None = None):
        # keyed by the prepare function: the kernels of one backend that prepare alike share one layout memo
        tag = (kernel.prepare,)
        if static:
            tag += tuple(sorted((k, _hashable(v)) for k, v in static.items()))
        return self.derive(tag, weights, lambda: kernel.prepare(*weights, **(static or {})))

    def derive(self, tag: tuple, weights: tuple, build: Callable[[], Any]):
        """``build()``, kept per ``tag`` (hashable: what the value depends on besides the tensors) and per
        version of the tensors ``weights``; used for kernels' prepared layouts and for values a layer derives
        from its weights (codes, sign bits)."""
        if _single_use_get():
            return build()
        key = tag + tuple(_weight_key(w) for w in weights)
        state = tuple(_tensor_state(w) for w in weights)
        e = self._d.get(key)
        # The key holds the ids of the weights' storages with each weight's place in its storage; an entry is
        # dropped (weakref callback) the moment one of those storages dies, before its id can be reused, so a hit
        # is always for these very bytes, viewed the same way.
        if e is not None and e[0] == state:
            return e[1]
        dev = _first_device(weights)
        if _capturing(dev):
            # A miss while a CUDA graph is being captured: these tensors were made by the graph (a training step's
            # weight codes) or changed since they were prepared. Prepared inline and not kept, the preparation is
            # captured with the graph, so every replay prepares what they hold then; kept, every replay would read
            # the layout of the values they held at capture.
            return build()
        # kept past this call: never in a CUDA graph's warm-up pool (graph_pool.py)
        prepared = outside_graph_pool(build, dev)
        tensors = tuple(_anchor(w) for w in weights if isinstance(w, torch.Tensor))
        refs = tuple(weakref.ref(w, self._make_cb(key)) for w in tensors)
        with self._lock:
            self._d[key] = (state, prepared, refs)
        return prepared

    def _make_cb(self, key):
        d = self._d

        def cb(_ref):
            d.pop(key, None)
        return cb

    def clear(self):
        with self._lock:
            self._d.clear()

    def __len__(self):
        return len(self._d)


def _first_device(args: tuple):
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return None


def _weightless_call(d: Decision, args: tuple) -> Callable:
    """The call a decision of an op without weight arguments makes for every call of its signature: the kernel's
    ``bind`` plan where it has one for these arguments (its checks and argument conversions made once; a plan of
    such a kernel reads every tensor from each call's arguments, as ``Resolved`` relies on), else its general
    entry. Kept on the decision, so the decision key (shapes, dtypes, devices, every other argument's value)
    decides reuse. Not bound during CUDA graph capture (what a plan allocates would live in the graph's pool):
    such a call takes the general entry and leaves the binding to a later call."""
    k = d.kernel
    if k.bind is None:
        d.call = k.fn
        return k.fn
    dev = _first_device(args)
    if _capturing(dev):
        return k.fn
    try:
        fn = outside_graph_pool(lambda: k.bind(*args), dev)
    except Exception:  # noqa: BLE001 - a plan is an optimisation: the general entry serves (and reports) the call
        fn = None
    if fn is None or getattr(fn, "input_only", False):   # (an input-only plan holds the other arguments: not general)
        fn = k.fn
    d.call = fn
    return fn


def _capturing(dev) -> bool:
    return dev is not None and dev.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _anchor(w: torch.Tensor):
    """What bounds the life of a prepared layout of ``w``: its storage (one Python object per storage, shared by
    every view of it), or w itself where it has none (a tensor subclass). A compiled graph hands a kernel a fresh
    view of a weight buffer on every call (a packed layer's reshaped codes); keyed by the storage and the view's
    place in it, such calls find the layout prepared by the first, and the entry dies with the storage."""
    try:
        return w.untyped_storage()
    except Exception:  # noqa: BLE001 - subclasses without a storage of their own (any error: keyed by object)
        return w


def _weight_key(w):
    if not isinstance(w, torch.Tensor):
        return id(w)
    a = _anchor(w)
    if a is w:
        return id(w)
    return (id(a), w.data_ptr(), w.dtype, tuple(w.shape), w.stride())


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def _tensor_state(t):
    if not isinstance(t, torch.Tensor):
        return t
    try:
        v = t._version
    except RuntimeError:  # inference tensors have no version counter
        v = -1
    return (t.data_ptr(), v, t.device, t.dtype, t.shape)


prepared_cache = _PreparedCache()


# --------------------------------------------------------------------- router
def _needs(op_name: str) -> tuple[bool, bool]:
    """Whether any kernel of the op can depend on requires_grad / contiguity
    (if none can, those attributes stay out of the cache key: cheaper calls)."""
    grad = contig = False
    for k in _REG.kernels(op_name):
        c = k.capability
        if c.check is not None:
            return True, True
        grad = grad or (not c.training) or (not c.inference)
        contig = contig or c.contiguous_only
    return grad, contig


def make_key_fn(op, with_grad: bool, with_contig: bool):
    """Generate the cache-key function of an op from its schema.

    The key holds everything validation and capabilities can depend on:
    shape, dtype and device of every tensor (plus requires_grad and
    contiguity when some kernel cares), and the value of every other argument.
    It is generated as straight-line code because attribute reads dominate
    the cost of a cached call.
    """
    parts, names = [], []
    for i, arg in enumerate(op.overload._schema.arguments[:len(op.arg_names)]):
        v = f"a{i}"
        names.append(v)
        t = str(arg.type)
        if t in ("Tensor", "Optional[Tensor]"):
            fields = [f"{v}.shape", f"{v}.dtype", f"{v}.device"]
            if with_grad:
                fields.append(f"{v}.requires_grad")
            if with_contig:
                fields.append(f"{v}.is_contiguous()")
            key = "(" + ", ".join(fields) + ")"
            parts.append(key if t == "Tensor" else f"(None if {v} is None else {key})")
        elif t.startswith("List[") and "Tensor" not in t:
            parts.append(f"tuple({v})")
        elif "Tensor" in t:  # lists of tensors: the generic (slower) path
            parts.append(f"_argkey(({v},))")
        else:
            parts.append(v)
    src = f"def key({', '.join(names)}):\n    return ({', '.join(parts)},)\n"
    ns = {"_argkey": _argkey}
    exec(compile(src, f"<bie key {op.name}>", "exec"), ns)  # noqa: S102 - generated from the op schema
    return ns["key"]


def make_router(op):
    """The one implementation torch.library calls for ``op`` on every device
    (and, as ``route.resolve``, the lookup behind :func:`resolve`)."""
    name = op.name
    weight_idx = tuple(op.weight_args)
    validate = op.validate
    nargs = len(op.arg_names)
    reg = _REG
    ctx_get = _context_pref.get
    rec_get = _recorder.get
    # Per-op decision table, rebuilt when the set of kernels changes
    # (a backend registered, the registry reset, caches cleared).
    gen = -1
    key_fn = None
    table: dict = {}
    value_idx = tuple(op.value_args) if validate is not None else ()
    defaults = op.defaults

    def refresh():
        nonlocal gen, key_fn, table
        reg.ensure_discovered()
        gen = reg.generation
        key_fn = make_key_fn(op, *_needs(name))
        table = _tables[name] = {}

    def lookup(args: tuple, pref) -> Decision:
        """The cached decision for ``args`` under ``pref`` (decided, validated
        and cached on a miss), recorded for ``explain``: the one lookup behind
        both a dispatched call and :func:`resolve`."""
        if gen != reg.generation:  # kernels changed or caches were cleared
            refresh()
        key = (pref, key_fn(*args))
        d = table.get(key)
        if d is None:
            if validate is not None:
                validate(*args)
            d = decide(op, args, pref)
            if len(table) >= _MAX_DECISIONS:
                table.clear()
            table[key] = d
            if value_idx:
                _mark_validated(args, value_idx)
        elif value_idx and not _values_validated(args, value_idx):
            # same shapes as a cached decision, but index/code values not seen
            # yet: check them (never hand a kernel an out-of-range index)
            validate(*args)
            _mark_validated(args, value_idx)
        rec = rec_get()
        if rec is not None:
            rec.append((_layer_name.get(), d))
        return d

    def route(*args):
        # torch.library drops a trailing argument equal to its default, so the
        # backend string is present only when it is not "".
        if len(args) > nargs:
            pref = _layer_pref(args[nargs])
            args = args[:nargs]
        else:
            if len(args) < nargs:   # trailing arguments equal to their schema defaults were dropped
                args = args + defaults[len(args):]
            pref = ctx_get()
            if pref is None:
                pref = _global_pref
                if pref is None:
                    pref = _env_pref if _env_read else _read_env()
        d = lookup(args, pref)
        k = d.kernel
        if k.prepare is None:
            if weight_idx:   # (a plan may hold the weights it was made with: only an op without any is bound)
                return k.fn(*args)
            fn = d.call
            if fn is None:
                fn = _weightless_call(d, args)
            return fn(*args)
        if not k.prepare_static:
            return k.fn(*args, prepared=prepared_cache.get(k, tuple(args[i] for i in weight_idx)))
        w, static = k.prepare_inputs(op, args)
        return k.fn(*args, prepared=prepared_cache.get(k, w, static))

    def resolve(args: tuple, backend: str = "") -> "Resolved":
        if len(args) < nargs:
            args = tuple(args) + defaults[len(args):]
        pref = _layer_pref(backend) if backend else current_preference()
        d = lookup(args, pref)
        k = d.kernel
        weights, prepared = (), None
        if k.prepare is not None:
            weights, static = k.prepare_inputs(op, args)
            prepared = prepared_cache.get(k, weights, static or None)
        call = None
        if k.bind is not None:
            # the kernel's own per-signature plan (layouts looked up, sizes and
            # buffers fixed once); None: it has no faster call for these arguments
            call = k.bind(*args, prepared=prepared) if k.prepare is not None else k.bind(*args)
        if call is None:
            call = k.fn if k.prepare is None else functools.partial(k.fn, prepared=prepared)
        return Resolved(op, d, call, gen, pref, key_fn(*args), key_fn, weight_idx if weights else (), weights,
                        value_idx)

    route.__name__ = f"bie_route_{name}"
    route.resolve = resolve
    return route


class Resolved:
    """The kernel the dispatcher chose for one call signature, bound to its
    prepared weight layout (through the kernel's ``bind`` plan where it has
    one): ``r(*args)`` calls it with no dispatch work.

    For callers that make the same call many times (a layer's inference path):
    check :meth:`valid` before each call and :func:`resolve` again when it says
    no. It says no as soon as anything the choice was made from changes: the
    registry generation (a backend registered, ``clear_caches``), the
    preference (per-layer ``backend=``, the ``use_backend`` ContextVar,
    ``set_backend``, ``BIE_BACKEND``), the argument signature (the op's decision
    key: shape, dtype, device of every tensor, contiguity and requires_grad
    where a kernel cares, every other argument's value), or a weight (another
    tensor object, or the same one with new storage or a new version: its
    prepared layout would be stale). Index/code arguments are re-validated as
    on every dispatched call, and ``explain`` still records the decision.
    """

    __slots__ = ("op", "decision", "fn", "_gen", "_pref", "_key", "_key_fn", "_widx", "_weights", "_wstate",
                 "_value_idx")

    def __init__(self, op, decision, fn, gen, pref, key, key_fn, widx, weights, value_idx):
        #: the kernel bound to its prepared weights: ``fn(*args)`` (what ``r(*args)`` calls)
        self.fn = fn
        self.op, self.decision = op, decision
        self._gen, self._pref, self._key, self._key_fn = gen, pref, key, key_fn
        self._widx, self._weights, self._value_idx = widx, weights, value_idx
        self._wstate = tuple(_weight_state(w) for w in weights)

    @property
    def kernel(self) -> Kernel:
        return self.decision.kernel

    def __call__(self, *args):
        return self.fn(*args)

    def valid(self, args: tuple, backend: str = "", weights: bool = True) -> bool:
        """Whether the dispatcher would make the same call for ``args`` now (``weights=False``: the caller has
        checked the weight arguments itself, as the registered ops' memo does: bie_core/ops/_memo.py)."""
        if self._gen != _REG.generation:
            return False
        if backend:
            pref = _layer_pref(backend)
        else:
            pref = _context_pref.get()
            if pref is None:
                pref = _global_pref
                if pref is None:
                    pref = _env_pref if _env_read else _read_env()
        if pref is not self._pref and pref != self._pref:
            return False
        if self._key_fn(*args) != self._key:
            return False
        widx = self._widx if weights else ()
        if widx:
            if len(widx) == 1:  # the common case, written out
                a, w, st = args[widx[0]], self._weights[0], self._wstate[0]
                # (the same object: whether it is an inference tensor cannot have changed)
                if a is not w or (st is not None and (a.data_ptr() != st[0] or
                                                      (st[1] is not None and a._version != st[1]))):
                    return False
            else:
                for i, w, st in zip(widx, self._weights, self._wstate):
                    a = args[i]
                    if a is not w or _weight_state(a) != st:
                        return False
        if self._value_idx and not _values_validated(args, self._value_idx):
            return False
        rec = _recorder.get()
        if rec is not None:
            rec.append((_layer_name.get(), self.decision))
        return True


def _weight_state(t):
    # storage and version (shape, dtype and device are in the decision key);
    # an inference tensor has no version counter, and cannot be modified in
    # place outside inference mode: its storage alone
    if type(t) is not torch.Tensor and not isinstance(t, torch.Tensor):
        return t
    if t.is_inference():
        return (t.data_ptr(), None)
    return (t.data_ptr(), t._version)


def resolve(op, *args, backend: str = "") -> Resolved:
    """The kernel the dispatcher picks for ``op(*args, backend=backend)``, bound
    to its prepared weights, as a :class:`Resolved` (see there for when it must
    be resolved again). Validation, precedence, strictness and fallback
    warnings are exactly those of a dispatched call."""
    if isinstance(op, str):
        op = get_op(op)
    return op._route.resolve(args, backend or "")


def native_kernel_serves(problem: Problem, backend: str = "") -> bool:
    """Whether the kernel a call of ``problem`` would run is not the reference: the first kernel of the chosen
    backends that accepts it (the preference in force, or the layer's ``backend``), or automatic selection's
    choice. A quiet question (no warning, no error, nothing cached) for a layer choosing between two ops before it
    calls one."""
    pref = current_preference(backend)
    kernels = _REG.kernels(problem.op)   # (highest priority first)
    if pref is not None and not isinstance(pref, _Auto):
        for qualname in pref[0]:
            name, _, kernel = qualname.partition(":")
            for k in kernels:
                if k.backend == name and (not kernel or k.name == kernel) and not k.reasons(problem):
                    return not k.reference
        return False
    chosen = _auto_choice(problem, kernels)[0]
    return chosen is not None and not chosen.reference


#: CPU index/code tensors whose values passed validation: id -> (storage,
#: version, weak ref). An entry is dropped by the weak reference's callback the
#: moment its tensor dies, so a new tensor that reuses the id and address is
#: never taken for a validated one.
_validated: dict = {}


def _value_state(t):
    try:
        return (t.data_ptr(), t._version)
    except RuntimeError:  # inference tensors have no version counter: never trusted
        return None


def _values_validated(args, idx) -> bool:
    for i in idx:
        t = args[i]
        if t is None or t.device.type != "cpu":
            continue  # accelerator kernels bound-check themselves (no host sync)
        e = _validated.get(id(t))
        if e is None or e[0] != _value_state(t):
            return False
    return True


def _mark_validated(args, idx) -> None:
    for i in idx:
        t = args[i]
        if t is not None and t.device.type == "cpu":
            st = _value_state(t)
            if st is not None:
                key = id(t)
                _validated[key] = (st, weakref.ref(t, lambda _r, key=key: _validated.pop(key, None)))


#: functions that forget what other modules keep from resolved calls (the bound calls of the registered ops and
#: of the compiled QAT ops): they would be stale after a clear, and they hold prepared layouts
clear_hooks: list = []


def clear_caches() -> None:
    """Forget cached decisions, prepared layouts, bound calls kept by the ops and the BIE_BACKEND reading."""
    global _env_read
    _tables.clear()
    _REG.generation += 1  # every router rebuilds its table on its next call
    prepared_cache.clear()
    for forget in clear_hooks:
        forget()
    _warned.clear()
    _env_read = False


def reset() -> None:
    """Back to a fresh process state: automatic selection, caches cleared."""
    global _global_pref
    _global_pref = None
    clear_caches()

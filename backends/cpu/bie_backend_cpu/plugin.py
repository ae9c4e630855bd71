"""Kernel registration of bie-backend-cpu (loaded on first use)."""
from __future__ import annotations

import traceback

from bie_core.backend_api import Capability, hookimpl
from bie_core.backend_api import all_ops

from . import reference

REFERENCE_PRIORITY = 0

#: Ops of this bie-core that this reference does not define (a newer core with
#: an older bie-backend-cpu): reported by `bie backends`, not fatal, so that
#: every other op keeps working. tests/test_core_opset.py keeps this empty.
MISSING: list = []


def _reference_fn(op_name: str):
    for mod in (reference.binary, reference.integer, reference.dynamic, getattr(reference, "weight_only", None)):
        if mod is not None and hasattr(mod, op_name):
            return getattr(mod, op_name)
    return None


@hookimpl
def bie_register_kernels(registry):
    # The reference serves every op on every device (device-agnostic PyTorch),
    # at the lowest priority: any specialised kernel that fits wins.
    MISSING.clear()
    for op in all_ops():
        fn = _reference_fn(op.name)
        if fn is None:
            MISSING.append(op.name)
            continue
        registry.register(op.name, fn, capability=Capability(devices=("*",)),
                          priority=REFERENCE_PRIORITY, name=f"reference.{op.name}", reference=True,
                          description="plain PyTorch reference")
    _register_native(registry)


_native_error = None  # (reason, traceback) if the native package itself failed


def _register_native(registry):
    # Native C++ kernels (priority 50): built on first use, cached. Whatever
    # goes wrong there (no compiler, failed build, BIE_CPU_NATIVE=0) leaves
    # the reference kernels above in place and is reported by bie_report.
    global _native_error
    _native_error = None
    try:
        from . import native
        native.register_kernels(registry)
    except Exception as exc:  # noqa: BLE001 - the backend must never break
        _native_error = (f"{type(exc).__name__}: {exc}", traceback.format_exc())


@hookimpl
def bie_report():
    lines = ["reference kernels: plain PyTorch, every op, any device"]
    if MISSING:
        lines.append(f"WARNING: no reference for ops {MISSING} (upgrade bie-backend-cpu)")
    if _native_error is not None:
        lines.append(f"native kernels: unavailable: {_native_error[0]}")
    else:
        from . import native
        lines.extend(native.report_lines())
    return lines


@hookimpl
def bie_build(verbose):
    from . import native
    return native.build(verbose=bool(verbose))

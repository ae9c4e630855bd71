"""Kernel registration of bie-backend-cpu (loaded on first use)."""
from __future__ import annotations

from bie_core import Capability, hookimpl
from bie_core.ops import all_ops

from . import reference

REFERENCE_PRIORITY = 0

#: Ops of this bie-core that this reference does not define (a newer core with
#: an older bie-backend-cpu): reported by `bie backends`, not fatal, so that
#: every other op keeps working. tests/test_core_opset.py keeps this empty.
MISSING: list = []


def _reference_fn(op_name: str):
    for mod in (reference.binary, reference.integer, getattr(reference, "weight_only", None)):
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


@hookimpl
def bie_report():
    lines = ["reference kernels: plain PyTorch, every op, any device"]
    if MISSING:
        lines.append(f"WARNING: no reference for ops {MISSING} (upgrade bie-backend-cpu)")
    return lines

"""Kernel registration of bie-backend-cutlass (loaded on first use).

Importing this module compiles nothing: each family's extension is built or
loaded the first time one of its kernels runs (or by ``bie build cutlass``).
Priority 200 puts these kernels above bie-backend-cuda (100) for the shapes
their capabilities accept; elsewhere the dispatcher moves on to the next kernel.
"""
from __future__ import annotations

import dataclasses

import torch

from bie_core.backend_api import hookimpl

from . import _build, binary, binary_conv, integer, tuning, weight_only
from .plugin_extensions import EXTENSIONS

PRIORITY = 200


class _FamilyRegistrar:
    """The registrar a family registers through: every capability also
    refuses, with the reason, once the family's extension failed to build in
    this process — so after one loud failure an automatic choice falls back to
    the next kernel (with the usual warning) instead of failing every call."""

    def __init__(self, registry, ext):
        self._registry, self._ext = registry, ext

    def register(self, op, fn, *, capability=None, **kw):
        from bie_core.backend_api import Capability
        capability = capability if capability is not None else Capability()
        ext, inner = self._ext, capability.check

        def check(p):
            return _build.failure(ext) or (inner(p) if inner is not None else None)

        return self._registry.register(op, fn, capability=dataclasses.replace(capability, check=check), **kw)

    def __getattr__(self, name):
        return getattr(self._registry, name)


@hookimpl
def bie_register_kernels(registry):
    binary.register(_FamilyRegistrar(registry, binary.EXTENSION), PRIORITY)
    integer.register(_FamilyRegistrar(registry, integer.EXTENSION), PRIORITY)
    weight_only.register(_FamilyRegistrar(registry, weight_only.EXTENSION), PRIORITY)
    # above the family's im2col conv and bie-backend-cuda's direct conv wherever it serves (measured faster on every
    # shape it takes: benchmarks/results/qat_conv.md)
    binary_conv.register(_FamilyRegistrar(registry, binary_conv.EXTENSION), PRIORITY + 10)


@hookimpl
def bie_build(verbose):
    lines, failed = [], []
    for ext in EXTENSIONS:
        try:
            lines.append(f"'{ext.family}' kernels ready: {_build.load(ext, verbose=bool(verbose))}")
        except Exception as exc:  # noqa: BLE001 - build every family, report each
            failed.append(f"'{ext.family}' kernels failed to build: {exc}")
    if failed:
        raise RuntimeError("; ".join(failed + lines))
    return "; ".join(lines)


@hookimpl
def bie_report():
    try:
        name = torch.cuda.get_device_name()
        cc = torch.cuda.get_device_capability()
        lines = [f"device: {name} (sm_{cc[0]}{cc[1]})",
                 f"CUTLASS {_build.cutlass_version()} headers: {_build.cutlass_root() / 'include'}"]
        for ext in EXTENSIONS:
            state = (f"built ({_build.build_dir(ext)})" if _build.is_built(ext)
                     else "not built yet: compiled on first use, or run `bie build cutlass`")
            lines.append(f"{ext.family} kernels: {state}")
        lines.append(f"tuning table: {tuning.table_path()}"
                     + ("" if tuning.enabled() else " (tuning off: BIE_CUTLASS_TUNE=0)"))
        return lines
    except Exception as exc:  # noqa: BLE001 - a report line, never an error
        return [f"cutlass: {exc}"]

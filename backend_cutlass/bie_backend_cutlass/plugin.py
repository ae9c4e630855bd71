"""Kernel registration of bie-backend-cutlass (loaded on first use).

Importing this module compiles nothing: each family's extension is built or
loaded the first time one of its kernels runs (or by ``bie build cutlass``).
Priority 200 puts these kernels above bie-backend-cuda (100) for the shapes
their capabilities accept; elsewhere the dispatcher moves on to the next kernel.
"""
from __future__ import annotations

import torch

from bie_core import hookimpl

from . import _build, binary, integer, tuning
from .plugin_extensions import EXTENSIONS

PRIORITY = 200


@hookimpl
def bie_register_kernels(registry):
    binary.register(registry, PRIORITY)
    integer.register(registry, PRIORITY)


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

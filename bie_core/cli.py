"""The ``bie`` command (also ``python -m bie_core``).

    bie backends [--json] [-v]   a table of the discovered plugins: status, distribution, devices,
                                 number of kernels, the cause and fix of any not loaded; -v adds
                                 kernels, backend reports and tracebacks (exit 0 even when a
                                 plugin is broken)
    bie explain [--backend B]    walk a small example through the dispatcher
    bie ops                      the op set with each op's schema and definition
    bie build NAME               build a backend's native code ahead of time
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch


def _cmd_backends(args) -> int:
    from . import backends
    from .plugins.hints import fix_hint
    from .version import API_VERSION, __version__
    recs = backends()
    if args.json:
        print(json.dumps([r.as_dict() for r in recs], indent=2))
        return 0
    print(f"bie-core {__version__} (plugin API {API_VERSION[0]}.{API_VERSION[1]}), torch {torch.__version__}")
    if not recs:
        print("no backend plugin found: pip install bie-backend-cpu (the reference) and an accelerated backend")
        return 0
    rows = [("backend", "status", "distribution", "devices", "kernels")]
    for r in recs:
        rows.append((r.name, r.status.upper(), f"{r.distribution or '?'} {r.version or ''}".strip(),
                     ",".join(r.devices) or "-", str(len(r.kernels))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if i == 0:
            continue
        r = recs[i - 1]
        if r.status != "loaded":
            print(f"    cause: {r.cause or r.status}")
            hint = fix_hint(r)
            if hint:
                print(f"    fix: {hint}")
    if args.verbose:
        for r in recs:
            _print_details(r)
    else:
        print("\n(bie backends -v: descriptions, kernels, backend reports and original tracebacks)")
    return 0


def _print_details(r) -> None:
    print(f"\n{r.name} ({r.status}, api {r.api_version or '?'})")
    if r.description:
        print(f"  {r.description}")
    if r.traceback:
        print("  traceback:\n    " + r.traceback.rstrip().replace("\n", "\n    "))
    if r.kernels:
        by_op: dict = {}
        for k in r.kernels:
            by_op.setdefault(k.op, []).append(k)
        print(f"  kernels ({len(r.kernels)}):")
        for op, ks in by_op.items():
            names = ", ".join(f"{k.name}@{k.priority}" for k in ks)
            print(f"    {op:22s} {names}")
    if r.status == "loaded":
        from .plugins.registry import get_registry
        try:
            for lines in get_registry().call_hook("bie_report", r.name):
                for line in (lines or []):
                    print(f"  {line}")
        except Exception as exc:  # a report hook must never break the listing
            print(f"  (bie_report failed: {type(exc).__name__}: {exc})")


def _example_calls(device):
    """A small walk through the op families, as a layer would call them."""
    from . import ops
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, generator=g).to(device)
    w = torch.randn(32, 64, generator=g).to(device)
    xb, wb = ops.pack_signs(x), ops.pack_signs(w)
    yield "binary linear: pack activations", ops.pack_signs, (x,)
    yield "binary linear: GEMM with fused scale, bf16 out", ops.binary_gemm, \
        (xb, wb, 64, torch.tensor(0.5, device=device), None, torch.bfloat16)
    xi = torch.randint(-8, 8, (4, 64), generator=g, dtype=torch.int8).to(device)
    wi = torch.randint(-8, 8, (32, 64), generator=g, dtype=torch.int8).to(device)
    yield "4-bit QAT linear: integer GEMM", ops.int_gemm, (xi, wi, 4, 4, None, None, None)
    img = torch.randn(2, 8, 10, 10, generator=g).to(device)
    wc = ops.pack_signs(torch.randn(16, 8 * 9, generator=g).to(device))
    yield "binary conv 3x3", ops.binary_conv2d, (img, wc, [3, 3], [1, 1], [1, 1], [1, 1], 1, -1.0, None, None, None)


def _usable_device(spec: str):
    """``torch.device(spec)`` if tensors can be made there, else None after
    printing why (a device torch does not know, or one this torch lacks)."""
    from .plugins.hints import cuda_cause, mps_cause
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError):
        print(f"bie explain: --device {spec!r} is not a torch device; use cpu, cuda, cuda:N or mps", file=sys.stderr)
        return None
    try:
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError, ValueError) as exc:
        cause = {"cuda": cuda_cause, "mps": mps_cause}.get(device.type, lambda: "")() or \
            (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"bie explain: --device {spec}: cannot create tensors there: {cause}", file=sys.stderr)
        return None
    return device


def _cmd_explain(args) -> int:
    from . import explain
    from .errors import BieError
    from .dispatch import validate_choice
    device = _usable_device(args.device)
    if device is None:
        return 2
    pref = args.backend
    validate_choice(pref, "bie explain --backend")  # unknown or unusable: exit 2 with the reason
    print(f"bie explain on {device}" + (f" with backend={pref}" if pref else " (automatic selection)"))
    status = 0
    for title, op, a in _example_calls(device):
        print(f"\n# {title}")
        try:
            print(explain(op, *a, backend=pref))
        except BieError as err:
            print(f"  error: {err}")
            status = 1
    print("\nOverride order: per-layer backend= > with bie_core.use_backend(...) > "
          "bie_core.set_backend(...) > env BIE_BACKEND > automatic.")
    return status


def _cmd_ops(args) -> int:
    from .ops import all_ops
    for op in all_ops():
        print(f"bie::{op.name}{str(op.overload._schema).split(op.name, 1)[1]}")
        if op.doc:
            print(f"    {op.doc}")
    return 0


def _cmd_build(args) -> int:
    from .dispatch import validate_choice
    from .plugins.registry import get_registry
    validate_choice(args.name, "bie build")
    results = get_registry().call_hook("bie_build", args.name, verbose=True)
    if not results:
        print(f"backend {args.name} has nothing to build")
    for r in results:
        print(r)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bie", description="bie: low-bit PyTorch layers on pluggable backends")
    sub = p.add_subparsers(dest="cmd")
    b = sub.add_parser("backends", help="list discovered backend plugins")
    b.add_argument("--json", action="store_true")
    b.add_argument("-v", "--verbose", action="store_true",
                   help="also each backend's description, kernels, report and original traceback")
    e = sub.add_parser("explain", help="walk a small example through the dispatcher")
    e.add_argument("--backend", default=None)
    e.add_argument("--device", default="cpu")
    sub.add_parser("ops", help="list the op set")
    bd = sub.add_parser("build", help="build a backend's native code ahead of time")
    bd.add_argument("name")
    args = p.parse_args(argv)
    if args.cmd is None:
        args = p.parse_args(["backends"])
    try:
        rc = {"backends": _cmd_backends, "explain": _cmd_explain, "ops": _cmd_ops,
              "build": _cmd_build}[args.cmd](args)
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        # the reader went away (``bie backends --json | head``): not an error of
        # ours; point stdout at devnull so the interpreter's final flush is quiet
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 0
    except Exception as err:
        from .errors import BieError
        if isinstance(err, BieError):
            print(f"bie: {err}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

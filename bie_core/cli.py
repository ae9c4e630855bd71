"""The ``bie`` command (also ``python -m bie_core``).

    bie backends [--json] [-v]   every discovered plugin: distribution, version, status, cause,
                                 devices, kernels (exit 0 even when a plugin is broken)
    bie explain [--backend B]    walk a small example through the dispatcher
    bie ops                      the op set with each op's schema and definition
    bie build NAME               build a backend's native code ahead of time
"""
from __future__ import annotations

import argparse
import json
import sys

import torch


def _cmd_backends(args) -> int:
    from . import backends
    from .version import API_VERSION, __version__
    recs = backends()
    if args.json:
        print(json.dumps([r.as_dict() for r in recs], indent=2))
        return 0
    print(f"bie-core {__version__} (plugin API {API_VERSION[0]}.{API_VERSION[1]}), torch {torch.__version__}")
    if not recs:
        print("no backend plugin found: pip install bie-backend-cpu (the reference) and an accelerated backend")
    for r in recs:
        dist = f"{r.distribution or '?'} {r.version or ''}".strip()
        print(f"\n{r.name:10s} {r.status.upper():12s} {dist}  api {r.api_version or '?'}")
        if r.description:
            print(f"  {r.description}")
        if r.devices:
            print(f"  devices: {', '.join(r.devices)}")
        if r.cause:
            print(f"  cause: {r.cause}")
            if r.install_hint and r.status != "loaded":
                print(f"  fix: {r.install_hint}")
        if r.traceback and args.verbose:
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
    if any(r.status == "broken" for r in recs) and not args.verbose:
        print("\n(bie backends -v shows the original tracebacks)")
    return 0


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


def _cmd_explain(args) -> int:
    from . import explain
    from .errors import BieError
    from .dispatch import validate_choice
    device = torch.device(args.device)
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
    b.add_argument("-v", "--verbose", action="store_true", help="show original tracebacks")
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
        return {"backends": _cmd_backends, "explain": _cmd_explain, "ops": _cmd_ops,
                "build": _cmd_build}[args.cmd](args)
    except Exception as err:
        from .errors import BieError
        if isinstance(err, BieError):
            print(f"bie: {err}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The conformance kit must catch wrong and dishonest kernels (a kit that cannot
fail is a defect), and the op set must be complete in the reference."""
from __future__ import annotations

import textwrap

import pytest
import torch

from bie_core import ops

WRONG_BACKEND = '''
import torch
import bie_core
from bie_core import Capability
from bie_backend_cpu.reference import binary, integer

def sloppy_pack(x):
    # the classic mistake: sgn(0) = -1 (x > 0 instead of x >= 0)
    return binary.pack_signs(torch.where(x == 0, torch.full_like(x, -1), x))

def liar_gemm(a, b, k, scale, bias, out_dtype):
    # claims every K but silently ignores the last partial byte
    kk = (k // 8) * 8
    if kk != k and kk > 0:
        return binary.binary_gemm(a[:, :kk // 8].contiguous(), b[:, :kk // 8].contiguous(), kk,
                                  scale, bias, out_dtype)
    return binary.binary_gemm(a, b, k, scale, bias, out_dtype)

def honest_int(a, b, a_bits, b_bits, scale, bias, out_dtype):
    return integer.int_gemm(a, b, a_bits, b_bits, scale, bias, out_dtype)

class P:
    @bie_core.hookimpl
    def bie_register_kernels(self, registry):
        registry.register("pack_signs", sloppy_pack, name="sloppy_pack", priority=10,
                          capability=Capability(devices=("cpu",)))
        registry.register("binary_gemm", liar_gemm, name="liar_gemm", priority=10,
                          capability=Capability(devices=("cpu",)))
        registry.register("int_gemm", honest_int, name="k64_int_gemm", priority=10,
                          capability=Capability(devices=("cpu",), divisibility={"K": 64}))

bie_core.register_backend(bie_core.BackendDescriptor("wrong", "1.0", ("cpu",), load=P))
'''


@pytest.fixture(autouse=True)
def _no_native_build(monkeypatch):
    # pytester runs with a temporary HOME: keep the native CPU build out of it
    monkeypatch.setenv("BIE_CPU_NATIVE", "0")


def test_kit_catches_wrong_kernels(pytester):
    pytester.makeconftest(WRONG_BACKEND)
    result = pytester.runpytest_subprocess("--bie-backend=wrong", "-q", "-p", "no:cacheprovider")
    out = result.stdout.str()
    # sgn(0) mistake and the dropped tail are caught, with the kernel named
    assert "FAILED" in out
    assert "wrong:sloppy_pack" in out and "not bit-exact" in out
    assert "wrong:liar_gemm" in out
    # the honest kernel passes its accepted cases and is never called on K % 64 != 0
    assert "bie conformance coverage" in out
    row = next(ln for ln in out.splitlines() if ln.startswith("int_gemm "))
    ran, disclaimed = row.split()[1], row.split("[")[1].rstrip("] ")
    assert ran.split("/")[0] == ran.split("/")[1] != "0", row
    assert disclaimed.split("/")[0] == disclaimed.split("/")[1] != "0", row
    lines = [ln for ln in out.splitlines() if ln.startswith("FAILED")]
    assert lines and not any("k64_int_gemm" in ln for ln in lines), lines
    assert result.ret == 1


def test_kit_passes_honest_kernels_with_narrow_capabilities(pytester):
    # "small" disclaims K > 64: the kit checks it on the cases it accepts, and on
    # the others that explicit dispatch to the backend routes them to "general"
    # without ever calling "small".
    pytester.makeconftest(textwrap.dedent('''
        import bie_core
        from bie_core import Capability
        from bie_backend_cpu.reference import integer
        class P:
            @bie_core.hookimpl
            def bie_register_kernels(self, registry):
                registry.register("int_gemm", integer.int_gemm, name="small", priority=20,
                                  capability=Capability(devices=("cpu",), max_dims={"K": 64}))
                registry.register("int_gemm", integer.int_gemm, name="general", priority=5,
                                  capability=Capability(devices=("cpu",)))
        bie_core.register_backend(bie_core.BackendDescriptor("two", "1.0", ("cpu",), load=P))
    '''))
    result = pytester.runpytest_subprocess("--bie-backend=two", "-q", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()[-3000:]
    row = next(ln for ln in result.stdout.str().splitlines() if ln.startswith("int_gemm "))
    assert "[" in row, row  # disclaimed cases were checked


def test_unavailable_backend_fails_the_kit(pytester):
    pytester.makeconftest(textwrap.dedent('''
        import bie_core
        bie_core.register_backend(bie_core.BackendDescriptor(
            "ghost", "1.0", ("cuda",), probe=lambda: "no CUDA device", load=lambda: None))
    '''))
    result = pytester.runpytest_subprocess("--bie-backend=ghost", "-q", "-p", "no:cacheprovider")
    assert result.ret == 1
    assert "no CUDA device" in result.stdout.str()


def test_every_op_has_a_reference_fake_and_cases(fresh_bie):
    from bie_backend_cpu import plugin
    fresh_bie.ensure_discovered()
    assert plugin.MISSING == []
    for op in ops.all_ops():
        assert fresh_bie.reference_kernel(op.name) is not None, op.name
        assert op.cases is not None and op.validate is not None and op.doc, op.name
        n = sum(1 for _ in op.cases(torch.device("cpu"), torch.Generator().manual_seed(0)))
        assert n >= 4, f"{op.name} has only {n} conformance cases"


def test_cli_ops_and_explain(capsys, fresh_bie):
    from bie_core.cli import main
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    assert "bie::binary_gemm(Tensor a, Tensor b, int k" in out
    assert main(["explain"]) == 0
    out = capsys.readouterr().out
    assert "-> cpu:reference.binary_gemm" in out
    assert main(["explain", "--backend", "nope"]) == 2


@pytest.mark.parametrize("argv", [["-m", "bie_core", "backends"], ["-m", "bie_core"]])
def test_python_dash_m(argv):
    import subprocess
    import sys
    r = subprocess.run([sys.executable] + argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "cpu" in r.stdout and "LOADED" in r.stdout


def test_kit_catches_a_layout_that_keeps_its_weight(pytester):
    # a prepared layout holding the weight (here a view of it) would keep the dispatcher's cache entry for that
    # weight alive for good: every training step's fresh codes would stay in memory
    pytester.makeconftest(textwrap.dedent('''
        import bie_core
        from bie_core import Capability
        from bie_backend_cpu.reference import integer
        def hoarding_prepare(b):
            return {"rows": b[:1]}
        def int_gemm(a, b, a_bits, b_bits, scale, bias, out_dtype, prepared=None):
            return integer.int_gemm(a, b, a_bits, b_bits, scale, bias, out_dtype)
        class P:
            @bie_core.hookimpl
            def bie_register_kernels(self, registry):
                registry.register("int_gemm", int_gemm, name="hoarder", priority=10,
                                  capability=Capability(devices=("cpu",)), prepare=hoarding_prepare)
        bie_core.register_backend(bie_core.BackendDescriptor("hoard", "1.0", ("cpu",), load=P))
    '''))
    _kit_fails_with(pytester, "hoard", "prepared", "hoard:hoarder", "keeps weight argument")


def test_kit_checks_bind_plans(pytester):
    # a bind plan is what the layers' bound calls and dispatched calls of an op without weights run: the kit
    # checks it against the reference like the kernel's fn, and for such an op on new values of the signature
    # (a plan that kept the values it was made with is caught)
    pytester.makeconftest(textwrap.dedent('''
        import bie_core
        from bie_core import Capability
        from bie_backend_cpu.reference import integer
        def quantize_int(x, scale, bits, shift=None, out_dtype=None):
            return integer.quantize_int(x, scale, bits, shift, out_dtype)
        def bind(x, scale, bits, shift=None, out_dtype=None):
            first = integer.quantize_int(x, scale, bits, shift, out_dtype)
            return lambda *args: first          # the first call's result, whatever the call
        class P:
            @bie_core.hookimpl
            def bie_register_kernels(self, registry):
                registry.register("quantize_int", quantize_int, name="stale", priority=10,
                                  capability=Capability(devices=("cpu",)), bind=bind)
        bie_core.register_backend(bie_core.BackendDescriptor("stale", "1.0", ("cpu",), load=P))
    '''))
    _kit_fails_with(pytester, "stale", "test_kernel", "stale:stale", "bind plan, new values of the signature")


def _kit_fails_with(pytester, backend: str, select: str, *needles: str) -> None:
    """The kit, run on the conftest's backend for the tests ``select`` picks, fails and says each of ``needles``."""
    result = pytester.runpytest_subprocess(f"--bie-backend={backend}", "-q", "-p", "no:cacheprovider", "-k", select)
    out = result.stdout.str()
    assert result.ret == 1, out[-3000:]
    assert all(n in out for n in needles), out[-3000:]

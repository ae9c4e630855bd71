"""The example backend (examples/example_backend) passes the conformance kit."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "example_backend"


def test_example_backend_passes_the_kit(pytester, monkeypatch):
    monkeypatch.setenv("BIE_CPU_NATIVE", "0")
    pytester.makeconftest(textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {str(EXAMPLE)!r})
        import bie_core
        from bie_backend_example.descriptor import backend
        bie_core.register_backend(backend)
    '''))
    result = pytester.runpytest_subprocess("--bie-backend=example", "-q", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert result.ret == 0, out[-3000:]
    row = next(ln for ln in out.splitlines() if ln.startswith("binary_gemm "))
    assert "[" in row, row        # cases beyond max_dims were checked for honesty
    assert "test_prepared_layout" not in out or "failed" not in out


def test_example_backend_is_chosen_by_priority(fresh_bie):
    sys.path.insert(0, str(EXAMPLE))
    try:
        import torch
        import bie_core
        from bie_backend_example.descriptor import backend
        bie_core.register_backend(backend)
        a = bie_core.ops.pack_signs(torch.randn(3, 100))
        b = bie_core.ops.pack_signs(torch.randn(5, 100))
        ex = bie_core.explain(bie_core.ops.binary_gemm, a, b, 100, None, None, None)
        assert ex.chosen()["binary_gemm"] == "example:xor_popcount_table"
        with bie_core.use_backend("cpu"):
            ref = bie_core.ops.binary_gemm(a, b, 100, None, None, None)
        assert torch.equal(bie_core.ops.binary_gemm(a, b, 100, None, None, None), ref)
    finally:
        sys.path.remove(str(EXAMPLE))

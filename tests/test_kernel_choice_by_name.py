"""Choosing one kernel by its qualified name (``backend="name:kernel"``, ``use_backend``, ``set_backend``): the named
kernel runs wherever its capability accepts the call, its ``defer`` is ignored, and where it refuses the call the
error lists its reasons."""
from __future__ import annotations

import pytest
import torch

import bie_core
from bie_core import ops
from bie_core.backend_api import BackendDescriptor, Capability, hookimpl

CALLS = []


def _gemm(tag):
    def fn(a, b, k, scale, bias, out_dtype):
        CALLS.append(tag)
        from bie_backend_cpu.reference import binary as rb
        return rb.binary_gemm(a, b, k, scale, bias, out_dtype)
    fn.__name__ = tag
    return fn


class _Plugin:
    @hookimpl
    def bie_register_kernels(self, registry):
        # a GEMV that computes up to 4 rows but hands 2-4 rows to the GEMM under automatic selection
        registry.register("binary_gemm", _gemm("gemv"), name="gemv", priority=20,
                          capability=Capability(devices=("cpu",), max_dims={"M": 4},
                                                defer=lambda p: "M > 1" if p.dims["M"] > 1 else None))
        registry.register("binary_gemm", _gemm("gemm"), name="gemm", priority=10,
                          capability=Capability(devices=("cpu",)))


@pytest.fixture
def twokernels():
    bie_core.register_backend(BackendDescriptor("twokernels", "1.0", ("cpu",), load=_Plugin), _Plugin())
    CALLS.clear()
    yield
    bie_core.get_registry().unregister_backend("twokernels")
    bie_core.dispatch.clear_caches()


def _args(m):
    g = torch.Generator().manual_seed(m)
    a = torch.randint(0, 256, (m, 4), generator=g, dtype=torch.int32).to(torch.uint8)
    b = torch.randint(0, 256, (3, 4), generator=g, dtype=torch.int32).to(torch.uint8)
    return a, b, 32, None, None, None


def test_a_kernel_chosen_by_name_runs_where_its_capability_accepts(twokernels):
    ops.binary_gemm(*_args(1), backend="twokernels")
    ops.binary_gemm(*_args(3), backend="twokernels")
    assert CALLS == ["gemv", "gemm"]                       # automatic among the backend's kernels: gemv defers
    CALLS.clear()
    ops.binary_gemm(*_args(3), backend="twokernels:gemv")   # chosen by name: its defer is ignored
    with bie_core.use_backend("twokernels:gemv"):
        ops.binary_gemm(*_args(2))
    assert CALLS == ["gemv", "gemv"]
    e = bie_core.explain(ops.binary_gemm, *_args(3), backend="twokernels:gemm")
    assert e.chosen()["binary_gemm"] == "twokernels:gemm"


def test_a_kernel_chosen_by_name_refuses_with_its_reasons(twokernels):
    with pytest.raises(bie_core.NoKernelError, match=r"twokernels:gemv.*M=5 > maximum 4"):
        ops.binary_gemm(*_args(5), backend="twokernels:gemv")
    assert CALLS == []
    with pytest.raises(bie_core.UnknownBackendError, match="no kernel named 'nosuch'"):
        bie_core.set_backend("twokernels:nosuch")

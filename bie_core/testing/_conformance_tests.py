"""Test functions of the conformance kit (collected only under ``--bie-backend``).

Parametrized by :func:`bie_core.testing.plugin.pytest_generate_tests`.
"""
from __future__ import annotations

import pytest
import torch

from bie_core.testing import conformance as C


def test_backend_is_loaded(bie_backend_record):
    """An explicitly named backend must load here (explicit means strict)."""
    from bie_core.plugins.registry import get_registry
    rec = get_registry().record(bie_backend_record)
    assert rec is not None, f"backend {bie_backend_record} disappeared from the registry"
    assert rec.ok, f"backend {rec.name} is {rec.status}: {rec.cause}\n{rec.traceback or ''}"
    assert rec.kernels, f"backend {rec.name} registers no kernel"


def test_kernel(bie_kernel_case):
    kc = bie_kernel_case
    if kc.case.expect_error is not None:
        with pytest.raises(kc.case.expect_error):
            C.call_kernel(kc.kernel, kc.op, kc.case.args)
        return
    if kc.accepted:
        C.check_matches(kc)
    else:
        C.check_honesty(kc)


def test_prepared_layout(bie_prepared_case, bie_seed):
    kc = bie_prepared_case
    C.check_prepared(kc.kernel, kc.op, kc.case)
    C.check_cache_invalidation(kc.kernel, kc.op, kc.case, torch.Generator().manual_seed(bie_seed))


def test_opcheck(bie_op_case):
    backend, kc = bie_op_case
    C.check_opcheck(kc.op, backend, kc.case)

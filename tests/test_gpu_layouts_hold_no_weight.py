"""The GPU backends' prepared layouts hold no reference to their weights (CPU: the kernels are stubbed; what is
checked is the Python that builds and keeps the layouts). A layout that held its weight would keep the dispatcher's
cache entry for that weight alive for good: a training step's fresh sign bits, and their layouts, would stay cached.
On a GPU, the conformance kit checks every kernel the same way."""
from __future__ import annotations

import gc
import importlib.util
import weakref

import pytest
import torch


def _storage_ref(t: torch.Tensor):
    return weakref.ref(t.untyped_storage())


@pytest.mark.skipif(importlib.util.find_spec("bie_backend_cuda") is None, reason="bie-backend-cuda is not installed")
def test_cuda_binary_conv_layout_takes_the_weight_from_the_call():
    from bie_backend_cuda import binary as cb
    gen = torch.Generator().manual_seed(1)
    w = torch.randint(0, 256, (8, (16 * 9 + 7) // 8), generator=gen, dtype=torch.uint8)
    ref = _storage_ref(w)
    p = cb.prepare_conv(w)
    words, popc, taps = p.layout(w, 16, 3, 3)
    assert p.layout(w, 16, 3, 3)[0] is words                                   # built once per geometry
    assert all(t.untyped_storage().data_ptr() != w.untyped_storage().data_ptr() for t in (words, popc, taps))
    want = cb.conv_weight(w, 16, 3, 3)
    assert all(torch.equal(a, b) for a, b in zip((words, popc, taps), want))
    del w, want
    gc.collect()
    assert ref() is None


@pytest.mark.skipif(importlib.util.find_spec("bie_backend_cuda") is None, reason="bie-backend-cuda is not installed")
def test_cuda_binary_weight_layout_copies_rows_it_would_keep(monkeypatch):
    from bie_backend_cuda import binary as cb

    class Ops:
        def row_popc(self, b):
            return b.to(torch.int32).sum(1)
    monkeypatch.setattr(cb._build, "ops", lambda: Ops())
    b = torch.randint(0, 256, (8, 32), dtype=torch.uint8)      # 16-byte rows, K % 8 == 0: usable as they are
    ref = _storage_ref(b)
    p = cb.prepare_weight(b)
    assert torch.equal(p.bits, b) and p.bits.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    del b
    gc.collect()
    assert ref() is None


@pytest.mark.skipif(importlib.util.find_spec("bie_backend_cutlass") is None,
                    reason="bie-backend-cutlass is not installed")
@pytest.mark.parametrize("k", [256, 250])
def test_cutlass_binary_layout_reads_in_place_rows_from_the_call(monkeypatch, k):
    """Rows the GEMM reads in place (K % 8 == 0, aligned) are not kept: the call's weight is returned; rows it
    copies (K = 250: pad bits to mask) are kept as the copy."""
    from bie_backend_cutlass import binary as b
    calls = []

    class Ops:
        def rows(self, t, out, term, k_, kb, copies, c0, c1):
            calls.append(out is None)
            term.zero_()
            if out is not None:
                out.zero_()
    monkeypatch.setattr(b, "_ops", lambda: Ops())
    w = torch.zeros((8, 32), dtype=torch.uint8)
    ref = _storage_ref(w)
    p = b.prepare_weight(w)
    bits, term, ld = p.gemm(w, k)
    in_place = k % 8 == 0
    assert calls == [in_place]
    assert (bits.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()) == in_place
    assert (p._cache[("gemm", k)][0] is None) == in_place
    assert p.gemm(w, k)[1] is term and calls == [in_place]                   # built once
    del w, bits
    gc.collect()
    assert ref() is None


@pytest.mark.skipif(importlib.util.find_spec("bie_backend_cutlass") is None,
                    reason="bie-backend-cutlass is not installed")
def test_cutlass_binary_conv_layout_holds_no_weight():
    from bie_backend_cutlass import binary as b
    gen = torch.Generator().manual_seed(2)
    w = torch.randint(0, 256, (8, (16 * 9 + 7) // 8), generator=gen, dtype=torch.uint8)
    ref = _storage_ref(w)
    p = b.prepare_weight(w)
    got = p.conv(w, 16, 3, 3, 2)
    assert p.conv(w, 16, 3, 3, 2) is got
    want = b._conv_weight(w, 16, 3, 3, 2)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[2] == want[2]
    del w, want
    gc.collect()
    assert ref() is None

"""Shared by the weight-only tests."""
import os
import random

import pytest
import torch

from bie_core.ops.weight_only import wq_tolerance

#: one seed per test process (BIE_SEED to replay one), named in every failure message
SEED = int(os.environ.get("BIE_SEED", random.SystemRandom().randrange(2**31)))


@pytest.fixture(autouse=True)
def one_thread():
    # These tests run many small ops; on a busy 2-core machine intra-op threads
    # that wait for each other make them 10-20x slower. One thread is faster
    # and changes no result (every comparison is exact or tolerance-based).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def gen(*salt):
    """A generator seeded from SEED and the case's salt (independent streams per case)."""
    return torch.Generator().manual_seed((SEED * 1000003 + hash(salt)) % (2**63))


def rms(t):
    return float(t.double().pow(2).mean().sqrt()) if t.numel() else 0.0


def check_close(y, exp64, dtype, k, x, w64, what):
    """y against the float64 expectation within the op family's tolerance (wq_tolerance)."""
    rtol, atol = wq_tolerance(dtype, k, rms(x), rms(w64))
    assert y.dtype == dtype and y.shape == exp64.shape, f"{what}: {y.dtype} {tuple(y.shape)}"
    err = (y.double() - exp64).abs()
    bound = atol + rtol * exp64.abs()
    assert bool((err <= bound).all()), f"{what}: max err {float(err.max()):.3g} (atol {atol:.3g}); seed {SEED}"

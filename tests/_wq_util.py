"""Shared by the weight-only tests."""
import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    # These tests run many small ops; on a busy 2-core machine intra-op threads
    # that wait for each other make them 10-20x slower. One thread is faster
    # and changes no result (every comparison is exact or tolerance-based).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

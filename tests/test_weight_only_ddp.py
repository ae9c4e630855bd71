"""Packed-weight fine-tuning under DistributedDataParallel (2 gloo CPU
processes): the weight gradients (handle grads) are all-reduced like any other,
both ranks end bit-identical, and equal to one process on the combined batch.

Exact equality with the single-process run is possible because every value is
dyadic with few significant bits (integer inputs, power-of-two scales,
power-of-two batch sizes): every sum is exact in float32, so the order of
summation (one batch of 16 vs two of 8 averaged by DDP) cannot matter.
"""
from __future__ import annotations

import os
import socket
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from bie_core import MBWQLinear, MPQLinear, ops
from bie_core.optim import DiodeMix

K, N, B, STEPS = 64, 16, 8, 3
TIMEOUT_S = 90


class Branches(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = MPQLinear(K, N, bits=4, group_size=32, bias=True, dtype=torch.float32, trainable=True)
        self.b = MBWQLinear(K, N, bits=[4, 2], group_size=32, dtype=torch.float32, trainable=True)

    def forward(self, x):
        return self.a(x) + self.b(x)


def _model() -> Branches:
    gen = torch.Generator().manual_seed(0)
    m = Branches()
    with torch.no_grad():
        m.a.qweight.copy_(ops.wq_pack(torch.randint(0, 16, (K, N), generator=gen, dtype=torch.int32), 4, 0))
        m.a.scales.fill_(2.0 ** -4)
        m.a.zeros.copy_(ops.wq_pack(torch.full((2, N), 8, dtype=torch.int32), 4, 1))
        m.a.bias.copy_(torch.randint(-4, 5, (N,), generator=gen).float() / 8)
        codes = torch.cat([torch.randint(0, 16, (32, N), generator=gen), torch.randint(0, 4, (32, N), generator=gen)])
        m.b.qweight.copy_(ops.mbwq_pack(codes.to(torch.int32), [4, 2], [32, 32]))
        m.b.scales.fill_(2.0 ** -3)
        m.b.zeros.fill_(0.5)
        m.b.q_perm.copy_(torch.randperm(K, generator=gen).to(torch.int32))
    # A trained float bias would leave the dyadic grid after one step (its
    # gradient sums arbitrary floats in batch order); the packed weights stay on
    # it (power-of-two scales), so their updates remain exactly reproducible.
    m.a.bias.requires_grad_(False)
    return m


def _data():
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(-3, 4, (STEPS, 2 * B, K), generator=gen).float()
    y = torch.randint(-16, 17, (STEPS, 2 * B, N), generator=gen).float() / 16
    return x, y


def _run(model, step_batches, opt):
    x, y = _data()
    for s in range(STEPS):
        xb, yb = step_batches(x[s], y[s])
        loss = (model(xb) - yb).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def _opt(params):
    return DiodeMix(params, lr=0.05)          # large enough to move codes every step


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    from bie_core.parallel import ddp
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=__import__("datetime").timedelta(seconds=60))
    try:
        model = _model()
        wrapped = ddp(model)
        _run(wrapped, lambda xb, yb: (xb[rank * B:(rank + 1) * B], yb[rank * B:(rank + 1) * B]),
             _opt(model.parameters()))
        torch.save(model.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_ranks_bit_identical_and_equal_to_single_process():
    torch.set_num_threads(1)
    single = _model()
    _run(single, lambda xb, yb: (xb, yb), _opt(single.parameters()))
    start = _model()
    assert not torch.equal(single.a.qweight, start.a.qweight)     # training changed the codes
    assert not torch.equal(single.b.qweight, start.b.qweight)

    with tempfile.TemporaryDirectory() as out:
        ctx = mp.start_processes(_worker, args=(2, _free_port(), out), nprocs=2, join=False, start_method="spawn")
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    pytest.fail(f"DDP workers did not finish within {TIMEOUT_S} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        r0 = torch.load(os.path.join(out, "rank0.pt"), weights_only=True)
        r1 = torch.load(os.path.join(out, "rank1.pt"), weights_only=True)
    ref = single.state_dict()
    assert set(r0) == set(ref)
    for k in ref:
        assert torch.equal(r0[k], r1[k]), f"ranks differ in {k}"
        assert torch.equal(r0[k], ref[k]), f"DDP and single-process runs differ in {k}"


def test_plain_ddp_init_sync_refuses_handles_with_a_clear_path():
    # documents why bie_core.parallel.ddp exists: DDP's default init broadcast writes into
    # every parameter, which PyTorch refuses for the stride-0 gradient handles
    from bie_core.parallel import ddp
    with pytest.raises(ValueError, match="init_sync=True cannot broadcast"):
        ddp(_model(), init_sync=True)


def test_state_broadcast_bumps_versions_so_prepared_layouts_are_rebuilt(tmp_path):
    """Writing through ``.data`` would not bump the version counter, and the
    dispatcher would keep serving a layout prepared from the old values."""
    import torch
    import torch.distributed as dist
    import bie_core
    from bie_core.parallel import broadcast_module_state
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        layer = bie_core.BinaryLinear(16, 8).eval()
        with torch.no_grad():
            layer(torch.randn(2, 16))
        layer.pack()
        before = {n: t._version for n, t in list(layer.named_parameters()) + list(layer.named_buffers())}
        broadcast_module_state(layer)
        after = {n: t._version for n, t in list(layer.named_parameters()) + list(layer.named_buffers())}
        assert all(after[n] > before[n] for n in before if getattr(layer, n.split(".")[-1]).numel()), (before, after)
    finally:
        dist.destroy_process_group()

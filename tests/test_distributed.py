"""Data-parallel training of models holding bie layers, 2 gloo CPU processes:
stock ``DistributedDataParallel`` (frozen and packed-trainable weight-only
layers), stock ``torch.distributed.fsdp.fully_shard`` (frozen packed base +
LoRA-style adapters, with a full state dict saved and loaded into a fresh
sharded model) and ``bie_core.parallel.fully_shard`` (packed-weight
fine-tuning; QAT layers, whose 0-dim scales stock FSDP2 refuses).

One spawn runs every scenario (processes cost seconds to start) and writes
each rank's final state; the tests compare them with one process training on
the combined batch:

* packed-weight fine-tuning (DDP and FSDP2): bit-identical. Every value is
  dyadic with few significant bits (integer inputs, power-of-two scales and
  batch sizes), so every sum is exact in float32 and the order of summation
  (one batch of 16, or two of 8 averaged over ranks) cannot matter;
* float parameters (a trained head, LoRA adapters): ranks bit-identical to
  each other, and equal to the single process within ``FLOAT_ATOL`` /
  ``FLOAT_RTOL``, the rounding of averaging two half-batch gradients instead
  of one full-batch gradient, carried through three Adam steps.
"""
from __future__ import annotations

import datetime
import gc
import os
import socket
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from bie_core import BinaryLinear, MBWQLinear, MPQLinear, QLinear, ops
from bie_core.optim import DiodeMix

K, N, B, STEPS, RANK_LORA = 64, 16, 8, 3, 4
WORLD = 2
TIMEOUT_S = 120
FLOAT_ATOL, FLOAT_RTOL = 1e-6, 1e-5


# ------------------------------------------------------------------ models
class Branches(nn.Module):
    """Two packed-trainable weight-only layers (dyadic values throughout)."""

    def __init__(self):
        super().__init__()
        self.a = MPQLinear(K, N, bits=4, group_size=32, bias=True, dtype=torch.float32, trainable=True)
        self.b = MBWQLinear(K, N, bits=[4, 2], group_size=32, dtype=torch.float32, trainable=True)

    def forward(self, x):
        return self.a(x) + self.b(x)


def _packed_model() -> Branches:
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


def _frozen_mpq(k: int, n: int, seed: int) -> MPQLinear:
    gen = torch.Generator().manual_seed(seed)
    layer = MPQLinear(k, n, bits=4, group_size=32, bias=False, dtype=torch.float32)
    with torch.no_grad():
        layer.qweight.copy_(ops.wq_pack(torch.randint(0, 16, (k, n), generator=gen, dtype=torch.int32), 4, 0))
        layer.scales.copy_(torch.rand(k // 32, n, generator=gen) / 16 + 0.01)
        layer.zeros.copy_(ops.wq_pack(torch.full((k // 32, n), 8, dtype=torch.int32), 4, 1))
    return layer


class FrozenWithHead(nn.Module):
    """A frozen packed layer under a trained float head (DDP)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.base = _frozen_mpq(K, N, 3)
        self.head = nn.Linear(N, 4)

    def forward(self, x):
        return self.head(torch.relu(self.base(x)))


class LoRALinear(nn.Module):
    """A frozen packed layer plus a trainable low-rank update ``x @ A @ B``."""

    def __init__(self, k: int, n: int, seed: int):
        super().__init__()
        self.base = _frozen_mpq(k, n, seed)
        gen = torch.Generator().manual_seed(seed + 100)
        self.lora_a = nn.Parameter(torch.randn(k, RANK_LORA, generator=gen) / k ** 0.5)
        # B non-zero (unlike the usual zero init) so both factors get gradients from step one
        self.lora_b = nn.Parameter(torch.randn(RANK_LORA, n, generator=gen) / 8)

    def forward(self, x):
        return self.base(x) + (x @ self.lora_a) @ self.lora_b


class LoRAModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([LoRALinear(K, K, 10), LoRALinear(K, N, 20)])

    def forward(self, x):
        return self.blocks[1](torch.relu(self.blocks[0](x)))


class QATModel(nn.Module):
    """Binary and 8-bit QAT layers with a float head, trained end to end."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(6)
        self.binary = BinaryLinear(K, K)
        self.int8 = QLinear(K, K)
        self.head = nn.Linear(K, N)

    def forward(self, x):
        return self.head(self.int8(self.binary(x)))


# -------------------------------------------------------------- training
def _data(out: int, seed: int, integer: bool):
    gen = torch.Generator().manual_seed(seed)
    if integer:
        x = torch.randint(-3, 4, (STEPS, WORLD * B, K), generator=gen).float()
        y = torch.randint(-16, 17, (STEPS, WORLD * B, out), generator=gen).float() / 16
    else:
        x = torch.randn(STEPS, WORLD * B, K, generator=gen)
        y = torch.randn(STEPS, WORLD * B, out, generator=gen)
    return x, y


def _train(model, opt, rank=None, *, out: int, seed: int, integer: bool, micro: bool = False):
    """STEPS steps of MSE; ``rank`` None trains on the whole batch, else on that
    rank's half; ``micro`` (one process) accumulates the halves' mean gradient."""
    x, y = _data(out, seed, integer)
    for s in range(STEPS):
        opt.zero_grad(set_to_none=True)
        if micro:
            for r in range(WORLD):
                ((model(x[s, r * B:(r + 1) * B]) - y[s, r * B:(r + 1) * B]).pow(2).mean() / WORLD).backward()
        else:
            xb, yb = (x[s], y[s]) if rank is None else (x[s, rank * B:(rank + 1) * B], y[s, rank * B:(rank + 1) * B])
            (model(xb) - yb).pow(2).mean().backward()
        opt.step()


# The QAT layers' scale gradients carry LSQ's 1/sqrt(batch elements) factor, so a
# rank's half batch is not half of the whole batch's: one process compares by
# accumulating the same per-rank micro-batches.
MICRO = {"fsdp_qat"}
SCENARIOS = {
    # name: (model factory, optimizer factory, output width, data seed, integer data)
    "ddp_packed": (_packed_model, lambda ps: DiodeMix(ps, lr=0.05), N, 1, True),
    "ddp_frozen": (FrozenWithHead, lambda ps: torch.optim.Adam(ps, lr=1e-2), 4, 4, False),
    "fsdp_lora": (LoRAModel, lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=False), N, 5, False),
    "fsdp_packed": (_packed_model, lambda ps: DiodeMix(ps, lr=0.05), N, 1, True),
    "fsdp_qat": (QATModel, lambda ps: torch.optim.SGD(ps, lr=1e-2), N, 7, False),
}
PROBE_SEED = 99


def _probe(model) -> torch.Tensor:
    """An eval-mode forward on a fixed input (the inference path, after training)."""
    x = torch.randn(4, K, generator=torch.Generator().manual_seed(PROBE_SEED))
    was = model.training
    model.eval()
    with torch.no_grad():
        y = model(x)
    model.train(was)
    return y.detach().clone()


def single_process(name: str):
    """The final state and probe of one process on the whole batch (same steps as ``_worker``)."""
    make, make_opt, out, seed, integer = SCENARIOS[name]
    model = make()
    _probe(model)
    _train(model, make_opt([p for p in model.parameters() if p.requires_grad]), out=out, seed=seed,
           integer=integer, micro=name in MICRO)
    return model.state_dict(), _probe(model)


def _full_state(model) -> dict:
    from torch.distributed.tensor import DTensor
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in model.state_dict().items()}


def _worker(rank: int, port: int, out_dir: str) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from bie_core import parallel
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    try:
        results, facts, probes = {}, {}, {}
        full = StateDictOptions(full_state_dict=True)
        for name, (make, make_opt, out, seed, integer) in SCENARIOS.items():
            model = make()
            if name.startswith("ddp"):
                # stock DDP, nothing bie-specific
                wrapped = nn.parallel.DistributedDataParallel(model)
            else:
                mesh = init_device_mesh("cpu", (WORLD,))
                if name == "fsdp_lora":
                    # stock FSDP2, nothing bie-specific: the packed base is frozen
                    for block in model.blocks:
                        fully_shard(block, mesh=mesh)
                    fully_shard(model, mesh=mesh)
                else:
                    parallel.fully_shard(model, mesh=mesh)
                wrapped = model
                facts[name] = {
                    "sharded": sorted(n for n, p in model.named_parameters() if isinstance(p, DTensor)),
                    "local_rows": {n: p.to_local().shape[0] for n, p in model.named_parameters()
                                   if isinstance(p, DTensor)},
                    "handles_plain": all(not isinstance(h, DTensor) for h in parallel.gradient_handles(model)),
                    "buffers_whole": {n: tuple(b.shape) for n, b in model.named_buffers()},
                }
            # the optimizer takes the sharded parameters: before any forward, after which the
            # root FSDP module holds its unsharded ones
            opt = make_opt([p for p in model.parameters() if p.requires_grad])
            _probe(wrapped)           # prepares inference layouts that training must invalidate
            _train(wrapped, opt, rank, out=out, seed=seed, integer=integer)
            probes[name] = _probe(wrapped)
            results[name] = _full_state(model)
            if name == "fsdp_lora":
                # the full state dict, loaded into a freshly sharded model, gives the same function
                state = get_model_state_dict(model, options=full)
                fresh = LoRAModel()
                for block in fresh.blocks:
                    fully_shard(block, mesh=mesh)
                fully_shard(fresh, mesh=mesh)
                set_model_state_dict(fresh, state, options=full)
                facts["roundtrip"] = {"keys": sorted(state), "same": torch.equal(_probe(fresh), probes[name])}
        torch.save({"results": results, "facts": facts, "probes": probes}, os.path.join(out_dir, f"rank{rank}.pt"))
        del wrapped, model    # (a DDP reducer freed while its process group is live: see the test below)
        gc.collect()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks():
    """Both ranks' final states and facts, from one spawn of two gloo processes."""
    with tempfile.TemporaryDirectory() as out:
        ctx = mp.start_processes(_worker, args=(_free_port(), out), nprocs=WORLD, join=False,
                                 start_method="spawn")
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    pytest.fail(f"distributed workers did not finish within {TIMEOUT_S} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        return [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=True) for r in range(WORLD)]


def _assert_ranks_identical(ranks, name):
    r0, r1 = (r["results"][name] for r in ranks)
    assert set(r0) == set(r1)
    for k in r0:
        assert torch.equal(r0[k], r1[k]), f"{name}: ranks differ in {k}"
    return r0


@pytest.mark.parametrize("name", ["ddp_packed", "fsdp_packed"])
def test_packed_fine_tuning_bit_identical_to_single_process(ranks, name):
    got = _assert_ranks_identical(ranks, name)
    ref, want = single_process(name)
    start = _packed_model().state_dict()
    assert not torch.equal(ref["a.qweight"], start["a.qweight"])       # training changed the codes
    assert not torch.equal(ref["b.qweight"], start["b.qweight"])
    assert set(got) == set(ref)
    for k in ref:
        assert torch.equal(got[k], ref[k]), f"{name}: distributed and single-process runs differ in {k}"


@pytest.mark.parametrize("name", ["ddp_frozen", "fsdp_lora", "fsdp_qat"])
def test_float_training_over_frozen_packed_layers_matches_single_process(ranks, name):
    got = _assert_ranks_identical(ranks, name)
    ref, want = single_process(name)
    start = SCENARIOS[name][0]().state_dict()
    assert set(got) == set(ref)
    moved = 0
    for k in ref:
        if ref[k].is_floating_point() and not torch.equal(ref[k], start[k]):
            moved += 1
            torch.testing.assert_close(got[k], ref[k], atol=FLOAT_ATOL, rtol=FLOAT_RTOL, msg=f"{name}: {k}")
        else:
            # the frozen packed base is never written
            assert torch.equal(got[k], start[k]) and torch.equal(ref[k], start[k]), f"{name}: {k} changed"
    assert moved >= 2, f"{name}: training moved only {moved} tensors"
    # the trained model's inference path (layouts prepared before training are rebuilt)
    torch.testing.assert_close(ranks[0]["probes"][name], ranks[1]["probes"][name], rtol=0, atol=0)
    torch.testing.assert_close(ranks[0]["probes"][name], want, atol=FLOAT_ATOL * 10, rtol=FLOAT_RTOL)


def test_stock_fsdp2_full_state_dict_roundtrip(ranks):
    for r in ranks:
        rt = r["facts"]["roundtrip"]
        assert rt["same"]
        assert "blocks.0.base.qweight" in rt["keys"] and not any("weight_handle" in k for k in rt["keys"])


def test_fsdp_shards_float_parameters_and_leaves_handles_alone(ranks):
    for r in ranks:
        facts = r["facts"]["fsdp_lora"]
        assert facts["handles_plain"]
        assert facts["sharded"] == ["blocks.0.lora_a", "blocks.0.lora_b", "blocks.1.lora_a", "blocks.1.lora_b"]
        assert facts["local_rows"]["blocks.0.lora_a"] == K // WORLD
        assert r["facts"]["fsdp_packed"]["sharded"] == ["a.bias"]       # frozen, but a parameter: sharded
        # packed weights are buffers: every rank holds them whole
        assert facts["buffers_whole"]["blocks.0.base.qweight"] == (K // 8, K)
        # the QAT layers' latent weights are sharded, their 0-dim scales are not
        qat = r["facts"]["fsdp_qat"]
        assert "binary.weight" in qat["sharded"] and "int8.weight" in qat["sharded"]
        assert "binary.act_scale" not in qat["sharded"] and qat["local_rows"]["binary.weight"] == K // WORLD


def test_stock_fsdp2_refuses_what_the_wrapper_keeps_out(tmp_path):
    """What ``bie_core.parallel.fully_shard`` exists for: stock FSDP2 refuses a
    trainable layer's stride-0 handle and the QAT layers' 0-dim scales."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from bie_core import parallel
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        trainable = _packed_model()
        with pytest.raises(NotImplementedError, match="non-contiguous parameters"):
            fully_shard(trainable, mesh=mesh)
        with pytest.raises(ValueError, match="scalar parameters"):
            fully_shard(QATModel(), mesh=mesh)
        kept = parallel.unshardable_parameters(QATModel())
        assert len(kept) == 3 and all(p.dim() == 0 for p in kept)   # act_scale x2, weight_scale
        frozen = _frozen_mpq(K, N, 0)
        assert "weight_handle" not in dict(frozen.named_parameters())
        fully_shard(frozen, mesh=mesh)                                 # nothing refused
    finally:
        dist.destroy_process_group()


def test_stock_ddp_init_skips_handles_and_syncs_everything_else(tmp_path):
    """One process group of one rank is enough to run DDP's init broadcast."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        for trainable in (False, True):
            m = nn.Sequential(_frozen_mpq(K, N, 0), nn.Linear(N, 4))
            m[0].trainable = trainable
            before = m[0].qweight._version
            ddp = nn.parallel.DistributedDataParallel(m)
            assert m[0].weight_handle.stride() == (0, 0) and m[0].weight_handle.untyped_storage().nbytes() == 4
            assert m[0].qweight._version > before          # the packed codes went through the broadcast
            ddp(torch.randn(3, K)).sum().backward()
            assert (m[0].weight_handle.grad is not None) == trainable
            # DDP's reducer holds the process group: freed here, while the group is live (freed after
            # destroy_process_group, gloo's destructor can wait forever for its worker threads)
            del ddp
            gc.collect()
    finally:
        dist.destroy_process_group()


def test_state_broadcast_bumps_versions_so_prepared_layouts_are_rebuilt(tmp_path):
    """Writing through ``.data`` would not bump the version counter, and the
    dispatcher would keep serving a layout prepared from the old values."""
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

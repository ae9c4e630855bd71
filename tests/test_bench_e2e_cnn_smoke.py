"""benchmarks/bench_e2e_cnn.py --smoke: every variant trains, packs and serves a tiny ResNet-18 on the CPU, and the
JSON / markdown / plot come out with consistent figures."""
from __future__ import annotations

import json
import math
import os
import sys

import pytest
import torch

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, BENCH)
    try:
        import bench_e2e_cnn
        yield bench_e2e_cnn
    finally:
        sys.path.remove(BENCH)


def test_resnet18_shape_and_size(bench):
    model = bench.ResNet18()
    assert sum(p.numel() for p in model.parameters()) == 11_689_512     # the published ResNet-18
    small = bench.ResNet18(num_classes=10, width=8)
    assert small(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_smoke_run_writes_consistent_results(bench, tmp_path):
    pytest.importorskip("matplotlib")
    rows = bench.main(["--smoke", "--device", "cpu", "--out", str(tmp_path)])
    assert [r["variant"] for r in rows] == list(bench.VARIANTS)
    for r in rows:
        assert "error" not in r, r
        assert r["compile"] is False
        for k in ("train_img_s", "infer_img_s", "loss_first", "loss_last"):
            assert math.isfinite(r[k]) and (r[k] > 0 or k.startswith("loss")), (k, r)
    size = {r["variant"]: r["disk_bytes"] for r in rows}
    # deployed sizes: packed binary < 4-bit < 8-bit < float32 (the first conv and the classifier stay float)
    assert size["binary"] < size["w4a4"] < size["w8a8"] < size["float"]
    assert rows[0]["disk_bytes_bf16"] < size["float"]
    data = json.loads((tmp_path / "e2e_cnn.json").read_text())
    assert data["rows"] == json.loads(json.dumps(rows))
    assert data["meta"]["batch"] == 4
    md = (tmp_path / "e2e_cnn.md").read_text()
    assert md.count("\n| ") == 1 + len(rows)   # header + one line per case
    assert (tmp_path / "e2e_cnn.png").stat().st_size > 1000


def test_converted_layers_are_the_requested_kind(bench):
    from bie_core import BinaryConv2d, QConv2d
    model = bench.build("w4a4", 8, 10, torch.device("cpu"))
    convs = [m for m in model.modules() if isinstance(m, QConv2d)]
    assert len(convs) == 19 and all(m.w_bits == 4 and m.a_bits == 4 for m in convs)   # 20 convs, stem stays float
    assert type(model.stem) is torch.nn.Conv2d and type(model.fc) is torch.nn.Linear
    binary = bench.build("binary", 8, 10, torch.device("cpu"))
    assert sum(isinstance(m, BinaryConv2d) for m in binary.modules()) == 19


def test_quantized_backward_variant(bench):
    from bie_core import QConv2d
    model = bench.build("w8a8-qbwd", 8, 10, torch.device("cpu"))
    convs = [m for m in model.modules() if isinstance(m, QConv2d)]
    assert convs and all(m.quantized_backward and m.w_bits == 8 for m in convs)
    assert not any(m.quantized_backward for m in bench.build("w8a8", 8, 10, torch.device("cpu")).modules()
                   if isinstance(m, QConv2d))
    x = torch.randn(2, 3, 32, 32)
    model(x).sum().backward()
    assert all(m.weight.grad is not None for m in convs)

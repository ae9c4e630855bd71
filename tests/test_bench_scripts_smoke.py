"""The end-to-end and host-time benchmark scripts run (tiny sizes, CPU) and
write what their pages are made of; the figures themselves live in
benchmarks/results, not in tests."""
from __future__ import annotations

import json

import pytest
import torch

from _bench_script import load_bench_script

_load = load_bench_script


def test_e2e_llm_smoke(tmp_path):
    pytest.importorskip("transformers")
    threads = torch.get_num_threads()
    try:
        _load("bench_e2e_llm").main(["--smoke", "--cases", "fp32,bie-w4-gptq,bie-w4+fused,tinygemm-w4,bnb-nf4", "--reps", "1",
                                     "--out-dir", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    data = json.loads((tmp_path / "e2e_llm_smoke.json").read_text())
    runs = data["runs"]
    assert {r["case"] for r in runs.values()} >= {"fp32", "bie-w4-gptq", "bie-w4+fused", "tinygemm-w4"}
    for r in runs.values():
        assert "error" not in r, r
        assert r["decode_tokens_per_s"] > 0 and r["ttft_ms"] > 0
    gptq = data["agreement"]["bie-w4-gptq"]
    assert gptq["roundtrip_max_abs_diff"] == 0.0         # save_quantized -> load_quantized is exact
    assert gptq["top1_agreement"] == 1.0 and gptq["max_abs_diff"] < 1e-4 * max(1.0, gptq["ref_max_abs"])
    assert data["agreement"]["tinygemm-w4"]["top1_agreement"] > 0.9
    fused = data["agreement"]["bie-w4+fused"]       # exact on the native kernels; float32 rounding on the reference
    assert fused["fused_vs_unfused_max_abs_diff"] <= 1e-5 * max(1.0, fused["ref_max_abs"])
    md = (tmp_path / "e2e_llm_smoke.md").read_text()
    assert "bie-w4-gptq" in md and "vs float" in md


def test_host_bench_quick(tmp_path):
    threads = torch.get_num_threads()
    try:
        _load("bench_host").main(["--quick", "--k", "32", "--n", "32", "--eval-k", "64", "--compiled",
                                  "--out-dir", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    data = json.loads((tmp_path / "host_path.json").read_text())
    assert "MPQLinear W4 g32" in data["layers"] and "QLinear W8A8 64x64" in data["eval_vs_packed"]
    assert all(r["ratio"] > 0 for r in data["layers"].values())
    assert set(data["compiled_vs_eager"]) >= {"QLinear W8A8", "BinaryConv2d", "nn.Linear"}


def test_host_bench_decode_rows(tmp_path):
    threads = torch.get_num_threads()
    try:
        _load("bench_host").main(["--quick", "--decode", "--decode-shapes", "256x64,128x256", "--decode-rows", "1,5",
                                  "--out-dir", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    data = json.loads((tmp_path / "host_decode.json").read_text())
    assert set(data["layers"]) == {"256x64 rows=1", "256x64 rows=5", "128x256 rows=1", "128x256 rows=5"}
    assert all(r["ratio"] > 0 for r in data["layers"].values())
    assert "wq_gemm" in data["kernels"]["256x64 rows=5"]


def test_conv_operand_bench_smoke(tmp_path):
    """The compiled QConv2d block with and without the integer route: both outputs equal, a table written."""
    threads = torch.get_num_threads()
    md = tmp_path / "conv_operand.md"
    try:
        rows = _load("bench_conv_operand").main(["--shapes", "16x6", "--dtypes", "bfloat16", "--batch", "2",
                                                 "--rounds", "2", "--md", str(md)])
    finally:
        torch.set_num_threads(threads)
    assert len(rows) == 1 and rows[0]["equal"] and rows[0]["off_ms"] > 0 and rows[0]["on_ms"] > 0
    assert "| bfloat16 | 16x6x6 |" in md.read_text()

"""benchmarks/profile_decode.py --smoke: the decode-step profile of a tiny Llama-shaped model on the CPU, and its count
of bie op calls made from the host per decode step (what tells a compiled step replayed from CUDA graphs, 0 calls,
from one that runs the ops)."""
from __future__ import annotations

import ast

import pytest

from _bench_script import load_bench_script

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def prof():
    return load_bench_script("profile_decode")


def test_host_op_calls_per_decode_step(prof, tmp_path, capsys):
    md = tmp_path / "pd.md"
    assert prof.main(["--smoke", "--cases", "bie-w4", "--compiled", "--md", str(md)]) == 0
    assert prof.main(["--smoke", "--cases", "bie-w4", "--batch", "2"]) == 0
    text = md.read_text()
    assert "CUDA-graph launches / bie op calls" in text
    rows = [ast.literal_eval(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{'case'")]
    compiled, eager = rows
    assert compiled["compiled"] and not eager["compiled"]
    assert compiled["batch"] == 1 and eager["batch"] == 2
    # the tiny model's two layers of seven projections: the compiled graph calls bie's op for each one every step
    # (no CUDA graph on the CPU); an eager step goes through the layers' bound calls, which bypass the op
    assert compiled["bie_op_calls"] == 2 * 7
    assert eager["bie_op_calls"] == 0
    assert compiled["graph_launches"] == eager["graph_launches"] == 0
    assert compiled["wall_ms"] > 0 and eager["wall_ms"] > 0


def test_reduction_kernels_count_with_their_call(prof):
    """The thin GEMV's K-slice reductions are added to the call before them, so a layer's calls stay seven."""
    ks = [(0, 5.0, "wq_thin_kernel"), (1, 2.0, "wq_thin_kernel"), (2, 0.5, "wq_thin_reduce_kernel"),
          (3, 9.0, "triton_poi_fused_mul_silu"), (4, 3.0, "wq_thin_kernel"), (5, 0.25, "wq_thin_reduce4_kernel")]
    assert prof._linear_calls(ks, "wq_thin") == [5.0, 2.5, 3.25]
    assert prof._linear_calls(ks, "nvjet") == []
    # a reduction with no call before it (the profile's window opened between the two) is a call of its own
    assert prof._linear_calls([(0, 1.0, "wq_thin_reduce_kernel")], "wq_thin") == [1.0]


def test_prefill_kernels_grouped_by_name(prof):
    ks = [(0, 5.0, "gemm_a"), (1, 2.0, "silu"), (2, 7.0, "gemm_a"), (3, 1.0, "norm"), (4, 4.0, "silu")]
    assert prof._by_name(ks, 2) == [("gemm_a", 2, 12.0), ("silu", 2, 6.0)]
    # names alike in their first 80 characters are one kernel
    long = "k" * 80
    assert prof._by_name([(0, 1.0, long + "_v1"), (1, 2.0, long + "_v2")], 5) == [(long, 2, 3.0)]


def test_prefill_kernels_option(prof, tmp_path, capsys):
    md = tmp_path / "pk.md"
    assert prof.main(["--smoke", "--cases", "bf16", "--prefill-kernels", "3", "--md", str(md)]) == 0
    row = [ast.literal_eval(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{'case'")][0]
    assert row["prompt"] == 8 and len(row["prefill_kernels"]) <= 3
    assert "-token prefill" in md.read_text()

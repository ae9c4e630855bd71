"""benchmarks/profile_decode.py --smoke: the decode-step profile of a tiny Llama-shaped model on the CPU, and its count
of bie op calls made from the host per decode step (what tells a compiled step replayed from CUDA graphs, 0 calls,
from one that runs the ops)."""
from __future__ import annotations

import ast
import os
import sys

import pytest

pytest.importorskip("transformers")
BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


@pytest.fixture(scope="module")
def prof():
    sys.path.insert(0, BENCH)
    try:
        import profile_decode
        yield profile_decode
    finally:
        sys.path.remove(BENCH)


def test_host_op_calls_per_decode_step(prof, tmp_path, capsys):
    md = tmp_path / "pd.md"
    assert prof.main(["--smoke", "--cases", "bie-w4", "--compiled", "--md", str(md)]) == 0
    assert prof.main(["--smoke", "--cases", "bie-w4"]) == 0
    text = md.read_text()
    assert "CUDA-graph launches / bie op calls" in text
    rows = [ast.literal_eval(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{'case'")]
    compiled, eager = rows
    assert compiled["compiled"] and not eager["compiled"]
    # the tiny model's two layers of seven projections: the compiled graph calls bie's op for each one every step
    # (no CUDA graph on the CPU); an eager step goes through the layers' bound calls, which bypass the op
    assert compiled["bie_op_calls"] == 2 * 7
    assert eager["bie_op_calls"] == 0
    assert compiled["graph_launches"] == eager["graph_launches"] == 0
    assert compiled["wall_ms"] > 0 and eager["wall_ms"] > 0

"""benchmarks/bench_prefill_host.py on the CPU: a tiny Llama-shaped model's eager prefill timed for the float model,
bie W4 and bie W4 with named projections forced to a backend; the forcing reaches exactly the named layers."""
from __future__ import annotations

import pytest

from _bench_script import load_bench_script

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bench():
    return load_bench_script("bench_prefill_host")


def test_prefill_cases_are_timed(bench, capsys):
    args = ["--device", "cpu", "--config", "tiny", "--layers", "1", "--prompt", "16", "--reps", "2"]
    assert bench.main(args + ["--force", "k_proj,v_proj=cpu"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| float (float32)", "| bie W4 g128, automatic",
                                                     "| bie W4 g128, k_proj,v_proj=cpu"]
    for r in rows[1:]:
        cells = r.split(" | ")
        host, gpu, wall, ratio = float(cells[1]), cells[2], float(cells[3]), float(cells[4].rstrip(" |x"))
        assert 0 < host and 0 < wall and host == wall      # on the CPU the host time is the wall time
        assert gpu == "—" and ratio > 0                    # no GPU time on the CPU
    assert rows[1].split(" | ")[4] == "1.00x |"           # the float case against itself
    assert bench.main(args + ["--per-module"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  host per module")]
    assert len(lines) == 2 and "float" in lines[0] and "automatic" in lines[1]
    for line in lines:                                  # every projection kind is timed, once per kind
        names = [part.strip().split(" ")[0] for part in line.split(":", 1)[1].split(",")]
        assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"} <= set(names)
        assert len(names) == len(set(names))
    with pytest.raises(SystemExit, match="NAMES=BACKEND"):
        bench.main(args + ["--force", "no_such_proj=cpu"])


def test_force_sets_the_named_layers_only(bench):
    import torch
    from bench_e2e_llm import build_float, llama_config, quantize_bie
    model = quantize_bie(build_float(llama_config("tiny", 2), torch.float32, torch.device("cpu")), 4, 128,
                         torch.float32, False)
    assert bench.force(model, "k_proj,v_proj", "cpu") == 4
    chosen = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if getattr(m, "backend", None) == "cpu"}
    assert chosen == {"k_proj", "v_proj"}
    assert bench.force(model, "all", "") == 14            # 7 projections a layer; lm_head stays float
    assert not any(getattr(m, "backend", None) for m in model.modules() if hasattr(m, "qweight"))

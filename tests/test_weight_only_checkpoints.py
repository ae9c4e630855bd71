"""GPTQ / GBA checkpoints: our own quantizer writes the ecosystem layout
(safetensors + quantize_config), load_quantized reads it back into a float
model; hand-written layouts; truncated and foreign files."""
from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

import bie_core
from bie_core import CheckpointError, MPQLinear, load_quantized, quantize_model, save_quantized
from bie_core.checkpoint import encode_gba_statistics, gptq_state_dict
from bie_core.checkpoint.io import write_safetensors
from _wq_util import one_thread  # noqa: F401  (autouse fixture)


class Tiny(nn.Module):
    """A small decoder-ish block: linears with and without bias, a norm, tied head."""

    def __init__(self, d=64, h=96, vocab=50):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.up = nn.Linear(d, h, bias=False)
        self.gate = nn.Linear(d, h, bias=True)
        self.down = nn.Linear(h, d, bias=False)
        self.norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.emb.weight

    def forward(self, ids):
        x = self.emb(ids)
        x = x + self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))
        return self.lm_head(self.norm(x))


def _dequantized_float_copy(qmodel: nn.Module, factory) -> nn.Module:
    """The float model whose linears hold the dequantized weights of qmodel."""
    f = factory()
    f.load_state_dict({k: v for k, v in qmodel.state_dict().items()
                       if not any(k.endswith(s) for s in (".qweight", ".scales", ".zeros", ".g_idx"))}, strict=False)
    for name, m in qmodel.named_modules():
        if isinstance(m, MPQLinear):
            lin = f.get_submodule(name)
            with torch.no_grad():
                lin.weight.copy_(m.dequantize(torch.float32).t())
                if m.bias is not None:
                    lin.bias.copy_(m.bias.float())
    return f


@pytest.mark.parametrize("fmt", ["v1", "v2"])
def test_save_and_load_roundtrip_tiny_model(tmp_path, fmt):
    torch.manual_seed(0)
    q = Tiny()
    names = quantize_model(q, bits=4, group_size=32, dtype=torch.float16)
    assert set(names) == {"up", "gate", "down"}
    save_quantized(q, tmp_path, checkpoint_format=fmt)
    cfg = json.load(open(tmp_path / "quantize_config.json"))
    assert cfg["checkpoint_format"] == ("gptq" if fmt == "v1" else "gptq_v2") and cfg["bits"] == 4
    from safetensors.torch import load_file
    keys = set(load_file(str(tmp_path / "model.safetensors")))
    assert {"up.qweight", "up.qzeros", "up.scales", "up.g_idx", "gate.bias"} <= keys
    assert "lm_head.weight" not in keys or "emb.weight" not in keys     # tied: written once

    torch.manual_seed(1)
    fresh = Tiny()                                   # other random weights: everything must come from the file
    rep = load_quantized(fresh, tmp_path)
    assert sorted(rep.replaced) == ["down", "gate", "up"] and rep.checkpoint_format == fmt
    ids = torch.randint(0, 50, (2, 7))
    torch.testing.assert_close(fresh(ids), q(ids), rtol=0, atol=0)
    deq = _dequantized_float_copy(q, Tiny)
    torch.testing.assert_close(fresh(ids), deq(ids), rtol=1e-4, atol=1e-4)


def test_config_json_quantization_config_and_state_dict_source(tmp_path):
    torch.manual_seed(0)
    q = Tiny()
    quantize_model(q, bits=3, group_size=64, dtype=torch.float16)
    sd = gptq_state_dict(q, "v1")
    write_safetensors(sd, str(tmp_path / "model.safetensors"))
    with open(tmp_path / "config.json", "w") as f:
        json.dump({"model_type": "tiny", "quantization_config": {"bits": 3, "group_size": 64, "desc_act": False,
                                                                 "sym": False, "quant_method": "gptq"}}, f)
    a = Tiny()
    load_quantized(a, tmp_path / "model.safetensors")
    b = Tiny()
    load_quantized(b, sd, quantize_config={"bits": 3, "group_size": 64})
    ids = torch.randint(0, 50, (1, 5))
    torch.testing.assert_close(a(ids), q(ids), rtol=0, atol=0)
    torch.testing.assert_close(b(ids), q(ids), rtol=0, atol=0)


def test_sharded_checkpoint(tmp_path):
    torch.manual_seed(0)
    q = Tiny()
    quantize_model(q, bits=8, group_size=-1, dtype=torch.float16)
    sd = gptq_state_dict(q, "v2")
    keys = sorted(sd)
    half = len(keys) // 2
    shards = {"model-00001-of-00002.safetensors": keys[:half], "model-00002-of-00002.safetensors": keys[half:]}
    for fname, ks in shards.items():
        write_safetensors({k: sd[k] for k in ks}, str(tmp_path / fname))
    with open(tmp_path / "model.safetensors.index.json", "w") as f:
        json.dump({"weight_map": {k: fn for fn, ks in shards.items() for k in ks}}, f)
    with open(tmp_path / "quantize_config.json", "w") as f:
        json.dump({"bits": 8, "group_size": -1, "checkpoint_format": "gptq_v2"}, f)
    m = Tiny()
    load_quantized(m, tmp_path)
    ids = torch.randint(0, 50, (1, 4))
    torch.testing.assert_close(m(ids), q(ids), rtol=0, atol=0)


def test_hand_written_v1_layer_loads():
    # One 4-bit layer written by hand from the published rules: K=8, N=8, one group,
    # code k at row k for every column, v1 zeros stored 7 (z = 8) -> 0x77777777, scale 0.5.
    qweight = torch.full((1, 8), 0x76543210, dtype=torch.int32)
    qzeros = torch.tensor([[0x77777777]], dtype=torch.int32)
    scales = torch.full((1, 8), 0.5, dtype=torch.float16)
    sd = {"fc.qweight": qweight, "fc.qzeros": qzeros, "fc.scales": scales,
          "fc.g_idx": torch.zeros(8, dtype=torch.int32)}
    model = nn.Sequential()
    model.add_module("fc", nn.Linear(8, 8, bias=False))
    load_quantized(model, sd, quantize_config={"bits": 4, "group_size": -1, "sym": True})
    w = model.fc.dequantize()
    assert w[:, 0].tolist() == [0.5 * (k - 8) for k in range(8)]
    x = torch.eye(8)
    assert model(x)[:, 3].tolist() == [0.5 * (k - 8) for k in range(8)]


def test_gba_checkpoint_with_double_quantized_statistics():
    torch.manual_seed(0)
    lin = nn.Linear(64, 32, bias=False)
    layer = MPQLinear.from_float(lin, bits=2, group_size=32, format="gba", dtype=torch.float16)
    stats = encode_gba_statistics(layer.scales, layer.zeros, dq=16)
    sd = {"fc.qweight": layer.qweight, **{f"fc.{k}": v for k, v in stats.items()},
          "fc.wf": torch.tensor([[0, 2, 4]], dtype=torch.int32)}
    model = nn.Sequential()
    model.add_module("fc", nn.Linear(64, 32, bias=False))
    rep = load_quantized(model, sd, quantize_config={"bits": 2, "group_size": 32, "quant_method": "bitorch"})
    assert rep.gba == ["fc"] and model.fc.format == "gba"
    dec_s, dec_z = bie_core.ops.wq_decode_statistics(stats["qstatistic"], stats["qscales_scales"],
                                                     stats["qscales_zeros"], stats["qzeros_scales"],
                                                     stats["qzeros_zeros"], 32, torch.float16)
    torch.testing.assert_close(model.fc.scales, dec_s, rtol=0, atol=0)
    # decoded statistics are close to the originals (4-bit double quantization)
    assert (dec_s.float() - layer.scales.float()).abs().max() <= layer.scales.float().max() / 15
    x = torch.randn(3, 64)
    ref = MPQLinear.from_gba(layer.qweight, bits=2, group_size=32, scales=dec_s, zeros=dec_z)
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)


# ------------------------------------------------------------------ bad checkpoints
def _saved(tmp_path):
    torch.manual_seed(0)
    q = Tiny()
    quantize_model(q, bits=4, group_size=32, dtype=torch.float16)
    save_quantized(q, tmp_path)
    return q


def test_truncated_file_is_a_clear_error(tmp_path):
    _saved(tmp_path)
    p = tmp_path / "model.safetensors"
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"cannot read .*model.safetensors.*truncated"):
        load_quantized(Tiny(), tmp_path)


def test_missing_and_foreign_tensors(tmp_path):
    q = _saved(tmp_path)
    sd = gptq_state_dict(q, "v1")
    with pytest.raises(CheckpointError, match=r"missing from the checkpoint \(truncated\?\): \['norm.weight'\]"):
        load_quantized(Tiny(), {k: v for k, v in sd.items() if k != "norm.weight"})
    with pytest.raises(CheckpointError, match=r"'up.scales' is missing"):
        load_quantized(Tiny(), {k: v for k, v in sd.items() if k != "up.scales"})
    with pytest.raises(CheckpointError, match=r"quantized layer 'encoder.fc' but the model has no such module"):
        load_quantized(Tiny(), {**sd, "encoder.fc.qweight": sd["up.qweight"]})
    with pytest.raises(CheckpointError, match=r"not in the model .*'extra.weight'"):
        load_quantized(Tiny(), {**sd, "extra.weight": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"'up'.*qweight has shape \(12, 96\), expected \(8, 96\)"):
        load_quantized(Tiny(), {**sd, "up.qweight": torch.zeros(12, 96, dtype=torch.int32)})
    with pytest.raises(CheckpointError, match=r"quant_method='awq'"):
        load_quantized(Tiny(), sd, quantize_config={"bits": 4, "quant_method": "awq"})
    with pytest.raises(CheckpointError, match=r"checkpoint_format='marlin' is not a GPTQ zero convention"):
        load_quantized(Tiny(), sd, quantize_config={"bits": 4, "checkpoint_format": "marlin"})
    with pytest.raises(CheckpointError, match=r"no '<layer>.qweight' tensor"):
        load_quantized(Tiny(), Tiny().state_dict())
    with pytest.raises(CheckpointError, match=r"does not exist"):
        load_quantized(Tiny(), tmp_path / "nope.safetensors")
    with pytest.raises(ValueError, match=r"bits=5 is not supported"):
        load_quantized(Tiny(), sd, quantize_config={"bits": 5, "group_size": 32})


# ------------------------------------------------------------------ transformers, end to end
def test_tiny_llama_end_to_end(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (test-only "
                                                              "dependency: pip install transformers)")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    q = transformers.LlamaForCausalLM(cfg).eval()
    names = quantize_model(q, bits=4, group_size=32, sym=True, dtype=torch.float16)
    assert len(names) == 14   # 7 linears per layer; lm_head stays float
    save_quantized(q, tmp_path, checkpoint_format="v1")
    cfg_q = dict(json.load(open(tmp_path / "quantize_config.json")))
    with open(tmp_path / "config.json", "w") as f:        # HF puts the config in config.json
        json.dump({**cfg.to_dict(), "quantization_config": cfg_q}, f)
    os.remove(tmp_path / "quantize_config.json")

    torch.manual_seed(1)
    fresh = transformers.LlamaForCausalLM(cfg).eval()
    rep = load_quantized(fresh, tmp_path)
    assert len(rep.replaced) == 14 and rep.checkpoint_format == "v1"
    ids = torch.randint(0, 128, (2, 11))
    with torch.no_grad():
        got = fresh(ids).logits
        torch.testing.assert_close(got, q(ids).logits, rtol=0, atol=0)
        deq = _dequantized_float_copy(q, lambda: transformers.LlamaForCausalLM(cfg).eval())
        torch.testing.assert_close(got, deq(ids).logits, rtol=1e-4, atol=1e-4)


def test_model_built_on_meta_device_loads_without_float_weights(tmp_path):
    q = _saved(tmp_path)
    with torch.device("meta"):
        fresh = Tiny()                 # no memory for the float weights
    load_quantized(fresh, tmp_path)
    assert not any(t.is_meta for t in list(fresh.parameters()) + list(fresh.buffers()))
    assert fresh.lm_head.weight is fresh.emb.weight           # tie restored
    ids = torch.randint(0, 50, (2, 5))
    torch.testing.assert_close(fresh(ids), q(ids), rtol=0, atol=0)


def test_missing_group_size_is_inferred_only_when_unambiguous():
    """K=100 in 4 groups fits every group size from 25 to 33: refuse to guess."""
    import pytest
    import torch
    from bie_core.checkpoint.gptq_layout import infer_gptq_geometry
    qw, qz, s = torch.zeros(13, 64, dtype=torch.int32), torch.zeros(4, 8, dtype=torch.int32), torch.ones(4, 64)
    with pytest.raises(ValueError, match="ambiguous"):
        infer_gptq_geometry(qw, qz, s, None, None, None, 100, "layer")
    assert infer_gptq_geometry(qw, qz, s, None, None, 32, 100, "layer")[3] == 32
    qw, qz, s = torch.zeros(512, 64, dtype=torch.int32), torch.zeros(32, 8, dtype=torch.int32), torch.ones(32, 64)
    assert infer_gptq_geometry(qw, qz, s, None, 4, None, 4096, "layer")[3] == 128

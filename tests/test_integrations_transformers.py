"""The "bie" quantization method of transformers: a tiny Llama built from a
config, saved to a temporary folder (float, GPTQ v1/v2, act-order, GreenBit),
loaded with from_pretrained(..., quantization_config=BieConfig(...)); logits
compared with the float model holding the dequantized weights. No download."""
import json
import os

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers", reason="optional extra: pip install transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bie_core import MPQLinear, load_quantized, quantize_model, save_quantized  # noqa: E402
from bie_core.checkpoint import encode_gba_statistics  # noqa: E402
from bie_core.checkpoint.io import write_safetensors  # noqa: E402
from bie_core.integrations import transformers as bie_tf  # noqa: E402
from bie_core.integrations.transformers import BieConfig, BieHfQuantizer, PackedCheckpointLinear  # noqa: E402

AUTO = transformers.AutoModelForCausalLM


def _cfg():
    return transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                    tie_word_embeddings=False)


def _llama(seed=0):
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(_cfg()).eval()


def _float_twin(qmodel):
    """The float Llama whose linears hold qmodel's dequantized weights."""
    f = _llama(seed=123)
    keep = {k: v for k, v in qmodel.state_dict().items()
            if not any(k.endswith(s) for s in (".qweight", ".scales", ".zeros", ".g_idx"))}
    f.load_state_dict(keep, strict=False)
    for name, m in qmodel.named_modules():
        if isinstance(m, MPQLinear):
            with torch.no_grad():
                f.get_submodule(name).weight.copy_(m.dequantize(torch.float32).t())
    return f


def _ids():
    return torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(7))


def _write_hf(model, quant_cfg: dict, tensors: dict, d):
    os.makedirs(d, exist_ok=True)
    write_safetensors(tensors, os.path.join(d, "model.safetensors"))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({**model.config.to_dict(), "quantization_config": quant_cfg}, f)
    return d


def _gptq_checkpoint(tmp_path, fmt="v1", act_order=False, bits=4, group_size=32):
    """A GPTQ checkpoint in the ecosystem layout, written by bie's exporter."""
    q = _llama()
    if act_order:
        for name, m in list(q.named_modules()):
            if type(m) is nn.Linear and not name.endswith("lm_head"):
                calib = torch.randn(64, m.in_features, generator=torch.Generator().manual_seed(1))
                new = MPQLinear.from_float(m, bits=bits, group_size=group_size, act_order=True, calibration=calib,
                                           dtype=torch.float16)
                parent, attr = name.rsplit(".", 1)
                setattr(q.get_submodule(parent), attr, new)
    else:
        quantize_model(q, bits=bits, group_size=group_size, dtype=torch.float16)
    d = tmp_path / f"gptq_{fmt}_{act_order}"
    save_quantized(q, d, checkpoint_format=fmt)
    qc = json.load(open(d / "quantize_config.json"))
    os.remove(d / "quantize_config.json")          # transformers keeps it in config.json
    with open(d / "config.json", "w") as f:
        json.dump({**q.config.to_dict(), "quantization_config": qc}, f)
    return q, d


@pytest.mark.parametrize("fmt,act_order", [("v1", False), ("v2", False), ("v1", True)])
def test_gptq_checkpoint_loads_into_bie_layers(tmp_path, fmt, act_order):
    q, d = _gptq_checkpoint(tmp_path, fmt, act_order)
    m = AUTO.from_pretrained(d, quantization_config=BieConfig())
    layers = [n for n, x in m.named_modules() if isinstance(x, MPQLinear)]
    assert len(layers) == 14 and isinstance(m.lm_head, nn.Linear)
    assert not any(isinstance(x, PackedCheckpointLinear) for x in m.modules())
    assert all(m.get_submodule(n).act_order == act_order for n in layers)
    c = m.config.quantization_config
    assert isinstance(c, BieConfig) and c.source == "gptq" and c.bits == 4 and c.group_size == 32
    assert c.checkpoint_format == ("gptq" if fmt == "v1" else "gptq_v2")
    ids = _ids()
    with torch.no_grad():
        got = m(ids).logits
        torch.testing.assert_close(got, q(ids).logits, rtol=0, atol=0)      # same packed weights
        torch.testing.assert_close(got, _float_twin(q)(ids).logits, rtol=1e-4, atol=1e-4)


def test_float_weights_are_never_allocated(tmp_path, monkeypatch):
    """The preprocess hook replaces the checkpoint's quantized linears before
    any weight is read: at that point nothing at those names holds a float weight."""
    q, d = _gptq_checkpoint(tmp_path)
    seen = {}
    original = BieHfQuantizer._process_model_before_weight_loading

    def spy(self, model, **kw):
        out = original(self, model, **kw)
        seen["linears"] = [n for n, x in model.named_modules() if isinstance(x, nn.Linear)]
        seen["placeholders"] = [x for x in model.modules() if isinstance(x, PackedCheckpointLinear)]
        seen["meta"] = all(b.is_meta for x in seen["placeholders"] for b in x.buffers())
        return out

    monkeypatch.setattr(BieHfQuantizer, "_process_model_before_weight_loading", spy)
    AUTO.from_pretrained(d, quantization_config=BieConfig())
    assert seen["linears"] == ["lm_head"] and len(seen["placeholders"]) == 14 and seen["meta"]
    # the placeholder's buffers are exactly the file's tensors of that layer
    names = sorted(n for n, _ in seen["placeholders"][0].named_buffers())
    assert names == ["g_idx", "qweight", "qzeros", "scales"]


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_float_checkpoint_is_quantized_on_load(tmp_path, bits):
    f = _llama()
    f.save_pretrained(tmp_path / "float")
    m = AUTO.from_pretrained(tmp_path / "float", quantization_config=BieConfig(bits=bits, group_size=32,
                                                                                 skip=("lm_head", "down_proj")))
    layers = {n: x for n, x in m.named_modules() if isinstance(x, MPQLinear)}
    assert len(layers) == 12 and all(x.bits == bits and x.group_size == 32 for x in layers.values())
    assert type(m.model.layers[0].mlp.down_proj) is nn.Linear and type(m.lm_head) is nn.Linear
    # the same as quantizing the float model with bie directly
    ref = _llama()
    quantize_model(ref, bits=bits, group_size=32, skip=("lm_head", "down_proj"))
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(m(ids).logits, ref(ids).logits, rtol=0, atol=0)
        torch.testing.assert_close(m(ids).logits, _float_twin(ref)(ids).logits, rtol=1e-4, atol=1e-4)


def test_save_pretrained_round_trip_gptq_layout(tmp_path):
    q, d = _gptq_checkpoint(tmp_path, "v1", act_order=True)
    m = AUTO.from_pretrained(d, quantization_config=BieConfig())
    m.save_pretrained(tmp_path / "saved")
    qc = json.load(open(tmp_path / "saved" / "config.json"))["quantization_config"]
    assert qc["quant_method"] == "gptq" and qc["bits"] == 4 and qc["group_size"] == 32
    assert qc["desc_act"] is True and qc["checkpoint_format"] == "gptq"
    from safetensors import safe_open
    with safe_open(str(tmp_path / "saved" / "model.safetensors"), "pt") as h:
        keys = set(h.keys())
    p = "model.layers.0.self_attn.q_proj"
    assert {f"{p}.qweight", f"{p}.qzeros", f"{p}.scales", f"{p}.g_idx"} <= keys and f"{p}.zeros" not in keys
    ids = _ids()
    # bie's own loader and this integration read it back, bit for bit
    fresh = _llama(seed=5)
    load_quantized(fresh, tmp_path / "saved")
    again = AUTO.from_pretrained(tmp_path / "saved", quantization_config=BieConfig())
    with torch.no_grad():
        ref = q(ids).logits
        torch.testing.assert_close(fresh(ids).logits, ref, rtol=0, atol=0)
        torch.testing.assert_close(again(ids).logits, ref, rtol=0, atol=0)


def test_save_pretrained_uses_v2_when_a_zero_point_is_zero(tmp_path):
    f = _llama()
    with torch.no_grad():
        f.model.layers[0].mlp.up_proj.weight.abs_()        # all-positive groups: z = 0
    f.save_pretrained(tmp_path / "float")
    m = AUTO.from_pretrained(tmp_path / "float", quantization_config=BieConfig(group_size=32))
    m.save_pretrained(tmp_path / "saved")
    qc = json.load(open(tmp_path / "saved" / "config.json"))["quantization_config"]
    assert qc["checkpoint_format"] == "gptq_v2"
    again = AUTO.from_pretrained(tmp_path / "saved", quantization_config=BieConfig())
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, m(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("double_quantized", [False, True])
def test_greenbit_checkpoint_loads(tmp_path, double_quantized):
    q = _llama()
    quantize_model(q, bits=2, group_size=32, format="gba", dtype=torch.float16)
    tensors = {}
    for k, v in q.state_dict().items():
        tensors[k] = v
    if double_quantized:
        for name, x in q.named_modules():
            if isinstance(x, MPQLinear):
                enc = encode_gba_statistics(x.scales, x.zeros, dq=16)
                del tensors[f"{name}.scales"], tensors[f"{name}.zeros"]
                tensors.update({f"{name}.{k}": v for k, v in enc.items()})
                # the layer the checkpoint describes: decoded statistics
                from bie_core.checkpoint import decode_gba_statistics
                s, z = decode_gba_statistics(enc["qstatistic"], enc["qscales_scales"], enc["qscales_zeros"],
                                             enc["qzeros_scales"], enc["qzeros_zeros"], x.out_features, torch.float16)
                x.scales.copy_(s)
                x.zeros.copy_(z)
    d = _write_hf(q, {"quant_method": "gba", "bits": 2, "group_size": 32}, tensors, tmp_path / "gba")
    m = AUTO.from_pretrained(d, quantization_config=BieConfig())
    layers = [x for x in m.modules() if isinstance(x, MPQLinear)]
    assert len(layers) == 14 and all(x.format == "gba" and x.bits == 2 for x in layers)
    assert m.config.quantization_config.source == "gba"
    # the model is float32: double-quantized statistics decode in float32 (q holds them in float16)
    exact = 0 if not double_quantized else 2e-3
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(m(ids).logits, q(ids).logits, rtol=0, atol=exact)
        torch.testing.assert_close(m(ids).logits, _float_twin(q)(ids).logits, rtol=1e-4, atol=1e-4 + exact)
    # bie's GreenBit checkpoints name quant_method "gba", registered too: no argument needed
    assert isinstance(AUTO.from_pretrained(d).model.layers[1].mlp.up_proj, MPQLinear)


def test_config_validation_and_features():
    with pytest.raises(ValueError, match=r"bits=5 is not supported"):
        BieConfig(bits=5)
    with pytest.raises(ValueError, match=r"group_size=100 is not supported"):
        BieConfig(group_size=100)
    with pytest.raises(ValueError, match=r"checkpoint_format='v3'"):
        BieConfig(checkpoint_format="v3")
    c = BieConfig(bits=3, group_size=64, trainable=True, backend="cpu")
    again = BieConfig.from_dict(c.to_dict())
    assert (again.bits, again.group_size, again.trainable, again.backend) == (3, 64, True, "cpu")
    qz = BieHfQuantizer(c, pre_quantized=False)
    assert qz.is_trainable and qz.is_compileable and qz.is_qat_trainable and qz.is_serializable()
    assert not BieHfQuantizer(BieConfig(), pre_quantized=False).is_qat_trainable
    bie_tf.register()              # idempotent
    from transformers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING, AUTO_QUANTIZER_MAPPING
    assert AUTO_QUANTIZATION_CONFIG_MAPPING["bie"] is BieConfig and AUTO_QUANTIZER_MAPPING["bie"] is BieHfQuantizer


def test_trainable_packed_layers_and_backend_reach_the_layers(tmp_path):
    q, d = _gptq_checkpoint(tmp_path)
    m = AUTO.from_pretrained(d, quantization_config=BieConfig(trainable=True, backend="cpu"))
    layers = [x for x in m.modules() if isinstance(x, MPQLinear)]
    assert all(x.trainable and x.backend == "cpu" for x in layers)


def test_checkpoint_of_another_model_is_refused(tmp_path):
    q, d = _gptq_checkpoint(tmp_path)
    cfg = json.load(open(d / "config.json"))
    with open(d / "config.json", "w") as f:
        json.dump({**cfg, "num_hidden_layers": 1}, f)
    with pytest.raises(Exception, match=r"quantized layer 'model.layers.1.* has no such module"):
        AUTO.from_pretrained(d, quantization_config=BieConfig())
    with open(d / "config.json", "w") as f:
        json.dump({**cfg, "intermediate_size": 128}, f)
    with pytest.raises(Exception, match=r"mlp.down_proj.*qweight has shape"):
        AUTO.from_pretrained(d, quantization_config=BieConfig())


def test_dequantize_gives_the_float_twin(tmp_path):
    q, d = _gptq_checkpoint(tmp_path)
    m = AUTO.from_pretrained(d, quantization_config=BieConfig())
    ids = _ids()
    with torch.no_grad():
        before = m(ids).logits
    m = m.dequantize()
    assert not any(isinstance(x, MPQLinear) for x in m.modules())
    assert getattr(m.config, "quantization_config", None) is None
    with torch.no_grad():
        torch.testing.assert_close(m(ids).logits, before, rtol=1e-4, atol=1e-4)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
def test_gptq_checkpoint_loads_onto_the_gpu_without_float_weights(tmp_path):
    q, d = _gptq_checkpoint(tmp_path, "v1", act_order=True)
    float_bytes = sum(p.numel() * 4 for p in _llama().parameters())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    m = AUTO.from_pretrained(d, quantization_config=BieConfig(), device_map="cuda")
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    layers = [x for x in m.modules() if isinstance(x, MPQLinear)]
    assert len(layers) == 14 and all(x.qweight.is_cuda for x in layers)
    # packed linears + float embedding/head/norms: well under the float model
    assert peak < 0.6 * float_bytes, (peak, float_bytes)
    ids = _ids()
    with torch.no_grad():
        got = m(ids.cuda()).logits.cpu()
        torch.testing.assert_close(got, q(ids).logits, rtol=2e-3, atol=2e-3)
    m.save_pretrained(tmp_path / "from_gpu")
    fresh = _llama(seed=9)
    load_quantized(fresh, tmp_path / "from_gpu")
    with torch.no_grad():
        torch.testing.assert_close(fresh(ids).logits, q(ids).logits, rtol=0, atol=0)


@needs_cuda
def test_float_checkpoint_quantized_on_load_on_the_gpu(tmp_path):
    # wide enough that the allocator's 512-byte rounding of small tensors does not blur the bound below
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    f = transformers.LlamaForCausalLM(cfg).eval()
    f.save_pretrained(tmp_path / "float")
    float_bytes = sum(p.numel() * 4 for p in f.parameters())
    largest = max(m.weight.numel() * 4 for m in f.modules() if isinstance(m, torch.nn.Linear))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    m = AUTO.from_pretrained(tmp_path / "float", quantization_config=BieConfig(bits=4, group_size=32),
                             device_map="cuda")
    torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated() - base
    # loaded on the CPU, each linear quantized on the GPU alone: the peak is what stays plus a few copies of one
    # layer, never the whole float model (the bound is below it, so a whole-model copy fails here)
    bound = resident + 3 * largest
    assert bound < float_bytes
    assert torch.cuda.max_memory_allocated() - base < bound
    assert all(t.is_cuda for t in list(m.parameters()) + list(m.buffers()))
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(cfg).eval()
    quantize_model(ref, bits=4, group_size=32)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(m(ids.cuda()).logits.cpu(), ref(ids).logits, rtol=2e-3, atol=2e-3)


def test_float_checkpoint_for_an_accelerator_loads_through_the_cpu():
    """update_device_map sends a float checkpoint bound for one accelerator to
    the CPU and remembers the target; quantized checkpoints load in place."""
    qz = BieHfQuantizer(BieConfig(), pre_quantized=False)
    assert qz.update_device_map({"": torch.device("cuda", 0)}) == {"": torch.device("cpu")}
    assert qz._target_device == torch.device("cuda", 0)
    assert qz.update_device_map({"": 1}) == {"": torch.device("cpu")} and qz._target_device == torch.device("cuda", 1)
    for keep in ({"": torch.device("cpu")}, "auto", None, {"model": 0, "lm_head": 1}):
        assert qz.update_device_map(keep) == keep and qz._target_device is None
    pre = BieHfQuantizer(BieConfig(), pre_quantized=True)
    assert pre.update_device_map({"": torch.device("cuda", 0)}) == {"": torch.device("cuda", 0)}
    # the per-layer path itself (the target here is the CPU: the machine may have no accelerator)
    f = _llama()
    qz._target_device = torch.device("cpu")
    qz._quantize_float_model(f)
    assert sum(isinstance(x, MPQLinear) for x in f.modules()) == 14 and type(f.lm_head) is nn.Linear


def test_gptq_checkpoint_without_a_config_is_read_from_its_shapes(tmp_path):
    """No quantization_config anywhere: the tensors make it a GPTQ checkpoint,
    and bits / group size come from their shapes, not from BieConfig's defaults."""
    q, d = _gptq_checkpoint(tmp_path, bits=2, group_size=32)
    cfg = json.load(open(d / "config.json"))
    del cfg["quantization_config"]
    with open(d / "config.json", "w") as f:
        json.dump(cfg, f)
    m = AUTO.from_pretrained(d, quantization_config=BieConfig())        # defaults: bits=4, group_size=128
    layers = [x for x in m.modules() if isinstance(x, MPQLinear)]
    assert len(layers) == 14 and all(x.bits == 2 and x.group_size == 32 for x in layers)
    assert (m.config.quantization_config.bits, m.config.quantization_config.group_size) == (2, 32)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(m(ids).logits, q(ids).logits, rtol=0, atol=0)

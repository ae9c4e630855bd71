"""bie_core.compat.bitorch_engine: a model written with BITorch Engine's
documented API (class names, constructor arguments, lifecycle helpers) trains
and loads its checkpoints on bie; MPQ state dicts in that library's layout load."""
import warnings

import pytest
import torch
from torch import nn

from bie_core import BieFallbackWarning, MPQLinear
from bie_core.compat import bitorch_engine as be
from bie_core.layers import BinaryLinear, BinaryMatMul as BieBinaryMatMul, QMatMul


class BitorchStyleNet(nn.Module):
    """A small CNN as a BITorch Engine user writes it."""

    def __init__(self):
        super().__init__()
        self.conv = be.BinaryConv2dCPP(in_channels=8, out_channels=16, kernel_size=3, stride=1, padding=1)
        self.qconv = be.Q4Conv2dCutlass(16, 16, 3, padding=1)
        self.fc1 = be.BinaryLinearCuda(16 * 4 * 4, 64, bmm_type=be.BMM.ADAPTIVE)
        self.fc2 = be.Q8LinearCutlass(64, 32)
        self.fc3 = be.Q4LinearCutlass(32, 10)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        x = torch.relu(self.qconv(x))
        x = nn.functional.avg_pool2d(x, 2).flatten(1)
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def test_bitorch_style_model_trains_and_loads_its_checkpoints(tmp_path):
    torch.manual_seed(0)
    net = BitorchStyleNet()
    be.prepare_bie_layers(net)
    x = torch.randn(32, 8, 8, 8)
    t = (x[:, 0].mean((1, 2)) > 0).long() + 2 * (x[:, 1].mean((1, 2)) > 0).long()   # learnable labels
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BieFallbackWarning)
        for _ in range(40):
            loss = nn.functional.cross_entropy(net(x), t)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < 0.8 * losses[0], losses
        net.eval()
        with torch.no_grad():
            y_train_form = net(x)
        be.save_checkpoint(net, str(tmp_path / "ckpt.pt"), qweight_only=True)
        assert not hasattr(net.fc1, "weight") or net.fc1.weight is None     # packed
        with torch.no_grad():
            torch.testing.assert_close(net(x), y_train_form, rtol=1e-5, atol=1e-5)
        fresh = BitorchStyleNet().eval()
        be.load_checkpoint(fresh, str(tmp_path / "ckpt.pt"), qweight_only=True)
        with torch.no_grad():
            torch.testing.assert_close(fresh(x), net(x), rtol=0, atol=0)


def test_named_backend_is_a_preference_with_the_standard_warning():
    be._warned.clear()
    layer = be.BinaryLinearCuda(32, 16)
    assert isinstance(layer, BinaryLinear) and layer.backend is None
    x = torch.randn(4, 32)
    if not torch.cuda.is_available():
        with pytest.warns(BieFallbackWarning, match=r"BinaryLinearCuda: backend 'cuda' .*automatic backend selection"):
            y = layer(x)
    else:
        y = layer(x)
    ref = BinaryLinear(32, 16)
    ref.load_state_dict(layer.state_dict())
    torch.testing.assert_close(y, ref(x), rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BieFallbackWarning)
        layer(x)                    # once per class and device
        be.BinaryLinearCPP(32, 16)(x)     # the cpu backend serves cpu tensors: no warning


def test_matmuls_take_y_as_n_by_k():
    x, y = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BieFallbackWarning)
        for compat, bie in ((be.BinaryMatMul(), BieBinaryMatMul()), (be.Q4MatMul(), QMatMul(bits=4))):
            out = compat(x, y)
            assert out.shape == (2, 5, 7)
            bie.load_state_dict(compat.state_dict())
            torch.testing.assert_close(out, bie(x, y.transpose(-1, -2)), rtol=0, atol=0)


def _reference_mpq(fmt):
    torch.manual_seed(2)
    lin = nn.Linear(64, 32, bias=False)
    return MPQLinear.from_float(lin, bits=4, group_size=32, format=fmt, dtype=torch.float16)


def test_mpq_linear_cuda_reads_bitorch_gptq_state_dicts():
    ref = _reference_mpq("gptq")
    sd = {**ref.to_gptq("v1"), "bias": torch.zeros(32, dtype=torch.float16),
          "wf": torch.arange(0, 32, 4, dtype=torch.int32).unsqueeze(0)}
    sd.pop("wf")
    layer = be.MPQLinearCuda(64, 32, w_bit=4, group_size=32, use_gba_quant=False, asym=True, requires_grad=False)
    be.prepare_bie_layers(layer)
    del sd["bias"]                          # disable_bias=True: no bias in the layer
    layer.load_state_dict(sd)
    x = torch.randn(3, 64, dtype=torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BieFallbackWarning)
        torch.testing.assert_close(layer(x), ref(x), rtol=0, atol=0)


def test_mpq_linear_cuda_reads_greenbit_double_quantized_statistics():
    from bie_core.checkpoint import decode_gba_statistics, encode_gba_statistics
    ref = _reference_mpq("gba")
    enc = encode_gba_statistics(ref.scales, ref.zeros, dq=16)
    s, z = decode_gba_statistics(enc["qstatistic"], enc["qscales_scales"], enc["qscales_zeros"],
                                 enc["qzeros_scales"], enc["qzeros_zeros"], 32, torch.float16)
    ref.scales.copy_(s)
    ref.zeros.copy_(z)
    sd = {"qweight": ref.qweight, "g_idx": ref.g_idx, **enc}
    layer = be.MPQLinearCuda(64, 32, w_bit=4, group_size=32, dq_group_size=16, requires_grad=False)
    layer.load_state_dict(sd)
    x = torch.randn(3, 64, dtype=torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BieFallbackWarning)
        torch.testing.assert_close(layer(x), ref(x), rtol=0, atol=0)


def test_constructor_arguments_and_clear_errors():
    m = be.MPQLinearMlx(128, 64, w_bit=2, group_size=32, requires_grad=True)
    assert isinstance(m, MPQLinear) and m.bits == 2 and m.format == "gba" and m.trainable and m.bias is None
    assert be.MPQLinearCuda(128, 64, group_size=128).group_size == -1      # group_size = in_channels
    w = be.MBWQLinearCuda(128, 64, w_bit=4, group_size=32)
    assert w.group_bits == [4] * 4
    e = be.BinaryEmbeddingCuda(num_embeddings=10, embedding_dim=12, padding_idx=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BieFallbackWarning)
        assert e(torch.tensor([[0, 3]])).shape == (1, 2, 12)
    with pytest.raises(ValueError, match=r"a_bit=8"):
        be.MPQLinearCuda(64, 32, a_bit=8)
    with pytest.raises(ValueError, match=r"use_gba_quant=True with asym=True"):
        be.MPQLinearCuda(64, 32, asym=True)
    with pytest.raises(NotImplementedError, match=r"packed layouts are kernel-specific"):
        be.Q4LinearCutlass(32, 8).set_quantized_weight_data(torch.zeros(8, 16, dtype=torch.int8))
    q = be.Q8LinearCutlass(32, 8)
    q.set_weight_data(torch.ones(8, 32))
    assert q.weight.requires_grad and torch.equal(q.opt_weight, torch.ones(8, 32))
    with pytest.raises(ValueError, match=r"set_weight_data: got shape \(8, 16\)"):
        q.set_weight_data(torch.ones(8, 16))


def test_mbwq_linear_cuda_adopts_a_mixed_width_bie_checkpoint():
    from bie_core import MBWQLinear
    torch.manual_seed(4)
    ref = MBWQLinear.from_float(nn.Linear(128, 32, bias=False), bits={4: 0.5, 2: 0.5}, group_size=32,
                                dtype=torch.float16)
    layer = be.MBWQLinearCuda(128, 32, w_bit=4, group_size=32, requires_grad=False)
    layer.load_state_dict(ref.state_dict())
    assert layer.group_bits == ref.group_bits and sorted(set(layer.group_bits)) == [2, 4]
    x = torch.randn(2, 128, dtype=torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BieFallbackWarning)
        out = layer(x)
    assert out.shape == (2, 32)                     # 2-D in, 2-D out
    torch.testing.assert_close(out, ref(x), rtol=0, atol=0)

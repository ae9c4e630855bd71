"""bie_core.fold_batchnorm: eval-mode BatchNorm2d folded into the nn.Conv2d / packed QConv2d / BinaryConv2d before
it, the same function up to the rounding of the folded scale and bias; everything it must leave alone."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import bie_core
from bie_core import BinaryConv2d, QConv2d, fold_batchnorm


def _bn(c: int, gen, affine: bool = True) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(c, affine=affine)
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(c, generator=gen) * 0.5)
        bn.running_var.copy_(torch.rand(c, generator=gen) * 2 + 0.1)
        if affine:
            bn.weight.copy_(torch.randn(c, generator=gen))      # negative gammas included
            bn.bias.copy_(torch.randn(c, generator=gen) * 0.3)
    return bn


def _packed(m: nn.Module, x: torch.Tensor) -> nn.Module:
    m.train()
    with torch.no_grad():
        m(x)                       # first-batch scales
    m.eval()
    bie_core.pack(m)
    return m


CONVS = {
    "conv2d": lambda: nn.Conv2d(6, 8, 3, padding=1, bias=False),
    "conv2d_bias": lambda: nn.Conv2d(6, 8, 3, stride=2, padding=1, bias=True),
    "qconv8": lambda: QConv2d(6, 8, 3, padding=1, w_bits=8, a_bits=8),
    "qconv4_pc_bias": lambda: QConv2d(6, 8, 3, padding=1, w_bits=4, a_bits=4, per_channel=True, bias=True),
    "binary": lambda: BinaryConv2d(6, 8, 3, padding=1),
    "binary_pc_grouped": lambda: BinaryConv2d(6, 8, 3, padding=1, groups=2, per_channel=True, bias=True),
}


@pytest.mark.parametrize("kind", list(CONVS))
@pytest.mark.parametrize("affine", [True, False])
def test_folded_pair_computes_the_same(kind, affine):
    gen = torch.Generator().manual_seed(len(kind) + affine)
    x = torch.randn(3, 6, 7, 7, generator=gen)
    torch.manual_seed(1)
    conv = CONVS[kind]()
    if isinstance(conv, (QConv2d, BinaryConv2d)):
        _packed(conv, x)
    model = nn.Sequential(conv, _bn(8, gen, affine)).eval()
    with torch.no_grad():
        want = model(x)
        # the bound inference path is made before folding: it must follow the new scale and bias
        with torch.inference_mode():
            model(x)
    report = fold_batchnorm(model)
    assert report.folded == [("0", "1")] and not report.skipped and report.found_by == "fx graph"
    assert isinstance(model[1], nn.Identity)
    with torch.no_grad():
        got = model(x)
    with torch.inference_mode():
        got_lean = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got_lean, got)
    if isinstance(conv, (QConv2d, BinaryConv2d)):
        assert conv.per_channel and conv.weight_scale.shape == (8,)
        # the folded layer saves and loads like any packed layer with a bias and a per-channel scale
        fresh = _packed(type(conv)(**{**_ctor_kwargs(kind), "per_channel": True, "bias": True}), x)
        fresh.load_state_dict(conv.state_dict())
        with torch.no_grad():
            assert torch.equal(fresh.eval()(x), got)


def _ctor_kwargs(kind):
    m = CONVS[kind]()
    kw = dict(in_channels=m.in_channels, out_channels=m.out_channels, kernel_size=m.kernel_size, padding=m.padding,
              groups=m.groups, bias=m.bias is not None)
    if isinstance(m, QConv2d):
        kw.update(w_bits=m.w_bits, a_bits=m.a_bits)
    return kw


def test_bf16_pairs_agree_within_the_dtype():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 6, 8, 8, generator=gen).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    torch.manual_seed(2)
    model = nn.Sequential(_packed(QConv2d(6, 8, 3, padding=1, w_bits=8, a_bits=8, dtype=torch.bfloat16), x),
                          _bn(8, gen).to(torch.bfloat16)).eval()
    with torch.no_grad():
        want = model(x).float()
        fold_batchnorm(model)
        got = model(x).float()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


class _Block(nn.Module):
    """A ResNet basic block: conv-bn-relu-conv-bn, plus a shortcut whose conv output also feeds a second reader."""

    def __init__(self, gen):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn1 = _bn(4, gen)
        self.conv2 = _packed(QConv2d(4, 4, 3, padding=1, w_bits=8, a_bits=8), torch.randn(2, 4, 6, 6))
        self.bn2 = _bn(4, gen)
        self.conv3 = nn.Conv2d(4, 4, 1)
        self.bn3 = _bn(4, gen)
        self.conv4 = QConv2d(4, 4, 3, padding=1, w_bits=8, a_bits=8)     # never packed
        self.bn4 = _bn(4, gen)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        s = self.conv3(x)
        y = y + self.bn3(s) + s                                          # conv3's output has two readers
        return self.bn4(self.conv4(y))


def test_a_block_folds_what_it_may_and_says_why_not():
    gen = torch.Generator().manual_seed(7)
    torch.manual_seed(3)
    block = _Block(gen)
    x = torch.randn(2, 4, 6, 6, generator=gen)
    block.conv4(x)                                                       # scales of the unpacked layer
    block.eval()
    with torch.no_grad():
        want = block(x)
    report = fold_batchnorm(block)
    assert report.folded == [("conv1", "bn1"), ("conv2", "bn2")]
    assert [(c, b) for c, b, _ in report.skipped] == [("conv4", "bn4")] and "pack()" in report.skipped[0][2]
    assert isinstance(block.bn1, nn.Identity) and isinstance(block.bn3, nn.BatchNorm2d)
    assert isinstance(block.bn4, nn.BatchNorm2d) and "conv1 <- bn1" in str(report)
    with torch.no_grad():
        got = block(x)
    # conv2's folded output feeds conv4's activation quantization: a value within rounding of a code boundary may
    # take the neighbouring code, so compare by element agreement
    close = torch.isclose(got, want, rtol=1e-4, atol=1e-4)
    assert close.float().mean() > 0.98, (got - want).abs().max()


class _Untraceable(nn.Module):
    def __init__(self, gen):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), _bn(4, gen), nn.ReLU())

    def forward(self, x):
        if x.sum() > 0:              # data-dependent control flow: fx cannot trace it
            return self.body(x)
        return self.body(-x)


def test_untraceable_models_fold_sequential_pairs():
    gen = torch.Generator().manual_seed(9)
    m = _Untraceable(gen).eval()
    x = torch.randn(1, 3, 5, 5, generator=gen).abs()
    with torch.no_grad():
        want = m(x)
        report = fold_batchnorm(m)
        got = m(x)
    assert report.found_by == "nn.Sequential order" and report.folded == [("body.0", "body.1")]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_bad_input_is_refused_or_left():
    gen = torch.Generator().manual_seed(11)
    m = nn.Sequential(nn.Conv2d(3, 4, 3), _bn(4, gen))
    with pytest.raises(ValueError, match="eval"):
        fold_batchnorm(m)                                                # a training-mode model
    with pytest.raises(TypeError, match="nn.Module"):
        fold_batchnorm(torch.zeros(3))
    m.eval()
    m[1].train()                                                         # a BatchNorm still in training mode
    report = fold_batchnorm(m)
    assert not report.folded and "training mode" in report.skipped[0][2]
    m2 = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False)).eval()
    report = fold_batchnorm(m2)
    assert not report.folded and "running statistics" in report.skipped[0][2]
    before = copy.deepcopy(m2.state_dict())
    assert all(torch.equal(before[k], v) for k, v in m2.state_dict().items())


@pytest.mark.parametrize("groups, pad_value, padding", [(1, -1.0, 0), (2, 0.0, 1), (1, 0.0, 2), (2, 1.0, 0)])
def test_batchnorm_folds_into_the_next_binary_conv(groups, pad_value, padding):
    """BatchNorm -> packed BinaryConv2d: the BatchNorm goes into the layer's input shift (and, for channels with a
    negative scale, the signs of that input channel's weights), the same function (binary outputs: equal unless an
    input lands within rounding of its threshold)."""
    gen = torch.Generator().manual_seed(groups * 10 + padding)
    x = torch.randn(3, 8, 7, 7, generator=gen)
    torch.manual_seed(4)
    conv = _packed(BinaryConv2d(8, 6, 3, padding=padding, groups=groups, pad_value=pad_value, bias=True), x)
    bn = _bn(8, gen)
    model = nn.Sequential(nn.Conv2d(8, 8, 1), nn.ReLU(), bn, conv).eval()      # ReLU: the BatchNorm folds forward
    with torch.no_grad():
        want = model(x)
        with torch.inference_mode():
            model(x)                                                            # bound path made before the fold
    assert bool((bn.weight < 0).any())                                          # negative scales exercised
    report = fold_batchnorm(model)
    assert report.folded_forward == [("2", "3")] and not report.folded and not report.skipped, str(report)
    assert isinstance(model[2], nn.Identity) and "2 -> 3" in str(report)
    with torch.no_grad():
        got = model(x)
    with torch.inference_mode():
        got_lean = model(x)
    assert torch.equal(got_lean, got)
    assert (got != want).float().mean() < 1e-3, (got - want).abs().max()


def test_forward_fold_left_where_padding_would_flip():
    gen = torch.Generator().manual_seed(21)
    x = torch.randn(2, 4, 6, 6, generator=gen)
    torch.manual_seed(5)
    bn = _bn(4, gen)
    with torch.no_grad():
        bn.weight[1] = -1.0
    model = nn.Sequential(nn.Identity(), bn, _packed(BinaryConv2d(4, 4, 3, padding=1, pad_value=-1.0), x)).eval()
    with torch.no_grad():
        want = model(x)
        report = fold_batchnorm(model)
        got = model(x)
    assert not report.folded_forward and "padding" in report.skipped[0][2]
    assert isinstance(model[1], nn.BatchNorm2d) and torch.equal(got, want)

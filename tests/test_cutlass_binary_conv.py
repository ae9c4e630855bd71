"""bie-backend-cutlass, binary_conv family: the implicit-GEMM 1-bit conv on Hopper against the reference.

Fresh random inputs each run; every input dtype (with zeros, -0.0 and NaN, which packs as -1), pad values -1 and
+1, every configuration (conv tiles and the window GEMM), every output dtype with scalar and per-channel scales
and a bias; shapes with output channels that fill no tile, one-pixel images whose windows are mostly padding,
strides, dilations, non-square kernels and more channels than one K step. Counts and float outputs must be bit-exact (the epilogue rounds as the op
defines). The dispatcher's choice and the channels_last output are checked, and so are the shapes it declines.

The same kernels on a padded sign operand made elsewhere (``binary_conv2d_signs``), and the compiled BinaryConv2d
that makes the operand in its graph. Without an sm_90 GPU and the CUTLASS headers, only the light checks run.
"""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

import bie_core
from bie_core import ops
from bie_core.ops.binary import packed_len, sign_operand

sys.path.insert(0, os.path.dirname(__file__))
from _compiled_graph import graph_code  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bie_backend_cutlass") is None,
                                reason="bie-backend-cutlass is not installed")


def _usable() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    from bie_backend_cutlass import descriptor
    reason = descriptor.backend.probe()
    if reason:
        return reason
    if torch.cuda.get_device_capability() != (9, 0):
        return "the 1-bit wgmma needs sm_90"
    return None


needs_kernels = pytest.mark.skipif(_usable() is not None, reason=str(_usable()))

# (N, C, H, W, O, kernel, stride, padding, dilation)
SHAPES = [
    (2, 64, 9, 7, 8, (3, 3), (1, 1), (1, 1), (1, 1)),
    (1, 128, 14, 14, 128, (3, 3), (1, 1), (1, 1), (1, 1)),
    (3, 256, 7, 7, 264, (3, 3), (2, 2), (1, 1), (1, 1)),       # output channels past a whole tile
    (2, 192, 11, 13, 64, (1, 1), (1, 1), (0, 0), (1, 1)),
    (1, 64, 16, 16, 256, (5, 5), (1, 1), (2, 2), (1, 1)),
    (2, 128, 12, 10, 40, (3, 3), (1, 1), (2, 2), (2, 2)),      # dilated
    (1, 64, 10, 9, 16, (3, 1), (3, 2), (0, 1), (1, 1)),        # non-square kernel, strides 3 and 2
    (2, 512, 4, 4, 512, (3, 3), (1, 1), (1, 1), (1, 1)),       # four K steps a tap
    (1, 64, 1, 2, 8, (3, 3), (1, 1), (1, 1), (1, 1)),          # 1x2 pixels: most taps are padding
    (1, 64, 3, 3, 16, (3, 3), (1, 1), (3, 3), (1, 1)),         # padding wider than the kernel's reach
]


def _x(n, c, h, w, dtype, gen):
    x = torch.randn((n, c, h, w), generator=gen)
    flat = x.view(-1)
    idx = torch.randperm(flat.numel(), generator=gen)[:max(3, flat.numel() // 50)]
    flat[idx[0::3]] = 0.0
    flat[idx[1::3]] = -0.0
    if dtype.is_floating_point:
        flat[idx[2::3]] = float("nan")
    else:
        x = (x * 40).round().clamp(-128, 127)
    return x.to(dtype).cuda().contiguous(memory_format=torch.channels_last)


def _w(o, k, gen):
    return torch.randint(0, 256, (o, packed_len(k)), generator=gen, dtype=torch.uint8).cuda()


def _ref(*args):
    from bie_core.backend_api import reference_kernel
    return reference_kernel("binary_conv2d")(*args)


def _exact(out, ref, what):
    assert out.shape == ref.shape and out.dtype == ref.dtype, (what, out.shape, ref.shape, out.dtype, ref.dtype)
    assert out.is_contiguous(memory_format=torch.channels_last), (what, out.stride())
    same = (out == ref) | (out.isnan() & ref.isnan()) if out.is_floating_point() else out == ref
    assert bool(same.all()), f"{what}: {int((~same).sum())} of {out.numel()} differ"


def test_import_is_light():
    import subprocess
    import sys
    code = ("import bie_backend_cutlass.binary_conv as b\n"
            "from bie_backend_cutlass import _build\n"
            "assert 'binary_conv' not in _build._loaded, _build._loaded\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_config_table_matches_the_kernels():
    """CONFIGS (Python) and the kernels' table (csrc) name the same configurations in the same order: the conv
    tiles first, then the window GEMMs from kFirstWindowConfig, each with one instantiation per output type (CPU:
    reads the sources)."""
    import re
    from pathlib import Path
    from bie_backend_cutlass import binary_conv as bc
    csrc = Path(bc.__file__).with_name("csrc")
    launch = (csrc / "binary_conv_launch.h").read_text()
    assert int(re.search(r"kNumConfigs = (\d+);", launch).group(1)) == len(bc.CONFIGS)
    first_window = int(re.search(r"kFirstWindowConfig = (\d+);", launch).group(1))
    assert [c.startswith("w") for c in bc.CONFIGS] == [i >= first_window for i in range(len(bc.CONFIGS))]
    table = re.findall(r"\{bconv_(\w+?)_i32, bconv_\1_f32, bconv_\1_bf16, bconv_\1_f16\}",
                       (csrc / "binary_conv_pack.cu").read_text())
    assert tuple(table) == bc.CONFIGS
    for c in bc.CONFIGS:
        macro = "BIE_BWIN_DEFINE" if c.startswith("w") else "BIE_BCONV_DEFINE"
        for t in ("i32", "f32", "bf16", "f16"):
            assert f"{macro}({c}, {t}," in (csrc / f"binary_conv_{c}_{t}.cu").read_text()


def test_prepared_weight_holds_signs_and_complements():
    """(O, kh, kw, C/4) bytes: per tap the C sign bits in channel order (bit i % 8 of byte i // 8), then their
    complements; checked against the unpacked OIHW signs (CPU)."""
    from bie_backend_cutlass.binary_conv import prepare_weight
    gen = torch.Generator().manual_seed(3)
    o, c, kh, kw = 5, 64, 3, 2
    w = torch.randint(0, 256, (o, packed_len(c * kh * kw)), generator=gen, dtype=torch.uint8)
    wp = prepare_weight(w, [kh, kw]).view(torch.uint8)
    assert wp.shape == (o, kh, kw, c // 4)
    bits = ((wp.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1).reshape(o, kh, kw, 2, c)
    signs = ops.unpack_signs(w, c * kh * kw, torch.float32).reshape(o, c, kh, kw).permute(0, 2, 3, 1)
    assert torch.equal(bits[..., 0, :].float() * 2 - 1, signs)
    assert torch.equal(bits[..., 1, :], 1 - bits[..., 0, :])


def test_capability_names_what_it_declines():
    """The capability's reasons (CPU: problems only): channels_last input with C a multiple of 64, one group,
    pad -1 / +1, O % 8 == 0, stride up to 8, windows reaching at most 64 pixels."""
    from bie_backend_cutlass.binary_conv import MAX_REACH, _check
    from bie_core.ops.binary import _conv_problem

    def reason(c=128, o=64, k=(3, 3), st=(1, 1), pd=(1, 1), dl=(1, 1), g=1, pad_value=-1.0, cl=True, hw=9):
        x = torch.empty(2, c, hw, hw)
        if cl:
            x = x.contiguous(memory_format=torch.channels_last)
        w = torch.empty(o, packed_len(c // g * k[0] * k[1]), dtype=torch.uint8)
        return _check(_conv_problem(x, w, list(k), list(st), list(pd), list(dl), g, pad_value, None, None, None))

    assert reason() is None and reason(c=512, pad_value=1.0, st=(2, 2)) is None and reason(c=64) is None
    assert reason(k=(1, 5), dl=(1, MAX_REACH // 4), hw=300) is None
    for kw, words in ((dict(cl=False), "channels_last"), (dict(c=96), "C=96"), (dict(c=32), "C=32"),
                      (dict(g=2), "groups"), (dict(pad_value=0.0), "pad_value 0"), (dict(o=12), "O=12"),
                      (dict(st=(9, 1), hw=40), "stride"), (dict(k=(3, 3), dl=(1, MAX_REACH), hw=200), "reaching")):
        r = reason(**kw)
        assert r is not None and words in r, (kw, r)


def test_config_candidates_and_defaults(monkeypatch):
    """The tuner's candidates and untimed default (CPU: shapes only): the window GEMM first at C = 64, the 32-byte
    conv at C = 128, the 64-byte conv above; no window GEMM where a call's window rows would pass 2^31 bytes."""
    from bie_backend_cutlass import binary_conv as bc, tuning
    seen = []

    def choose(op, bucket, cands, device=None):
        seen.append([n for n, _ in cands])
        return cands[0][0]
    monkeypatch.setattr(tuning, "choose", choose)
    monkeypatch.setattr(bc, "_ops", lambda: None)
    args = (1, 1, 1, 1, 1, 1, False, None, None, None, torch.bfloat16)
    for n, c, hw, first in ((64, 64, 56, "w128x128k128"), (64, 128, 28, "t128x128k32"), (64, 256, 14, "t128x128"),
                            (40000, 64, 56, "t128x128k32")):
        x = torch.empty(n, c, hw, hw, device="meta")
        wp = torch.empty(64, 3, 3, c // 4, dtype=torch.int8, device="meta")
        assert bc.CONFIGS[bc._config(x, wp, args, torch.bfloat16)] == first, (n, c)
        assert sorted(seen[-1]) == sorted(bc.CONFIGS if n < 40000 else ("t128x128", "t128x128k32")), seen[-1]


@needs_kernels
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:5])) + f"k{s[5][0]}{s[5][1]}")
def test_counts_and_epilogues_exact(shape):
    from bie_backend_cutlass import binary_conv as bc
    n, c, h, w_, o, ks, st, pd, dl = shape
    gen = torch.Generator().manual_seed(hash(shape) % 2 ** 31)
    wb = _w(o, c * ks[0] * ks[1], gen)
    wp = bc.prepare_weight(wb, list(ks))
    for i, dtype in enumerate((torch.bfloat16, torch.float16, torch.float32, torch.int8)):
        x = _x(n, c, h, w_, dtype, gen)
        for pad_value in (-1.0, 1.0):
            ref = _ref(x, wb, list(ks), list(st), list(pd), list(dl), 1, pad_value, None, None, None)
            for cfg in range(len(bc.CONFIGS)):
                out = bc._ops().conv(x, wp, st[0], st[1], pd[0], pd[1], dl[0], dl[1], pad_value > 0, None, None,
                                     None, None, cfg)
                _exact(out, ref, f"counts {dtype} pad {pad_value} {bc.CONFIGS[cfg]}")
        if dtype.is_floating_point:   # the channel shift, added in x's dtype before the signs are taken
            shift = (torch.randn(c, generator=gen) * 0.5).cuda()
            shift[:4] = -x[0, :4, 0, 0].float()   # x + shift exactly 0 there: +1
            ref = _ref(x, wb, list(ks), list(st), list(pd), list(dl), 1, -1.0, None, None, None, shift)
            with bie_core.use_backend("cutlass"):
                _exact(ops.binary_conv2d(x, wb, list(ks), list(st), list(pd), list(dl), 1, -1.0, None, None, None,
                                         shift), ref, f"shift {dtype}")
        out_dtype = (torch.bfloat16, torch.float16, torch.float32, torch.bfloat16)[i]
        scale = (torch.rand(o, generator=gen) + 0.05).cuda() if i % 2 == 0 else torch.tensor([0.37]).cuda()
        bias = torch.randn(o, generator=gen).cuda() if i != 1 else None
        args = (x, wb, list(ks), list(st), list(pd), list(dl), 1, -1.0, scale, bias, out_dtype)
        ref = _ref(*args)
        with bie_core.use_backend("cutlass"):
            e = bie_core.explain(ops.binary_conv2d, *args)
            assert e.chosen()["binary_conv2d"] == "cutlass:binary_conv2d_sm90", str(e)
            _exact(ops.binary_conv2d(*args), ref, f"{dtype} -> {out_dtype}")


@needs_kernels
def test_chosen_automatically_and_declined_elsewhere():
    """Chosen over the other binary convs for a channels_last input with C a multiple of 64, pad -1 / +1, one group;
    NCHW input, pad value 0, C = 96 and two groups go to the other kernels, which return the op's format too."""
    gen = torch.Generator().manual_seed(5)
    wb = _w(64, 128 * 9, gen)
    x = _x(2, 128, 8, 8, torch.bfloat16, gen)
    base = (wb, [3, 3], [1, 1], [1, 1], [1, 1], 1)
    assert bie_core.explain(ops.binary_conv2d, x, *base, -1.0, None, None, None).chosen()["binary_conv2d"] \
        == "cutlass:binary_conv2d_sm90"
    for xx, pad_value in ((x.contiguous(), -1.0), (x, 0.0)):
        e = bie_core.explain(ops.binary_conv2d, xx, *base, pad_value, None, None, None)
        assert e.chosen()["binary_conv2d"] != "cutlass:binary_conv2d_sm90", str(e)
        out = ops.binary_conv2d(xx, *base, pad_value, None, None, None)
        ref = _ref(xx, *base, pad_value, None, None, None)
        assert torch.equal(out, ref)
        assert out.is_contiguous(memory_format=torch.channels_last) == (xx is x)
    x96 = _x(1, 96, 6, 6, torch.float32, gen)
    w96 = _w(16, 96 * 9, gen)
    e = bie_core.explain(ops.binary_conv2d, x96, w96, [3, 3], [1, 1], [1, 1], [1, 1], 1, -1.0, None, None, None)
    assert e.chosen()["binary_conv2d"] != "cutlass:binary_conv2d_sm90", str(e)
    x64 = _x(1, 64, 6, 6, torch.float32, gen)
    e = bie_core.explain(ops.binary_conv2d, x64, _w(16, 64 * 9, gen), [3, 3], [1, 1], [1, 1], [1, 1], 1, -1.0, None,
                         None, None)
    assert e.chosen()["binary_conv2d"] == "cutlass:binary_conv2d_sm90", str(e)
    wg = _w(64, 64 * 9, gen)
    e = bie_core.explain(ops.binary_conv2d, x, wg, [3, 3], [1, 1], [1, 1], [1, 1], 2, -1.0, None, None, None)
    assert e.chosen()["binary_conv2d"] != "cutlass:binary_conv2d_sm90", str(e)


@needs_kernels
def test_packed_layer_runs_it_eager_and_graphed():
    """A packed BinaryConv2d on channels_last bf16 input (ResNet-18's 256-channel layer at a small batch) runs
    this kernel through its bound call, equal to the training-path forward on bie-backend-cuda's direct conv,
    also replayed from a graph."""
    from bie_core import BinaryConv2d
    torch.manual_seed(0)
    layer = BinaryConv2d(256, 256, 3, 1, 1, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(4, 256, 14, 14, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        layer.act_shift.normal_(0, 0.3)
        with bie_core.use_backend("cuda"):   # bie-backend-cuda's direct conv: another kernel, the same bits
            full = layer(x)
    layer.pack()
    with torch.inference_mode():
        e = bie_core.explain(layer, x)
        assert e.chosen()["binary_conv2d"] == "cutlass:binary_conv2d_sm90", str(e)
        y = layer(x)
        assert torch.equal(y, full) and y.is_contiguous(memory_format=torch.channels_last)
        g = torch.cuda.CUDAGraph()
        layer(x)
        with torch.cuda.graph(g):
            yg = layer(x)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(yg, full)


@needs_kernels
def test_bad_arguments_raise():
    from bie_backend_cutlass import binary_conv as bc
    x = torch.randn(1, 64, 4, 4, device="cuda").contiguous(memory_format=torch.channels_last)
    wp = bc.prepare_weight(_w(8, 64 * 9, torch.Generator().manual_seed(1)), [3, 3])
    conv = bc._ops().conv
    with pytest.raises(RuntimeError, match="multiple of 64"):
        conv(torch.randn(1, 32, 4, 4, device="cuda"), wp, 1, 1, 1, 1, 1, 1, False, None, None, None, None, 0)
    with pytest.raises(RuntimeError, match="shift"):
        conv(x, wp, 1, 1, 1, 1, 1, 1, False, torch.ones(63, device="cuda"), None, None, None, 0)
    with pytest.raises(RuntimeError, match="stride"):
        conv(x, wp, 9, 1, 1, 1, 1, 1, False, None, None, None, None, 0)
    with pytest.raises(RuntimeError, match="unknown config"):
        conv(x, wp, 1, 1, 1, 1, 1, 1, False, None, None, None, None, 7)
    with pytest.raises(RuntimeError, match="scale"):
        conv(x, wp, 1, 1, 1, 1, 1, 1, False, None, torch.ones(3, device="cuda"), None, torch.float32, 0)
    with pytest.raises(RuntimeError, match="empty"):
        conv(torch.randn(1, 64, 1, 1, device="cuda").contiguous(memory_format=torch.channels_last), wp, 1, 1, 0, 0,
             1, 1, False, None, None, None, None, 0)


# ------------------------------------------------------------------ binary_conv2d_signs
#: the operand form's shapes: one of each geometry above (the 5x5 kernel, four K steps and the 1x2 image left out:
#: the conv kernels are binary_conv2d's, checked on them above)
SIGNS_SHAPES = [s for s in SHAPES if s[0:5] not in ((1, 64, 16, 16, 256), (2, 512, 4, 4, 512), (1, 64, 1, 2, 8))]


def _ref_signs(*args):
    from bie_core.backend_api import reference_kernel
    return reference_kernel("binary_conv2d_signs")(*args)


@needs_kernels
@pytest.mark.parametrize("shape", SIGNS_SHAPES, ids=lambda s: "x".join(map(str, s[:5])) + f"k{s[5][0]}{s[5][1]}")
def test_signs_counts_and_epilogues_exact(shape):
    """Every configuration's counts on operands of each float dtype and both pad values, the complement bytes
    free, then the float epilogues through the dispatcher; equal to the reference and to binary_conv2d
    (``binary_conv2d_signs``: the conv of an operand made elsewhere)."""
    from bie_backend_cutlass import binary_conv as bc
    n, c, h, w_, o, ks, st, pd, dl = shape
    gen = torch.Generator().manual_seed(hash(shape) % 2 ** 31)
    wb = torch.randint(0, 256, (o, packed_len(c * ks[0] * ks[1])), generator=gen, dtype=torch.uint8).cuda()
    wp = bc.prepare_weight(wb, list(ks))
    geo = (list(ks), list(st), list(dl))
    for i, dtype in enumerate((torch.bfloat16, torch.float16, torch.float32)):
        x = _x(n, c, h, w_, dtype, gen)
        shift = (torch.randn(c, generator=gen) * 0.5).to(dtype).cuda() if i != 1 else None
        for pad_value in (-1.0, 1.0):
            xs = sign_operand(x, shift, pd, pad_value)
            ref = _ref_signs(xs, wb, *geo, None, None, None)
            assert torch.equal(ref, ops.binary_conv2d(x, wb, list(ks), list(st), list(pd), list(dl), 1, pad_value,
                                                      None, None, None, shift))
            for cfg in range(len(bc.CONFIGS)):
                out = bc._ops().conv_signs(xs, wp, st[0], st[1], dl[0], dl[1], None, None, None, cfg)
                _exact(out, ref, f"counts {dtype} pad {pad_value} {bc.CONFIGS[cfg]}")
        free = torch.randint(0, 256, xs.shape, generator=gen, dtype=torch.uint8).cuda()
        _exact(bc._ops().conv_signs(free, wp, st[0], st[1], dl[0], dl[1], None, None, None, 0),
               _ref_signs(free, wb, *geo, None, None, None), "free complement bytes")
        out_dtype = (torch.bfloat16, torch.float16, torch.float32)[i]
        scale = (torch.rand(o, generator=gen) + 0.05).cuda() if i != 1 else torch.tensor([0.37]).cuda()
        bias = torch.randn(o, generator=gen).cuda() if i != 1 else None
        args = (sign_operand(x, shift, pd, -1.0), wb, *geo, scale, bias, out_dtype)
        e = bie_core.explain(ops.binary_conv2d_signs, *args)
        assert e.chosen()["binary_conv2d_signs"] == "cutlass:binary_conv2d_signs_sm90", str(e)
        _exact(ops.binary_conv2d_signs(*args), _ref_signs(*args), f"{dtype} -> {out_dtype}")
        # an operand view at an odd offset: copied to an aligned one
        buf = torch.empty(args[0].numel() + 1, dtype=torch.uint8, device="cuda")
        odd = buf[1:].view(args[0].shape)
        odd.copy_(args[0])
        _exact(ops.binary_conv2d_signs(odd, *args[1:]), _ref_signs(*args), "odd offset")


@needs_kernels
def test_signs_declined_shapes_and_the_layers_question():
    """C not a multiple of 64, O not a multiple of 8: the capability says why; the layer's question says no."""
    from bie_core import dispatch
    from bie_core.ops.binary import signs_problem
    dev = torch.device("cuda")
    assert dispatch.native_kernel_serves(signs_problem(dev, 1, 128, 3, 3, 64, (3, 3), (1, 1), (1, 1),
                                                       torch.bfloat16))
    for c, o in ((96, 64), (128, 12)):
        assert not dispatch.native_kernel_serves(signs_problem(dev, 1, c, 3, 3, o, (3, 3), (1, 1), (1, 1),
                                                               torch.bfloat16))


@needs_kernels
@pytest.mark.parametrize("c,o,stride", [(128, 128, 1), (64, 64, 1), (256, 512, 2)])
def test_compiled_layer_makes_the_operand_in_its_graph(c, o, stride):
    """A BinaryConv2d (latent and packed) compiled without grad emits sign_operand's ops and
    binary_conv2d_signs_eval; inductor's kernel of the operand and the conv give the eager layer's output bit for
    bit, compiled as is and replayed from CUDA graphs."""
    torch.manual_seed(c + o)
    layer = bie_core.BinaryConv2d(c, o, 3, stride, 1, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(8, c, 14, 14, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    layer(x)
    layer.eval()
    with torch.no_grad():
        layer.act_shift.normal_(0, 0.3)
        ref = layer(x)
    code, _ = graph_code(layer, x)
    assert "binary_conv2d_signs_eval" in code and "binary_conv2d_eval" not in code, code
    for mode in ("default", "reduce-overhead"):
        torch._dynamo.reset()
        f = torch.compile(layer, fullgraph=True, mode=mode)
        with torch.no_grad():
            for _ in range(3):
                y = f(x)
        assert torch.equal(y, ref), mode
    layer.pack()
    torch._dynamo.reset()
    with torch.no_grad():
        assert torch.equal(torch.compile(layer, fullgraph=True)(x), ref)


@needs_kernels
def test_graphs_of_two_batch_sizes_replay_in_turn():
    """A compiled two-layer binary block replayed from CUDA graphs at two batch sizes in turn (a recompile, then
    graphs of both): each call equals the eager block; the operands and bound calls of both sizes live outside
    the graphs' memory pool."""
    torch.manual_seed(3)
    block = torch.nn.Sequential(bie_core.BinaryConv2d(128, 128, 3, 1, 1), torch.nn.ReLU(),
                                bie_core.BinaryConv2d(128, 64, 3, 2, 1)).cuda().to(torch.bfloat16)
    xs = {n: torch.randn(n, 128, 14, 14, device="cuda", dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last) for n in (8, 4)}
    block(xs[8])
    block.eval()
    with torch.no_grad():
        refs = {n: block(x) for n, x in xs.items()}
    torch._dynamo.reset()
    f = torch.compile(block, fullgraph=True, mode="reduce-overhead")
    with torch.inference_mode():
        for n in (8, 4, 8, 4, 8, 4):
            torch.compiler.cudagraph_mark_step_begin()
            assert torch.equal(f(xs[n]).clone(), refs[n]), n

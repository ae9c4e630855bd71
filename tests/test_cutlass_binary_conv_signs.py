"""bie-backend-cutlass's ``binary_conv2d_signs`` (the implicit-GEMM binary conv on a padded sign operand made
elsewhere) and the compiled BinaryConv2d forward that hands it the operand made in its graph (H200 / sm_90)."""
from __future__ import annotations

import importlib.util

import pytest
import torch

import bie_core
from bie_core import ops
from bie_core.ops.binary import packed_len, sign_operand

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
    (3, 256, 7, 7, 264, (3, 3), (2, 2), (1, 1), (1, 1)),
    (2, 192, 11, 13, 64, (1, 1), (1, 1), (0, 0), (1, 1)),
    (2, 128, 12, 10, 40, (3, 3), (1, 1), (2, 2), (2, 2)),
    (1, 64, 10, 9, 16, (3, 1), (3, 2), (0, 1), (1, 1)),
    (1, 64, 3, 3, 16, (3, 3), (1, 1), (3, 3), (1, 1)),
]


def _x(n, c, h, w, dtype, gen):
    x = torch.randn((n, c, h, w), generator=gen)
    flat = x.view(-1)
    idx = torch.randperm(flat.numel(), generator=gen)[:max(3, flat.numel() // 50)]
    flat[idx[0::3]] = 0.0
    flat[idx[1::3]] = -0.0
    flat[idx[2::3]] = float("nan")
    return x.to(dtype).cuda().contiguous(memory_format=torch.channels_last)


def _ref(*args):
    from bie_core.backend_api import reference_kernel
    return reference_kernel("binary_conv2d_signs")(*args)


def _exact(out, ref, what):
    assert out.shape == ref.shape and out.dtype == ref.dtype, (what, out.shape, ref.shape, out.dtype, ref.dtype)
    assert out.is_contiguous(memory_format=torch.channels_last), (what, out.stride())
    same = (out == ref) | (out.isnan() & ref.isnan()) if out.is_floating_point() else out == ref
    assert bool(same.all()), f"{what}: {int((~same).sum())} of {out.numel()} differ"


@needs_kernels
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:5])) + f"k{s[5][0]}{s[5][1]}")
def test_counts_and_epilogues_exact(shape):
    """Every configuration's counts on operands of each float dtype and both pad values, the complement bytes
    free, then the float epilogues through the dispatcher; equal to the reference and to binary_conv2d."""
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
            ref = _ref(xs, wb, *geo, None, None, None)
            assert torch.equal(ref, ops.binary_conv2d(x, wb, list(ks), list(st), list(pd), list(dl), 1, pad_value,
                                                      None, None, None, shift))
            for cfg in range(len(bc.CONFIGS)):
                out = bc._ops().conv_signs(xs, wp, st[0], st[1], dl[0], dl[1], None, None, None, cfg)
                _exact(out, ref, f"counts {dtype} pad {pad_value} {bc.CONFIGS[cfg]}")
        free = torch.randint(0, 256, xs.shape, generator=gen, dtype=torch.uint8).cuda()
        _exact(bc._ops().conv_signs(free, wp, st[0], st[1], dl[0], dl[1], None, None, None, 0),
               _ref(free, wb, *geo, None, None, None), "free complement bytes")
        out_dtype = (torch.bfloat16, torch.float16, torch.float32)[i]
        scale = (torch.rand(o, generator=gen) + 0.05).cuda() if i != 1 else torch.tensor([0.37]).cuda()
        bias = torch.randn(o, generator=gen).cuda() if i != 1 else None
        args = (sign_operand(x, shift, pd, -1.0), wb, *geo, scale, bias, out_dtype)
        e = bie_core.explain(ops.binary_conv2d_signs, *args)
        assert e.chosen()["binary_conv2d_signs"] == "cutlass:binary_conv2d_signs_sm90", str(e)
        _exact(ops.binary_conv2d_signs(*args), _ref(*args), f"{dtype} -> {out_dtype}")
        # an operand view at an odd offset: copied to an aligned one
        buf = torch.empty(args[0].numel() + 1, dtype=torch.uint8, device="cuda")
        odd = buf[1:].view(args[0].shape)
        odd.copy_(args[0])
        _exact(ops.binary_conv2d_signs(odd, *args[1:]), _ref(*args), "odd offset")


@needs_kernels
def test_declined_shapes_go_to_the_reference_quietly_where_asked():
    """C not a multiple of 64, O not a multiple of 8: the capability says why; the layer's question says no."""
    from bie_core import dispatch
    from bie_core.ops.binary import signs_problem
    dev = torch.device("cuda")
    assert dispatch.native_kernel_serves(signs_problem(dev, 1, 128, 3, 3, 64, (3, 3), (1, 1), (1, 1),
                                                       torch.bfloat16))
    for c, o in ((96, 64), (128, 12)):
        assert not dispatch.native_kernel_serves(signs_problem(dev, 1, c, 3, 3, o, (3, 3), (1, 1), (1, 1),
                                                               torch.bfloat16))


def _graph_code(model, x):
    code = []

    def backend(gm, inputs):
        code.append(gm.code)
        return gm.forward
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend, fullgraph=True)(x)
    return "\n".join(code)


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
    code = _graph_code(layer, x)
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

"""DiodeMix (binary sign descent with hysteresis, AdamW, GaLore, hook protocol,
state_dict round trip) and GaLoreProjector."""
from __future__ import annotations

import io

import pytest
import torch

from bie_core import BinaryLinear, QLinear
from bie_core.optim import DiodeMix, GaLoreProjector


def test_adamw_path_equals_torch_adamw():
    torch.manual_seed(0)
    a = torch.nn.Linear(6, 4)
    b = torch.nn.Linear(6, 4)
    b.load_state_dict(a.state_dict())
    oa = DiodeMix(a.parameters(), lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    ob = torch.optim.AdamW(b.parameters(), lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    for _ in range(5):
        x = torch.randn(3, 6)
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            m(x).square().sum().backward()
            o.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def _flip_rule_reference(w, grads, lr, b1, b2, thr):
    """Straight re-statement of the documented rule, step by step."""
    w = w.clone()
    m = torch.zeros_like(w)
    acc = torch.zeros_like(w)
    for g in grads:
        m = b1 * m + (1 - b1) * g
        acc = b2 * acc + lr * torch.sign(m)
        s = torch.where(w >= 0, 1.0, -1.0)
        flip = s * acc > thr
        w = torch.where(flip, -w, w)
        acc = torch.where(flip, torch.zeros_like(acc), acc)
    return w


def test_binary_rule_flips_with_hysteresis_and_keeps_magnitudes():
    torch.manual_seed(1)
    layer = BinaryLinear(8, 4)
    w0 = layer.weight.detach().clone()
    opt = DiodeMix(layer.parameters(), lr=0.01, binary_betas=(0.5, 0.9), flip_threshold=0.025)
    grads = [torch.randn_like(w0) + 0.5 for _ in range(12)]   # mostly positive: push weights negative
    for g in grads:
        opt.zero_grad()
        layer.weight.grad = g.clone()
        opt.step()
    expect = _flip_rule_reference(w0, grads, 0.01, 0.5, 0.9, 0.025)
    torch.testing.assert_close(layer.weight.detach(), expect)
    assert torch.equal(layer.weight.detach().abs(), w0.abs())          # only signs change
    assert (layer.weight < 0).sum() > (w0 < 0).sum()                   # drifted towards the gradient sign


def test_binary_rule_needs_evidence_before_flipping():
    layer = BinaryLinear(4, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, -1.0, 2.0, -2.0]]))
    opt = DiodeMix(layer.parameters(), lr=0.01, binary_betas=(0.0, 1.0 - 1e-9), flip_threshold=0.035)
    g = torch.tensor([[1.0, -1.0, -1.0, 1.0]])   # entries 0 and 1 are pushed across zero
    for step in range(1, 6):
        layer.weight.grad = g.clone()
        opt.step()
        flipped = torch.sign(layer.weight.detach()) != torch.tensor([[1.0, -1.0, 2.0, -2.0]]).sign()
        # threshold 0.035 with lr 0.01: the 4th consistent step flips, not earlier
        assert flipped[0, :2].all() == (step >= 4)
        assert not flipped[0, 2:].any()


def test_binary_group_flag_and_scale_params_use_adamw():
    torch.manual_seed(2)
    layer = BinaryLinear(16, 8)
    layer(torch.randn(3, 16))
    opt = DiodeMix([{"params": [layer.weight]}, {"params": [layer.act_scale, layer.act_shift]}], lr=0.1)
    (layer(torch.randn(3, 16)) * torch.randn(3, 8)).sum().backward()
    w0, s0 = layer.weight.detach().clone(), layer.act_scale.detach().clone()
    opt.step()
    assert "flip_acc" in opt.state[layer.weight] and "exp_avg_sq" in opt.state[layer.act_scale]
    assert torch.equal(layer.weight.abs(), w0.abs()) and not torch.equal(layer.act_scale, s0)
    p = torch.nn.Parameter(torch.randn(3))
    o2 = DiodeMix([{"params": [p], "binary": True}])
    p.grad = torch.ones(3)
    o2.step()
    assert "flip_acc" in o2.state[p]


def test_hook_protocol():
    calls = []
    w = torch.nn.Parameter(torch.zeros(4, dtype=torch.float32), requires_grad=False)   # e.g. packed codes
    other = torch.nn.Parameter(torch.ones(2))

    def hook(p, state, group):
        calls.append((p is w, group["lr"]))
        state["n"] = state.get("n", 0) + 1
        state["m"] = torch.full((2,), float(state["n"]))
        with torch.no_grad():
            p.add_(1.0)

    w.bie_optimizer_hook = hook
    opt = DiodeMix([w, other], lr=0.5, galore_rank=2)
    other.grad = torch.ones(2)
    opt.step()
    opt.step()
    assert calls == [(True, 0.5), (True, 0.5)]        # called without a .grad, once per step
    assert torch.equal(w, torch.full((4,), 2.0))       # only the hook updated it
    assert opt.state[w]["n"] == 2
    sd = opt.state_dict()
    assert sd["state"][0]["n"] == 2 and torch.equal(sd["state"][0]["m"], torch.full((2,), 2.0))
    assert isinstance(DiodeMix.projector(opt.param_groups[0]), GaLoreProjector)


def _train(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


def _model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), BinaryLinear(16, 16, bias=True), QLinear(16, 16, 4, 4),
                               torch.nn.Linear(16, 4).to(torch.bfloat16).float())


@pytest.mark.parametrize("galore", [None, dict(galore_rank=3, galore_update_proj_gap=2, galore_proj_type="std")])
def test_state_dict_round_trip_continues_identically(galore):
    kw = dict(lr=1e-2, flip_threshold=5e-3, **(galore or {}))
    a = _model()
    oa = DiodeMix(a.parameters(), **kw)
    _train(a, oa, 4, seed=0)
    buf = io.BytesIO()
    torch.save({"model": a.state_dict(), "opt": oa.state_dict()}, buf)
    buf.seek(0)
    ck = torch.load(buf, weights_only=True)
    b = _model()
    b.load_state_dict(ck["model"])
    ob = DiodeMix(b.parameters(), **kw)
    ob.load_state_dict(ck["opt"])
    _train(a, oa, 4, seed=1)
    _train(b, ob, 4, seed=1)
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(va, vb), k


def _adamw_reference(p0, grads, lr, betas, eps, wd):
    """The documented AdamW rule on one parameter, step by step: float32 moments; the decay and the step computed
    in float32 and rounded once to the parameter's dtype (``grads[t]`` None: no step for it)."""
    p, m, v, t = p0.clone(), torch.zeros_like(p0, dtype=torch.float32), torch.zeros_like(p0, dtype=torch.float32), 0
    for g in grads:
        if g is None:
            continue
        t += 1
        g = g.to(torch.float32)
        m = m + (1 - betas[0]) * (g - m)
        v = betas[1] * v + (1 - betas[1]) * g * g
        upd = (m / (1 - betas[0] ** t)) / ((v / (1 - betas[1] ** t)).sqrt() + eps)
        p = (p.float() * (1 - lr * wd) - lr * upd).to(p.dtype)
    return p


def test_rules_over_mixed_dtypes_formats_and_step_counts():
    """One group of float32, bfloat16 and float16 parameters, channels_last ones among them, and parameters that skip
    steps (their bias corrections then differ): the multi-tensor update gives each parameter its own rule's result."""
    torch.manual_seed(7)
    # (a decay factor 1 - lr * wd that bf16 cannot hold: rounding it to the parameter's dtype would show)
    lr, betas, eps, wd = 3e-2, (0.8, 0.95), 1e-6, 0.1
    shapes = [((6, 4), torch.float32), ((5,), torch.bfloat16), ((3, 4, 2, 2), torch.float32), ((7,), torch.float16)]
    ps = [torch.nn.Parameter(torch.randn(s, dtype=dt)) for s, dt in shapes]
    with torch.no_grad():
        ps[2].data = ps[2].data.contiguous(memory_format=torch.channels_last)
    binary = [torch.nn.Parameter(torch.randn(4, 6)), torch.nn.Parameter(torch.randn(3, 5, dtype=torch.bfloat16))]
    for b in binary:
        b.bie_binary = True
    with torch.no_grad():
        binary[0][0, :3] = 0.0                      # zero weights: +1 until flipped, then -tiny
    start = [p.detach().clone() for p in ps + binary]
    steps = 6
    grads = [[None if (i == 0 and t % 2) else torch.randn(p.shape, dtype=p.dtype) + 0.7 for t in range(steps)]
             for i, p in enumerate(ps + binary)]
    opt = DiodeMix(ps + binary, lr=lr, betas=betas, eps=eps, weight_decay=wd, binary_betas=(0.5, 0.9),
                   flip_threshold=0.015)
    for t in range(steps):
        for p, gs in zip(ps + binary, grads):
            p.grad = None if gs[t] is None else gs[t].clone()
        opt.step()
    for i, p in enumerate(ps):
        expect = _adamw_reference(start[i], grads[i], lr, betas, eps, wd)
        assert p.dtype == shapes[i][1]
        torch.testing.assert_close(p.detach(), expect, rtol=2e-6, atol=2e-6, msg=f"parameter {i}")
        assert opt.state[p]["exp_avg"].dtype == torch.float32
    assert opt.state[ps[0]]["step"] == steps // 2
    assert ps[2].is_contiguous(memory_format=torch.channels_last)
    for j, b in enumerate(binary):
        w0 = start[len(ps) + j]
        expect = _flip_rule_reference(w0.float(), [g.float() for g in grads[len(ps) + j]], lr, 0.5, 0.9, 0.015)
        got = b.detach().float()
        zero = w0.float() == 0
        # magnitudes kept; a zero that flipped holds -tiny (the reference keeps it at zero: -0.0)
        assert torch.equal(got[~zero], expect[~zero])
        flipped0 = zero & (got != 0)
        assert torch.equal(got[flipped0], torch.full_like(got[flipped0], -torch.finfo(b.dtype).tiny))
    assert (binary[0].detach()[0, :3] < 0).any()      # a zero weight was pushed across



def test_multi_tensor_runs_bound_the_temporaries_and_change_no_bit(monkeypatch):
    """A rule's parameters are updated in runs of at most FOREACH_MAX_ELEMENTS elements (about equal, a larger
    parameter alone), so that the multi-tensor temporaries stay bounded on a large model; the result is the one-run
    update's bit for bit."""
    from bie_core.optim import diode

    def run(limit):
        monkeypatch.setattr(diode, "FOREACH_MAX_ELEMENTS", limit)
        torch.manual_seed(11)
        shapes = [(40,), (8, 9), (3, 3, 2, 2), (100,), (5,), (7, 7)]
        ps = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
        for p in ps[::2]:
            p.bie_binary = True
        opt = DiodeMix(ps, lr=1e-2, weight_decay=0.05, flip_threshold=0.01)
        for t in range(4):
            g = torch.Generator().manual_seed(t)
            for p in ps:
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()
        return [p.detach().clone() for p in ps], [dict(opt.state[p]) for p in ps], ps

    one, one_state, _ = run(1 << 40)
    for limit in (64, 50, 1):
        got, state, ps = run(limit)
        assert all(torch.equal(a, b) for a, b in zip(one, got)), limit
        for s1, s2 in zip(one_state, state):
            assert all(torch.equal(s1[k], s2[k]) if torch.is_tensor(s1[k]) else s1[k] == s2[k] for k in s1)
        runs = diode._by_device_and_dtype(ps)
        assert [p for r in runs for p in r] == ps
        assert all(len(r) == 1 or sum(p.numel() for p in r) <= limit for r in runs)
    monkeypatch.setattr(diode, "FOREACH_MAX_ELEMENTS", 100)
    sizes = [sum(p.numel() for p in r) for r in diode._by_device_and_dtype([torch.zeros(20) for _ in range(7)])]
    assert sizes == [80, 60]                         # two runs near 70 each, not filled up to 100 and 40


def test_binary_rule_one_step_and_a_nan_gradient():
    """One step of the rule, entry by entry; a NaN gradient leaves its weight as it is (its momentum is NaN, whose
    sign torch takes as 0) and touches no other entry."""
    w = torch.nn.Parameter(torch.tensor([1.0, -1.0, 0.5, 0.0, 2.0, -3.0]))
    w.bie_binary = True
    opt = DiodeMix([w], lr=0.1, binary_betas=(0.0, 0.5), flip_threshold=0.05)
    w.grad = torch.tensor([float("nan"), 1.0, -1.0, 1.0, 1.0, -1.0])
    opt.step()
    # a gradient of the weight's sign pushes it across zero: 0 (as +1), 2 and -3 flip (0 to -tiny); -1 and 0.5 stay
    tiny = torch.finfo(torch.float32).tiny
    assert torch.equal(w.detach(), torch.tensor([1.0, -1.0, 0.5, -tiny, -2.0, 3.0]))
    assert torch.equal(opt.state[w]["flip_acc"][1:], torch.tensor([0.1, -0.1, 0.0, 0.0, 0.0]))   # restarted where flipped


def test_float32_states_kept_for_bf16_params_on_load():
    p = torch.nn.Parameter(torch.randn(4, 4, dtype=torch.bfloat16))
    o = DiodeMix([p])
    p.grad = torch.randn(4, 4, dtype=torch.bfloat16)
    o.step()
    o2 = DiodeMix([p])
    o2.load_state_dict(o.state_dict())
    assert o2.state[p]["exp_avg"].dtype == torch.float32
    torch.testing.assert_close(o2.state[p]["exp_avg"], o.state[p]["exp_avg"], rtol=0, atol=0)


def test_galore_projector_math():
    torch.manual_seed(4)
    g = torch.randn(12, 5) @ torch.randn(5, 7)     # rank 5
    for proj_type, low_shape in (("std", (12, 3)), ("reverse_std", (3, 7)), ("left", (3, 7)),
                                 ("right", (12, 3)), ("full", (3, 3))):
        pj = GaLoreProjector(3, update_proj_gap=10, scale=2.0, proj_type=proj_type)
        st = {}
        low = pj.project(g, 0, st)
        assert low.shape == low_shape
        back = pj.project_back(low, st)
        u, s, vh = torch.linalg.svd(g)
        best = (u[:, :3] * s[:3]) @ vh[:3]           # the rank-3 truncation
        torch.testing.assert_close(back, 2.0 * best, rtol=1e-4, atol=1e-4)
    # full rank: project_back(project(g)) == g * scale
    pj = GaLoreProjector(7)
    torch.testing.assert_close(pj.project_back(pj.project(g, 0)), g, rtol=1e-4, atol=1e-4)
    # >2-D tensors are (shape[0], -1) matrices
    w = torch.randn(4, 2, 3, 3)
    pj = GaLoreProjector(2)
    assert pj.project_back(pj.project(w, 0), shape=w.shape).shape == w.shape
    # the subspace is recomputed every update_proj_gap steps only
    pj, st = GaLoreProjector(2, update_proj_gap=3), {}
    pj.project(g, 0, st)
    first = st["galore_right"].clone()
    pj.project(torch.randn(12, 7), 1, st)
    assert torch.equal(st["galore_right"], first)
    pj.project(torch.randn(12, 7), 3, st)
    assert not torch.equal(st["galore_right"], first)


def test_diode_mix_bad_arguments():
    p = [torch.nn.Parameter(torch.zeros(2))]
    for kw in (dict(lr=-1), dict(betas=(1.0, 0.9)), dict(binary_betas=(0.9,)), dict(galore_rank=0),
               dict(galore_proj_type="diag"), dict(flip_threshold=-1)):
        with pytest.raises(ValueError, match="DiodeMix"):
            DiodeMix(p, **kw)
    with pytest.raises(ValueError, match="rank"):
        GaLoreProjector(0)
    with pytest.raises(ValueError, match="proj_type"):
        GaLoreProjector(2, proj_type="x")


def test_diode_mix_trains_binary_model():
    torch.manual_seed(5)
    x = torch.randn(256, 16)
    y = (x @ torch.randn(16, 3)).argmax(1)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), BinaryLinear(32, 32),
                            torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 3))
    opt = DiodeMix(m.parameters(), lr=1e-2)
    for _ in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
    assert (m(x).argmax(1) == y).float().mean() > 0.9


def test_step_compiles_in_one_graph_and_matches_eager():
    """``torch.compile(opt.step)`` (what bench_e2e_cnn.py --compile-optimizer runs): one graph, no break, and the same
    flips, magnitudes and AdamW updates as the eager step over a few steps (inductor fuses the multi-tensor ops)."""
    torch.manual_seed(11)
    def make():
        torch.manual_seed(3)
        ps = [torch.nn.Parameter(torch.randn(33, 17)), torch.nn.Parameter(torch.randn(40)),
              torch.nn.Parameter(torch.randn(8, 9)), torch.nn.Parameter(torch.randn(5, 7, dtype=torch.bfloat16))]
        ps[2].bie_binary = ps[3].bie_binary = True
        return ps
    eager, comp = make(), make()
    opt_e = DiodeMix(eager, lr=2e-2, weight_decay=0.05, flip_threshold=0.03)
    opt_c = DiodeMix(comp, lr=2e-2, weight_decay=0.05, flip_threshold=0.03)
    step = torch.compile(opt_c.step, fullgraph=True)
    torch._dynamo.reset()
    flips = 0
    for _ in range(5):
        for a, b in zip(eager, comp):
            g = torch.randn(a.shape, dtype=a.dtype) + 0.3
            a.grad, b.grad = g.clone(), g.clone()
        before = eager[2].detach().sign()
        opt_e.step()
        step()
        flips += int((eager[2].detach().sign() != before).sum())
    for a, b in zip(eager[2:], comp[2:]):
        assert torch.equal(a.detach(), b.detach())           # signs and kept magnitudes, bit for bit
    for a, b in zip(eager[:2], comp[:2]):
        torch.testing.assert_close(b.detach(), a.detach(), rtol=1e-5, atol=1e-6)
    assert flips > 0
    torch._dynamo.reset()
    ps = make()
    for p in ps:
        p.grad = torch.randn(p.shape, dtype=p.dtype)
    explained = torch._dynamo.explain(DiodeMix(ps, lr=1e-2).step)()
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    assert explained.op_count > 20      # both rules' multi-tensor updates in the graph

"""Lab: QConv2d and QMatMul training steps on CUDA (bie-backend-cutlass) against the same layers on the
CPU, float32 (relative error of every gradient). Exercises their LSQ backward through lsq_backward."""
import torch

from bie_core import QConv2d, QMatMul

torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.manual_seed(0)


def compare(name, cpu, gpu, inputs):
    gpu.load_state_dict(cpu.state_dict())
    a = [t.clone().requires_grad_() for t in inputs]
    b = [t.cuda().requires_grad_() for t in inputs]
    ya, yb = cpu(*a), gpu(*b)
    g = torch.randn_like(ya)
    (ya * g).sum().backward()
    (yb * g.cuda()).sum().backward()
    grads = [(f"input{i}", t.grad, u.grad) for i, (t, u) in enumerate(zip(a, b))]
    grads += [(n, p.grad, q.grad) for (n, p), q in zip(cpu.named_parameters(), gpu.parameters()) if p.grad is not None]
    errs = {n: ((ga - gb.cpu()).norm() / ga.norm().clamp_min(1e-12)).item() for n, ga, gb in grads}
    print(name, "max |dy|", (ya - yb.cpu()).abs().max().item(), "grad rel err", errs, flush=True)
    # tensors: float32 products; scale gradients: one sum of many cancelling terms, summed in another order
    assert all(e < (1e-3 if "scale" in n or n in ("cx", "cy") else 1e-4) for n, e in errs.items()), name


compare("QConv2d 8/8 per-channel", QConv2d(16, 24, 3, padding=1, per_channel=True),
        QConv2d(16, 24, 3, padding=1, per_channel=True, backend="cutlass").cuda(), [torch.randn(4, 16, 12, 12)])
compare("QConv2d 4/4", QConv2d(16, 32, 3, padding=1, w_bits=4, a_bits=4),
        QConv2d(16, 32, 3, padding=1, w_bits=4, a_bits=4, backend="cutlass").cuda(), [torch.randn(8, 16, 20, 20)])
compare("QMatMul 8", QMatMul(8), QMatMul(8, backend="cutlass").cuda(), [torch.randn(2, 32, 64), torch.randn(2, 64, 40)])
print("ok")

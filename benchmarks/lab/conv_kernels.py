"""Per-kernel times of bie-backend-cuda's direct binary conv (packing vs the conv kernel) on ResNet-18 3x3
layers at batch 64, from torch.profiler (lab tool; the product figures come from bench_cuda_conv.py)."""
import torch
from torch.profiler import ProfilerActivity, profile

from bie_backend_cuda import binary as cb

for (c, hw, st, cl) in [(c, hw, 1, cl) for cl in (False, True) for (c, hw) in [(64, 56), (128, 28), (256, 14), (512, 7)]]:
    wb = torch.randint(0, 256, (c, c * 9 // 8), dtype=torch.uint8, device="cuda")
    p = cb.prepare_conv(wb)
    xs = [torch.randn(64, c, hw, hw, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    if cl:
        xs = [x.contiguous(memory_format=torch.channels_last) for x in xs]
    scale = torch.rand(c, device="cuda")
    args = ([3, 3], [st, st], [1, 1], [1, 1], 1, -1.0, scale, None, torch.bfloat16)
    for x in xs:
        cb.binary_conv2d(x, wb, *args, prepared=p)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(40):
            cb.binary_conv2d(xs[i % 4], wb, *args, prepared=p)
        torch.cuda.synchronize()
    tot = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = "pack" if "pack" in e.name else ("conv" if "mma" in e.name else e.name[:40])
            tot.setdefault(name, []).append(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
    print(f"C={c} H={hw} {'channels_last' if cl else 'NCHW'}: " + ", ".join(f"{k} {sum(v) / len(v):.1f} us (x{len(v)})" for k, v in tot.items()), flush=True)

"""Runs bie-backend-cuda's direct binary conv a few times on one ResNet-18 3x3 shape at batch 64 (for Nsight
Compute): python conv_one.py C HW [stride] [cl]"""
import sys

import torch

from bie_backend_cuda import binary as cb

c, hw = int(sys.argv[1]), int(sys.argv[2])
st = int(sys.argv[3]) if len(sys.argv) > 3 else 1
x = torch.randn(64, c, hw, hw, device="cuda", dtype=torch.bfloat16)
if len(sys.argv) > 4:
    x = x.contiguous(memory_format=torch.channels_last)
wb = torch.randint(0, 256, (c, c * 9 // 8), dtype=torch.uint8, device="cuda")
p = cb.prepare_conv(wb)
scale = torch.rand(c, device="cuda")
for _ in range(4):
    cb.binary_conv2d(x, wb, [3, 3], [st, st], [1, 1], [1, 1], 1, -1.0, scale, None, torch.bfloat16, prepared=p)
torch.cuda.synchronize()

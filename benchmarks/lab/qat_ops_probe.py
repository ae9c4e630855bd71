"""Lab: the QLinear step's element-wise kernels alone, for Nsight Compute (M=8192, 4096 -> 4096, bf16)."""
import torch

import bie_core  # noqa: F401
from bie_core import ops

x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
g = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
ba = torch.randn(4096, device="cuda", dtype=torch.bfloat16) * 0.1
sa = torch.tensor(0.05, device="cuda")
sw = torch.tensor(0.5, device="cuda")
with torch.no_grad():
    for _ in range(3):
        ops.quantize_int(x, sa, 8, ba)
        ops.lsq_backward(x, sa, g, 8, ba, sw, False, torch.bfloat16)
        y = x.clone()          # a plain copy of the same bytes, for comparison
    torch.cuda.synchronize()

"""Bad input to the bie_cuda native ops must raise a Python error, never end the process (run on a GPU machine,
one check per process: python probe_native_errors.py N)."""
import sys

import torch

from bie_backend_cuda import _build

ops = _build.ops()
case = int(sys.argv[1]) if len(sys.argv) > 1 else 0
try:
    if case == 0:      # a 1-D x: the first TORCH_CHECK of pack_signs
        ops.pack_signs(torch.randn(3, device="cuda"))
    elif case == 1:    # a prepared qweight of the wrong size
        x = torch.randn(2, 100, device="cuda", dtype=torch.bfloat16)
        ops.wqv_gemm(x, torch.zeros(5, dtype=torch.int32, device="cuda"), torch.zeros(1, 128, dtype=torch.int32,
                     device="cuda"), None, 4, 100, 100, 7, 2, True, False, True, torch.bfloat16,
                     torch.zeros(8, dtype=torch.int32, device="cuda"), 0, False)
    print(f"case {case}: no error raised")
except RuntimeError as e:
    print(f"case {case}: clear error:", str(e).splitlines()[0][:160])

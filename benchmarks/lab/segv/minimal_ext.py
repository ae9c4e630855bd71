"""Lab: does a minimal TORCH_LIBRARY op that fails a TORCH_CHECK raise or crash? argv: variant."""
import sys, os, torch
from torch.utils.cpp_extension import load_inline, load
v = sys.argv[1]
ldflags = sys.argv[2:]
src = r'''
#include <torch/library.h>
#include <ATen/ATen.h>
at::Tensor bad(const at::Tensor& x) { TORCH_CHECK(x.dim() == 2, "minimal: x must be 2-D, got ", x.sizes()); return x; }
TORCH_LIBRARY(NAME, m) { m.def("bad", &bad); }
'''
name = f"bie_segv_{v}"
d = f"/tmp/segv_build_{v}"; os.makedirs(d, exist_ok=True)
open(f"{d}/op.cpp", "w").write(src.replace("NAME", name))
srcs = [f"{d}/op.cpp"]
cflags = []
cuda = []
if v.startswith("flags") or v == "cu":
    cflags = ["-O3", "-std=c++17"]
if v == "cu":
    open(f"{d}/k.cu", "w").write("__global__ void k(int* p){ if(p) *p = 1; }\nvoid launch(int* p){ k<<<1,1>>>(p); }\n")
    srcs.append(f"{d}/k.cu")
    cuda = ["-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a"]
load(name=name, sources=srcs, extra_cflags=cflags, extra_cuda_cflags=cuda, build_directory=d, extra_ldflags=ldflags,
     is_python_module=False, verbose=bool(os.environ.get("VERBOSE")))
op = getattr(torch.ops, name).bad
try:
    op(torch.randn(3, device="cuda"))
    print(v, "no error")
except RuntimeError as e:
    print(v, "clear error:", str(e).splitlines()[0])

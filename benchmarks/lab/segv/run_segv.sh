#!/bin/bash
# Device call (lab): why a failed TORCH_CHECK in bie_cuda ops crashes the process on the H100 machine.
cd "$(dirname "$0")/../../.."
set -x
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | tail -2
g++ --version | head -1; which gdb; python3 -c "import torch,sys; print(torch.__version__, torch._C._GLIBCXX_USE_CXX11_ABI, sys.version)"
python3 -c "import torch.utils.cpp_extension as c; print(c.CUDA_HOME)"
gcc -shared -fPIC -O1 -o /tmp/segv_bt.so benchmarks/lab/segv/segv_bt.c
for v in plain flags cu; do LD_PRELOAD=/tmp/segv_bt.so timeout 300 python3 benchmarks/lab/segv/minimal_ext.py $v 2>&1 | tail -25; echo "rc=$?"; done
export BIE_CUDA_CACHE=/tmp/bie_cuda_cache
python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tail -2
for c in 0 1; do LD_PRELOAD=/tmp/segv_bt.so python3 benchmarks/lab/probe_native_errors.py $c 2>&1 | c++filt | tail -40; done
nm -D --defined-only $(ls /tmp/bie_cuda_cache/*/*.so) | c++filt | grep -i "c10::Error\|typeinfo" | head
ldd $(ls /tmp/bie_cuda_cache/*/*.so) | head -20

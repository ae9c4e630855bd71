#!/bin/bash
cd "$(dirname "$0")/../../.."
VERBOSE=1 python3 benchmarks/lab/segv/minimal_ext.py plain 2>&1 | grep -E "^\[|c\+\+ |error" | cut -c1-600
so=/tmp/segv_build_plain/bie_segv_plain.so
echo "--- exported std:: text symbols in the minimal .so:"; nm -DC --defined-only $so | grep -c " std::"
nm -DC --defined-only $so | grep -E "_M_insert|codecvt|num_put" | head
echo "--- ldd"; ldd $so
python3 - <<'PY'
import torch, os
print("torch lib dir", os.path.dirname(torch.__file__))
for l in open("/proc/self/maps"):
    if "stdc++" in l or "gcc_s" in l: print(l.split()[-1])
PY
ls /opt/torch/.venv/lib/python3.12/site-packages/torch/lib | head -40
for f in libc10.so libtorch_cpu.so; do echo "$f exports _M_insert<long>:"; nm -DC --defined-only /opt/torch/.venv/lib/python3.12/site-packages/torch/lib/$f | grep -c "_M_insert<long>"; done
strings -a $so | grep -i "GCC: " | sort | uniq -c | head

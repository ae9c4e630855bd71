#!/bin/bash
cd "$(dirname "$0")/../../.."
echo "CXX=$CXX CC=$CC PATH=$PATH"; which c++ g++ gcc; /opt/gcc/bin/g++ --version | head -1
/opt/gcc/bin/g++ -print-file-name=libstdc++.so; /opt/gcc/bin/g++ -print-file-name=libstdc++.a; ls /opt/gcc/lib64 2>/dev/null | head; /opt/gcc/bin/g++ -dumpspecs | grep -n -i "static-libstdc\|static-libgcc" | head
python3 -c "import torch.utils.cpp_extension as c, inspect; src=inspect.getsource(c); import re; print([l for l in src.splitlines() if 'static' in l.lower() and 'lib' in l.lower()][:10])"
run() { v=$1; shift; LD_PRELOAD=/tmp/segv_bt.so timeout 200 python3 benchmarks/lab/segv/minimal_ext.py $v "$@" 2>&1 | grep -E "clear error|no error|signal" ; echo "$v rc=${PIPESTATUS[0]}"; }
gcc -shared -fPIC -O1 -o /tmp/segv_bt.so benchmarks/lab/segv/segv_bt.c
run flagsB -Wl,-Bsymbolic
run flagsX -Wl,--exclude-libs,ALL
run flagsBX -Wl,-Bsymbolic -Wl,--exclude-libs,ALL
CXX=/usr/bin/g++ run flagsSYS

#!/bin/bash
# One device call for bie-backend-cutlass's binary kernels: build (stops early on compiler errors),
# SASS check, tests + conformance kit (binary ops), benchmarks. Needs `carry: [".whl"]`.
# Usage (GPU machine, repo root): bash benchmarks/cutlass_binary_run.sh [all|tests|bench]
set -o pipefail
source benchmarks/cutlass_setup.sh
MODE=${1:-all}
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,ecc.mode.current,driver_version --format=csv
  date -u; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  nvcc --version | tail -2; } > $OUT/env.txt 2>&1
cat $OUT/env.txt
/usr/bin/time -f "build wall %e s" python3 -c "
from bie_backend_cutlass import _build, binary
print(_build.load(binary.EXTENSION, verbose=True))" > $OUT/build.log 2>&1
rc=$?
grep -E "error|Error|FAILED|build wall|warning: .*spill|bytes stack frame" $OUT/build.log | grep -v "^\s*$" | head -60
if [ $rc -ne 0 ]; then echo "BUILD FAILED rc=$rc"; tail -30 $OUT/build.log; exit 1; fi
SO=$(python3 -c "from bie_backend_cutlass import _build, binary; print(_build.lib_path(binary.EXTENSION))")
cuobjdump -sass $SO > /tmp/bin.sass 2>&1
python3 - <<'PY' | tee -a $OUT/env.txt
import re, collections
fn = None; st = collections.defaultdict(collections.Counter)
for line in open("/tmp/bin.sass"):
    m = re.search(r"Function : (\S+)", line)
    if m: fn = m.group(1); continue
    if fn is None: continue
    for op in ("BMMA.168256.AND.POPC", "XOR.POPC", "CALL", "LDSM", "LDGSTS", "LDL", "STL"):
        if op in line: st[fn][op] += 1
g = {f: c for f, c in st.items() if c["BMMA.168256.AND.POPC"] or c["XOR.POPC"]}
for f, c in g.items(): print(f[:90], dict(c))
bad = [f for f, c in g.items() if c["CALL"] or c["XOR.POPC"] or c["LDL"] or c["STL"]]
print(f"SASS check: {len(g)} 1-bit GEMM kernels;", "FAIL " + str(bad) if bad or not g else
      "OK (native BMMA.168256.AND.POPC, no CALL, no XOR.POPC, no local memory)")
PY
if [ "$MODE" != "bench" ]; then
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider --tb=short -rf -x tests/test_cutlass_binary.py \
      2>&1 | tee $OUT/tests.log | tail -25
  timeout ${KIT_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider --tb=short -rf --bie-backend=cutlass \
      -k "binary" tests/test_core_dispatch.py 2>&1 | tee $OUT/kit.log | grep -E "FAILED|Error|passed|failed|binary" | head -40
fi
if [ "$MODE" != "tests" ]; then
  BIE_COMMIT=${BIE_COMMIT:-unknown} timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/bench_cutlass_binary.py \
      ${BENCH_ARGS:-} --json $OUT/bench.json 2>&1 | tee $OUT/bench.log | tail -30
fi

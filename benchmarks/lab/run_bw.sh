#!/bin/bash
# Device call (lab): build, the wgmma binary GEMM tests (+ the native bad-input test), then bw_quick.py.
cd "$(dirname "$0")/../.."
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -2
export BIE_CUDA_CACHE=/tmp/bie_cuda_cache
python3 -c "from bie_backend_cuda import _build; print(_build.load())" 2>&1 | tail -3
timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -x tests/test_cuda_backend.py -k "${TESTS:-wgmma or native_bad or test_binary_gemm}" 2>&1 | tail -${TEST_TAIL:-15}
[ -n "$NOBENCH" ] || timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/lab/bw_quick.py 2>&1 | tail -20

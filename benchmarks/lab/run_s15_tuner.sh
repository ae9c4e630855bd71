#!/bin/bash
# Session 15: the binary family built, then benchmarks/lab/tuner_regime.py (carry .whl)
set -o pipefail
source benchmarks/cutlass_setup.sh
python3 -m pip uninstall -y -q bie-backend-cuda 2>&1 | tail -1
MAX_JOBS=16 python3 -c "from bie_backend_cutlass import _build, binary as f; print(_build.load(f.EXTENSION))" > $OUT/build_binary.log 2>&1 \
  || { tail -30 $OUT/build_binary.log; exit 1; }
python3 benchmarks/lab/tuner_regime.py 2>&1 | tee $OUT/tuner_regime.txt

#!/bin/bash
# One device call (kind nvidia-h200-x2) for DDP/FSDP2 over NCCL with bie weight-only layers:
# builds the CUDA backend once, then runs benchmarks/bench_distributed.py on 2 GPUs.
# Results page and raw figures under $OUT.     bash benchmarks/distributed_run.sh
set -o pipefail
export PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export BIE_CUDA_CACHE=${BIE_CUDA_CACHE:-/tmp/bie_cuda_cache} MAX_JOBS=${MAX_JOBS:-16}
# the distributions need setuptools >= 77: a machine without network installs it from .whl/
ls .whl/setuptools-*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps .whl/setuptools-*.whl
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda 2>&1 | grep -v WARNING | tail -3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/env.txt
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())" | tee -a $OUT/env.txt
python3 -c "from bie_backend_cuda import _build; print('cuda backend ready:', _build.load())" > $OUT/build_cuda.log 2>&1; tail -2 $OUT/build_cuda.log
python3 -m bie_core backends | tee -a $OUT/env.txt
python3 benchmarks/bench_distributed.py --world 2 --device cuda --out $OUT/distributed_h200.md 2>&1 | tee $OUT/bench.log

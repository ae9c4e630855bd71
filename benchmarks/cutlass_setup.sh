# Sourced at the start of every device call that uses bie-backend-cutlass:
#   source benchmarks/cutlass_setup.sh     (the call must carry .whl, holding the nvidia-cutlass wheel)
# The GPU machine has no network, so the nvidia-cutlass wheel travels in .whl/
# (fetch it once here: python3 -m pip download --no-deps nvidia-cutlass==4.2.0.0 -d .whl).
export PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/nvidia_cutlass-*.whl \
  && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install --no-build-isolation --no-deps -q -e . -e backends/cpu -e backend_cuda -e backend_cutlass 2>&1 | grep -v WARNING | tail -3
export BIE_CUTLASS_CACHE=${BIE_CUTLASS_CACHE:-/tmp/bie_cutlass_cache}
export BIE_CUDA_CACHE=${BIE_CUDA_CACHE:-/tmp/bie_cuda_cache}
export MAX_JOBS=${MAX_JOBS:-16}

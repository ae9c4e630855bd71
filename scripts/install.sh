#!/usr/bin/env bash
# Sets up everything bie needs on a fresh machine (CPU; no GPU required):
# torch (the local CPU build 2.13.0 where available), the test and demo
# dependencies, and every bie distribution of this repository, editable.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP="$PY -m pip install --disable-pip-version-check -q"

# torch first and pinned: an unpinned torch would pull several GB of CUDA wheels
$PY -c "import torch" 2>/dev/null || $PIP "torch==2.13.0"
$PIP "pluggy>=1.3" "pytest>=7" "setuptools>=77" wheel safetensors tqdm matplotlib scikit-learn numpy ninja
# MLX's CPU build runs on Linux, so the MLX backend is tested here too
$PIP "mlx[cpu]" || echo "install.sh: mlx[cpu] not available on this platform; bie-backend-mlx will report itself unavailable"
if [ -f requirements-test.txt ]; then $PIP -r requirements-test.txt; fi

# the repository's own distributions (setuptools, offline: --no-build-isolation)
pkgs=(-e .)
for d in backends/cpu backend_cuda backend_cutlass backend_mlx; do
  if [ -f "$d/pyproject.toml" ]; then pkgs+=(-e "$d"); fi
done
$PIP --no-build-isolation --no-deps "${pkgs[@]}"
# build the native CPU kernels once, up front (a failure shows here, and the
# backend then serves the plain-PyTorch kernels)
$PY -m bie_core build cpu || echo "install.sh: native CPU kernels not built; the reference kernels serve"
$PY -m bie_core backends

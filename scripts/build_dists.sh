#!/usr/bin/env bash
# Builds the sdist and the wheel of each of the five distributions (bie-core,
# bie-backend-cpu, -cuda, -cutlass, -mlx) into OUTDIR (default: dist/), offline:
# with the setuptools already installed (no build isolation, no download).
#
#   bash scripts/build_dists.sh [OUTDIR]
#
# Each project is copied to a temporary directory first (so the checkout gets
# no build/ or *.egg-info), its sdist is built, and the wheel is built from
# the unpacked sdist: a file missing from the sdist makes the wheel incomplete
# and the wheel test (tests/test_wheels.py) fail. With the `build` package
# installed this is `python -m build --no-isolation`; without it the same two
# PEP 517 hooks are called directly.
set -euo pipefail
cd "$(dirname "$0")/.."
OUTDIR=$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)
PY=${PYTHON:-python3}
"$PY" - "$OUTDIR" <<'PYEOF'
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

out = Path(sys.argv[1])
# project directory -> what its sdist is built from (None: the whole directory)
PROJECTS = {
    ".": ["pyproject.toml", "README.md", "LICENSE", "bie_core"],
    "backends/cpu": None,
    "backend_cuda": None,
    "backend_cutlass": None,
    "backend_mlx": None,
}
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist", "*.so", ".pytest_cache")
have_build = subprocess.run([sys.executable, "-m", "build", "--version"], capture_output=True).returncode == 0


def hook(name: str, where: Path) -> str:
    """Call setuptools' PEP 517 hook ``name`` in ``where``; return the file name it wrote."""
    code = f"import sys; from setuptools import build_meta as b; print(b.{name}(sys.argv[1]))"
    r = subprocess.run([sys.executable, "-c", code, str(out)], cwd=where, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"build_dists: {name} failed in {where}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout.strip().splitlines()[-1]


for proj, parts in PROJECTS.items():
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        if parts is None:
            shutil.copytree(proj, src, ignore=SKIP)
        else:
            src.mkdir()
            for p in parts:
                (shutil.copytree(Path(proj) / p, src / p, ignore=SKIP) if (Path(proj) / p).is_dir()
                 else shutil.copy2(Path(proj) / p, src / p))
        if have_build:
            subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
                           check=True, stdout=subprocess.DEVNULL)
            continue
        sdist = hook("build_sdist", src)
        with tarfile.open(out / sdist) as tf:
            tf.extractall(Path(tmp) / "unpacked", filter="data")
        (root,) = (Path(tmp) / "unpacked").iterdir()
        hook("build_wheel", root)

for f in sorted(out.iterdir()):
    print(f"{f.stat().st_size:>9}  {f}")
PYEOF

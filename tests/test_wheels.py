"""The distributions as a user gets them: ``scripts/build_dists.sh`` builds the
five sdists and wheels, the wheels go into a fresh virtual environment, and
from a directory outside the repository ``bie backends`` and a subset of the
cpu conformance kit run against the installed copies.

The environment is created with ``--system-site-packages`` so it reuses the
machine's torch (and pytest, numpy, ...); the bie packages themselves come
from the wheels (``--no-deps --no-index``), which the test checks through
``__file__``. The kit subset (``KIT_SUBSET``, about 260 of its 1600 items) is the backend
check, the native binary, integer and weight-only kernels (the C++ sources
ship in the wheel and are compiled from there) and the reference weight-only
GEMM; the full kit is what ``scripts/test.sh`` runs from the checkout.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DISTS = ["bie_core", "bie_backend_cpu", "bie_backend_cuda", "bie_backend_cutlass", "bie_backend_mlx"]
KIT_SUBSET = ("backend_is_loaded or native.binary_gemm or native.int_gemm or native.wq_dequantize "
              "or native.mbwq_dequantize or reference.wq_gemm")

pytestmark = [pytest.mark.wheels,
              pytest.mark.skipif(shutil.which("bash") is None, reason="scripts/build_dists.sh needs bash")]


def _run(cmd, cwd, env, timeout=300):
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd} exited {r.returncode}:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("dists")
    _run(["bash", ROOT / "scripts" / "build_dists.sh", out], ROOT, os.environ)
    return out


def test_every_distribution_has_an_sdist_and_a_wheel_with_its_metadata(built):
    for name in DISTS:
        (whl,) = built.glob(f"{name}-*.whl")
        (sdist,) = built.glob(f"{name}-*.tar.gz")
        with zipfile.ZipFile(whl) as z:
            meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
            assert any(n.endswith(".dist-info/licenses/LICENSE") for n in z.namelist()), name
        assert "License-Expression: Apache-2.0" in meta, name
        assert "Project-URL: Homepage, https://github.com/bie-project/bie" in meta, name
        assert "Description-Content-Type: text/markdown" in meta, name
        body = meta.split("\n\n", 1)[1]
        assert body.lstrip().startswith("# bie"), f"{name}: long description is not its README"
        with tarfile.open(sdist) as tf:
            names = tf.getnames()
        assert not [n for n in names if "/tests/" in n or Path(n).name.startswith("test_")], name
    deps = {}
    for name in DISTS:
        (whl,) = built.glob(f"{name}-*.whl")
        with zipfile.ZipFile(whl) as z:
            meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        deps[name] = [ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    assert "safetensors>=0.4" in deps["bie_core"]
    assert any(d.startswith("transformers") and 'extra == "transformers"' in d for d in deps["bie_core"])
    assert any(d.startswith("peft") and 'extra == "hf"' in d for d in deps["bie_core"])
    assert "ninja" in deps["bie_backend_cpu"]
    assert "numpy" in deps["bie_backend_mlx"]
    for accel in ("bie_backend_cuda", "bie_backend_cutlass", "bie_backend_mlx"):   # the reference comes along
        assert any(d.startswith("bie-backend-cpu") for d in deps[accel]), accel


def test_license_copies_are_identical():
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License")
    for d in ("backends/cpu", "backend_cuda", "backend_cutlass", "backend_mlx"):
        assert (ROOT / d / "LICENSE").read_text() == text, d


def test_wheels_in_a_fresh_venv_pass_the_kit_outside_the_repository(built, tmp_path):
    venv = tmp_path / "venv"
    # no pip inside (faster, and no ensurepip needed): this interpreter's pip installs into it
    _run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", venv], tmp_path, os.environ)
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    py = bindir / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--disable-pip-version-check", "-q",
          "--no-index", "--no-deps", *sorted(built.glob("*.whl"))], tmp_path, env)
    away = tmp_path / "elsewhere"
    away.mkdir()
    where = _run([py, "-c", "import bie_core, bie_backend_cpu, bie_backend_mlx; "
                  "print(bie_core.__file__); print(bie_backend_cpu.__file__); print(bie_backend_mlx.__file__)"],
                 away, env).split()
    for f in where:
        assert Path(f).resolve().is_relative_to(venv.resolve()), f"{f} is not the wheel's copy"
    out = _run([bindir / "bie", "backends"], away, env)
    row = next(ln for ln in out.splitlines() if ln.startswith("cpu "))
    assert "LOADED" in row and "bie-backend-cpu 0.1.0" in row, out
    kit = _run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "bie_core.testing",
                "--bie-backend=cpu", "-k", KIT_SUBSET], away, env, timeout=600)
    import re
    passed = int(re.search(r"(\d+) passed", kit).group(1))
    assert passed >= 200 and "failed" not in kit, kit[-3000:]
    for op in ("binary_gemm", "int_gemm", "wq_dequantize", "mbwq_dequantize", "wq_gemm"):   # the coverage matrix
        assert re.search(rf"^{op}\s+\d+/\d+", kit, re.M), f"{op} did not run:\n{kit[-3000:]}"

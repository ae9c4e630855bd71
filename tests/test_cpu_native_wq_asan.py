"""Memory safety of the native weight-only kernels under AddressSanitizer (opt-in: up to a
few minutes of compiling on 2 cores: the unrolled decoders are slow to build with ASan).

    BIE_NATIVE_ASAN=1 pytest tests/test_cpu_native_wq_asan.py

Builds ``csrc/wq_entry.cpp`` and the ``wq_*`` ISA variants with
``-fsanitize=address,undefined`` together with ``tests/native_asan/wq_harness.cpp``
(exact-size buffers, odd N, M = 0, an empty group, every width, both formats;
dequantization checked against a scalar decode; bad argument blocks refused).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "backends" / "cpu" / "bie_backend_cpu" / "native" / "csrc"
SOURCES = [CSRC / f for f in ("wq_entry.cpp", "wq_portable.cpp", "wq_avx2.cpp", "wq_avx512.cpp",
                                   "wq_avx512bf16.cpp")]

pytestmark = pytest.mark.skipif(os.environ.get("BIE_NATIVE_ASAN", "") in ("", "0"),
                                reason="opt-in: set BIE_NATIVE_ASAN=1")


def test_wq_kernels_under_asan(tmp_path):
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        pytest.skip(f"no compiler {cxx}")
    exe = tmp_path / "wq_harness"
    cmd = [cxx, "-O1", "-g", "-std=c++20", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
           "-fno-omit-frame-pointer", "-ffp-contract=off", f"-I{CSRC}",
           str(ROOT / "tests" / "native_asan" / "wq_harness.cpp"), *map(str, SOURCES), "-o", str(exe)]
    subprocess.run(cmd, check=True, timeout=600)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0", UBSAN_OPTIONS="halt_on_error=1")
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0 and "all variants passed" in r.stdout, r.stdout + r.stderr
    assert "runtime error" not in r.stderr, r.stderr

"""Memory safety of the native CPU kernels under AddressSanitizer (opt-in: about a minute
of compiling on 2 cores).

    BIE_NATIVE_ASAN=1 pytest tests/test_cpu_native_asan.py

Builds every ISA variant of ``bie_backend_cpu/native/csrc`` with
``-fsanitize=address,undefined`` together with ``tests/native_asan/harness.cpp``,
which calls each variant's range functions on random shapes with every buffer
allocated to its exact size and checks the results against naive scalar code.
Variants this CPU cannot run are skipped by the harness.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "backends" / "cpu" / "bie_backend_cpu" / "native" / "csrc"
VARIANTS = ("isa_portable", "isa_avx2", "isa_avx512", "isa_avx512icl")

pytestmark = pytest.mark.skipif(os.environ.get("BIE_NATIVE_ASAN", "") in ("", "0"),
                                reason="opt-in: set BIE_NATIVE_ASAN=1")


def test_native_kernels_under_asan(tmp_path):
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        pytest.skip(f"no compiler {cxx}")
    flags = ["-O1", "-g", "-std=c++17", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
             "-ffp-contract=off", f"-I{CSRC}"]
    procs, objs = [], []
    for name in VARIANTS + ("harness",):
        src = (ROOT / "tests" / "native_asan" / "harness.cpp") if name == "harness" else CSRC / f"{name}.cpp"
        obj = tmp_path / f"{name}.o"
        objs.append(str(obj))
        procs.append(subprocess.Popen([cxx, *flags, "-c", str(src), "-o", str(obj)], stderr=subprocess.PIPE,
                                      text=True))
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    exe = tmp_path / "harness"
    subprocess.run([cxx, "-fsanitize=address,undefined", *objs, "-o", str(exe)], check=True, timeout=300)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0", UBSAN_OPTIONS="halt_on_error=1")
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0 and "all ISA variants passed" in r.stdout, r.stdout + r.stderr
    assert "runtime error" not in r.stderr, r.stderr

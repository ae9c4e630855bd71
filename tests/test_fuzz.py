"""Seeded fuzzing of every bie op and layer (tests/_fuzz.py): careless and
hostile calls through automatic selection, the native CPU kernels, the
plain-PyTorch reference and MLX, each mode in worker processes so that a crash
is a reported case, not the end of the run.

Done means: no crash, no output that disagrees with the reference, no error
that fails to name the op or layer (and the argument) it is about.

``BIE_FUZZ_CASES`` (default 1500 per mode) and ``BIE_FUZZ_SEED`` choose the
run; the long runs recorded in benchmarks/results/fuzz.md used 20000 and 150000 cases per mode.
"""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import _fuzz  # noqa: E402

import bie_core  # noqa: E402

SEED = int(os.environ.get("BIE_FUZZ_SEED", "20261128"))
CASES = int(os.environ.get("BIE_FUZZ_CASES", "1500"))
LOADED = {r.name for r in bie_core.backends() if r.status == "loaded"}


@pytest.mark.parametrize("mode", _fuzz.MODES)
def test_fuzz(mode):
    if mode == "mlx" and "mlx" not in LOADED:
        pytest.skip("bie-backend-mlx is not loaded here")
    records = _fuzz.drive(mode, SEED, 0, CASES)
    counts = _fuzz.summary(records)
    print(f"fuzz {mode} seed={SEED} cases={CASES}: {counts}")
    bad = [r for r in records if r["status"] not in ("ok", "clear")]
    assert len(records) == CASES
    assert not bad, f"{len(bad)} bad cases ({counts}); replay one with: python tests/_fuzz.py --mode {mode} " \
                    f"--seed {SEED} --start I --count 1 -v\n" + "\n".join(str(r) for r in bad[:20])
    # the run exercises both sides: calls that compute (compared with the reference) and refusals
    assert counts.get("ok", 0) > CASES // 10 and counts.get("clear", 0) > CASES // 10


def test_fuzz_reports_a_crash_and_continues(monkeypatch):
    monkeypatch.setenv("BIE_FUZZ_SELFTEST_CRASH", "3")
    records = _fuzz.drive("reference", SEED, 0, 6)
    assert [r["i"] for r in records] == list(range(6))
    assert records[3]["status"] == "crash" and "-6" in records[3]["detail"]
    assert all(r["status"] in ("ok", "clear") for i, r in enumerate(records) if i != 3)


def test_fuzz_restarts_a_slow_worker_and_reports_a_hang(monkeypatch, tmp_path):
    """A worker past the timeout is restarted at the case it was running: a case that then finishes is a case
    like any other (a slow, shared machine); one that runs past the timeout again is a crash (a hang)."""
    monkeypatch.setenv("BIE_FUZZ_SELFTEST_STALL", f"2:{tmp_path / 'stalled-once'}")
    records = _fuzz.drive("reference", SEED, 0, 4, timeout=15)
    assert [r["status"] in ("ok", "clear") for r in records] == [True] * 4, records
    monkeypatch.setenv("BIE_FUZZ_SELFTEST_STALL", "2:")
    records = _fuzz.drive("reference", SEED, 0, 4, timeout=15)
    assert [r["i"] for r in records] == list(range(4))
    assert records[2]["status"] == "crash" and "timeout" in records[2]["detail"]
    assert all(r["status"] in ("ok", "clear") for i, r in enumerate(records) if i != 2)


def test_clear_means_naming_op_and_argument():
    ok = ValueError("bie::binary_gemm: k must be positive, got 0")
    assert _fuzz.classify_error(ok, "binary_gemm", [("k", "int")])[0] == "clear"
    assert _fuzz.classify_error(ValueError("k must be positive"), "binary_gemm", [("k", "int")])[0] == "unclear"
    assert _fuzz.classify_error(ZeroDivisionError("bie::binary_gemm: x"), "binary_gemm", [])[0] == "unclear"

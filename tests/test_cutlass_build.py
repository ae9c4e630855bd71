"""bie-backend-cutlass packaging, header discovery and the tuning cache.

These run on any machine (no GPU, no nvcc): the backend must show as
unavailable with a reason, importing it must compile nothing, the CUTLASS
headers are found from the nvidia-cutlass wheel or BIE_CUTLASS_INCLUDE with a
clear error otherwise, and the tuning step picks the fastest candidate once,
caches it on disk per GPU, skips failing candidates and stays off where it
must. The kernels themselves are tested in test_cutlass_binary.py and
test_cutlass_integer.py (GPU only).
"""
from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bie_backend_cutlass") is None,
                                reason="bie-backend-cutlass is not installed")


def test_descriptor_is_light_and_honest():
    before = set(sys.modules)
    from bie_backend_cutlass import descriptor
    d = descriptor.backend
    assert d.name == "cutlass" and tuple(d.device_types) == ("cuda",)
    # the descriptor imports no kernel module
    assert not any(m.startswith("bie_backend_cutlass.plugin") for m in set(sys.modules) - before)
    if not torch.cuda.is_available():
        assert d.probe() == "no CUDA device"


def test_listed_without_breaking_core():
    import bie_core
    recs = {r.name: r for r in bie_core.backends()}
    assert "cutlass" in recs
    if not torch.cuda.is_available():
        assert recs["cutlass"].status == "unavailable" and recs["cutlass"].cause == "no CUDA device"


def test_explicit_choice_names_the_reason():
    import bie_core
    if torch.cuda.is_available():
        pytest.skip("this checks the no-CUDA message")
    with pytest.raises(Exception, match="cutlass"):
        bie_core.ops.binary_gemm(torch.zeros(1, 1, dtype=torch.uint8), torch.zeros(1, 1, dtype=torch.uint8), 8,
                                 None, None, None, backend="cutlass")


def test_headers_from_env(tmp_path, monkeypatch):
    from bie_backend_cutlass import _build
    inc = tmp_path / "include"
    (inc / "cutlass").mkdir(parents=True)
    (inc / "cutlass" / "cutlass.h").write_text("// test\n")
    (inc / "cutlass" / "version.h").write_text(
        "#define CUTLASS_MAJOR 9\n#define CUTLASS_MINOR 8\n#define CUTLASS_PATCH 7\n")
    monkeypatch.setenv("BIE_CUTLASS_INCLUDE", str(inc))
    assert _build.cutlass_root() == tmp_path
    assert _build.cutlass_version() == "9.8.7"
    assert str(inc) in _build.include_dirs()


def test_missing_headers_say_how_to_fix(tmp_path, monkeypatch):
    from bie_backend_cutlass import _build
    monkeypatch.setenv("BIE_CUTLASS_INCLUDE", str(tmp_path))
    with pytest.raises(_build.CutlassHeadersNotFound, match="cutlass.h"):
        _build.cutlass_root()
    monkeypatch.delenv("BIE_CUTLASS_INCLUDE")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(_build.CutlassHeadersNotFound, match="pip install nvidia-cutlass"):
        _build.cutlass_root()
    assert "nvidia-cutlass" in _build.probe_reason()


def test_cache_keys_follow_sources_and_arch(tmp_path, monkeypatch):
    from bie_backend_cutlass import _build
    monkeypatch.setenv("BIE_CUTLASS_CACHE", str(tmp_path))
    e1 = _build.Extension(family="binary", sources=("binary_bindings.cpp",))
    e2 = _build.Extension(family="integer", sources=("integer_bindings.cpp",))
    assert _build.build_dir(e1, (9, 0)) != _build.build_dir(e2, (9, 0))
    assert _build.build_dir(e1, (9, 0)) != _build.build_dir(e1, (8, 0))
    assert _build.build_dir(e1, (9, 0)).parent == tmp_path
    assert "sm_90a" in _build.gencode((9, 0)) and "sm_80" in _build.gencode((8, 0))


@pytest.fixture
def tuner(tmp_path, monkeypatch):
    from bie_backend_cutlass import tuning
    monkeypatch.setenv("BIE_CUTLASS_CACHE", str(tmp_path))
    monkeypatch.setattr(tuning, "gpu_key", lambda device=None: "TestGPU-sm90-132sm-v0")
    monkeypatch.setattr(tuning, "_tables", {})
    timings = {}
    monkeypatch.setattr(tuning, "_time", lambda fn, reps: timings[fn()])
    monkeypatch.setattr(tuning, "_flusher", lambda device: None)
    return tuning, timings


def test_tuning_picks_fastest_and_caches(tuner):
    tuning, timings = tuner
    timings.update(a=3.0, b=1.0, c=2.0)
    calls = []

    def cand(name):
        def run():
            calls.append(name)
            return name
        return run

    cands = [(n, cand(n)) for n in "abc"]
    assert tuning.choose("int_gemm", "M8192", cands) == "b"
    assert set(calls) == {"a", "b", "c"}
    calls.clear()
    assert tuning.choose("int_gemm", "M8192", cands) == "b" and calls == []   # cached in memory
    table = json.loads(tuning.table_path().read_text())
    assert table == {"int_gemm/M8192": {"best": "b", "candidates": ["a", "b", "c"],          # and on disk,
                                        "us": {"b": 1000.0, "c": 2000.0, "a": 3000.0}}}   # with the medians
    tuning._tables.clear()
    assert tuning.choose("int_gemm", "M8192", cands) == "b" and calls == []   # a new process reads it
    # another bucket is tuned on its own
    timings.update(a=0.5)
    assert tuning.choose("int_gemm", "M1", cands) == "a"


def test_tuning_buckets_are_quarter_octaves():
    """Sizes share a tuned configuration only within a quarter octave (powers of two up to 16): 384 and 512 rows (3
    and 4 rows of 128-row tiles) are tuned apart; every size maps to the smallest bucket at or above it."""
    from bie_backend_cutlass import tuning
    assert [tuning.bucket(v) for v in (1, 3, 16, 17, 33, 100, 384, 385, 512, 513, 14336, 16384)] == \
        [1, 4, 16, 20, 40, 112, 384, 448, 512, 640, 14336, 16384]
    prev = 0
    for v in range(1, 5000):
        b = tuning.bucket(v)
        assert b >= v and b >= prev, v                               # monotone, at or above
        assert b - v < (v if v <= 16 else v / 4), v                  # powers of two up to 16, then quarters
        assert tuning.bucket(b) == b                                 # a bucket is its own bucket
        prev = b


def test_tuning_keeps_the_default_within_the_noise(tuner):
    """The first (default) candidate stays unless another is faster by more than KEEP_DEFAULT."""
    tuning, timings = tuner
    timings.update(first=1.015, other=1.0, third=1.3)
    cands = [(n, (lambda n=n: n)) for n in ("first", "other", "third")]
    assert tuning.choose("binary_gemm", "near", cands) == "first"
    timings.update(first=1.05)
    assert tuning.choose("binary_gemm", "far", cands) == "other"


def test_tuning_skips_failing_candidates_and_stale_entries(tuner):
    tuning, timings = tuner
    timings.update(ok=5.0)

    def broken():
        raise RuntimeError("this tile needs K % 256 == 0")

    assert tuning.choose("binary_gemm", "b", [("fast_but_broken", broken), ("ok", lambda: "ok")]) == "ok"
    # a cached name that no longer exists (e.g. after an upgrade) is re-tuned, not trusted
    tuning._tables.clear()
    path = tuning.table_path()
    path.write_text(json.dumps({"binary_gemm/b": {"best": "gone", "candidates": ["gone", "ok", "x"]}}))
    assert tuning.choose("binary_gemm", "b", [("x", lambda: "ok"), ("ok", lambda: "ok")]) in {"x", "ok"}


def test_tuning_again_when_the_candidates_change(tuner):
    """A bucket tuned before a configuration was added is timed again (the new one may win); an entry of
    the older format (a bare name) counts as tuned among unknown candidates."""
    tuning, timings = tuner
    timings.update(a=3.0, b=2.0, new=1.0)
    two = [("a", lambda: "a"), ("b", lambda: "b")]
    assert tuning.choose("wq_gemm_sm90", "M16", two) == "b"
    assert tuning.choose("wq_gemm_sm90", "M16", two + [("new", lambda: "new")]) == "new"
    assert json.loads(tuning.table_path().read_text())["wq_gemm_sm90/M16"]["candidates"] == ["a", "b", "new"]
    tuning._tables.clear()
    tuning.table_path().write_text(json.dumps({"wq_gemm_sm90/M16": "a"}))      # written by an older version
    assert tuning.choose("wq_gemm_sm90", "M16", two) == "b"


def test_tuning_off_uses_default_untimed(tuner, monkeypatch):
    tuning, timings = tuner
    monkeypatch.setenv("BIE_CUTLASS_TUNE", "0")

    def never():
        raise AssertionError("must not run while tuning is off")

    assert tuning.choose("int_gemm", "x", [("default", never), ("other", never)]) == "default"
    assert not tuning.table_path().exists()
    with pytest.raises(ValueError):
        tuning.choose("int_gemm", "x", [])


def test_tuning_off_while_capturing(tuner, monkeypatch):
    tuning, timings = tuner
    monkeypatch.setattr(tuning, "_capturing", lambda: True)

    def never():
        raise AssertionError("must not run during graph capture")

    assert tuning.choose("int_gemm", "y", [("default", never), ("other", never)]) == "default"


def test_failed_family_build_makes_its_capabilities_refuse(monkeypatch):
    """After a family's extension failed to build, its kernels decline with the
    reason (so an automatic choice falls back); other families are untouched."""
    from bie_core import Capability
    from bie_backend_cutlass import _build, plugin

    got = {}

    class FakeRegistry:
        def register(self, op, fn, *, capability=None, **kw):
            got[op] = capability

    fam_a = _build.Extension(family="famA", sources=("a.cpp",))
    fam_b = _build.Extension(family="famB", sources=("b.cpp",))
    inner_calls = []

    def inner(p):
        inner_calls.append(p)
        return "inner says no" if p == "bad" else None

    plugin._FamilyRegistrar(FakeRegistry(), fam_a).register("op_a", None, capability=Capability(check=inner))
    plugin._FamilyRegistrar(FakeRegistry(), fam_b).register("op_b", None, capability=Capability())
    assert got["op_a"].check("ok") is None and got["op_a"].check("bad") == "inner says no"
    assert got["op_b"].check("ok") is None
    monkeypatch.setitem(_build._errors, "famA", RuntimeError("nvcc fatal: unsupported gpu architecture\nmore"))
    reason = got["op_a"].check("ok")
    assert "famA" in reason and "failed to build" in reason and "unsupported gpu architecture" in reason
    assert "more" not in reason
    assert got["op_b"].check("ok") is None
    n = len(inner_calls)
    got["op_a"].check("bad")
    assert len(inner_calls) == n  # the failure is reported before any shape logic runs


def test_tuning_ranks_by_median_of_interleaved_rounds(tuner, monkeypatch):
    """One slow outlier sample (a clock dip, another process) does not decide the ranking,
    and candidates are sampled in turns, not one after the other."""
    tuning, _ = tuner
    seq = {"a": iter([1.0, 1.0] + [1.0, 9.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
           "b": iter([1.2, 1.2] + [1.2] * 7)}
    order = []

    def fake_time(fn, reps):
        name = fn()
        order.append(name)
        return next(seq[name])

    monkeypatch.setattr(tuning, "_time", fake_time)
    cands = [(n, (lambda n=n: n)) for n in "ab"]
    assert tuning.measure(cands) == {"a": 1.0, "b": 1.2}
    assert order[2:6] == ["a", "b", "a", "b"]


def test_every_local_include_is_in_its_family_cache_key(tmp_path, monkeypatch):
    """A family's cache key hashes its sources and every header they include from csrc/, transitively: editing
    any of them changes the build directory (a stale build is never reused)."""
    import re
    import shutil
    from bie_backend_cutlass import _build, binary, integer, weight_only
    for ext in (binary.EXTENSION, integer.EXTENSION, weight_only.EXTENSION):
        files = {p.name for p in _build.native(ext, (9, 0)).files()}
        for name in ext.sources:
            for inc in re.findall(r'#include\s+"([^"]+)"', (_build.CSRC / name).read_text()):
                if (_build.CSRC / inc).exists():
                    assert inc in files, (ext.family, name, inc)
    # an edit to a header included only through another header moves the key
    csrc = tmp_path / "csrc"
    shutil.copytree(_build.CSRC, csrc)
    monkeypatch.setattr(_build, "CSRC", csrc)
    ext = weight_only.EXTENSION
    before = _build.build_dir(ext, (9, 0))
    nested = {p.name for p in _build.native(ext, (9, 0)).files()} - set(ext.sources)
    assert nested
    victim = csrc / sorted(nested)[0]
    victim.write_text(victim.read_text() + "\n// edited\n")
    assert _build.build_dir(ext, (9, 0)) != before


def test_tuning_cli_says_why_without_a_gpu(capsys):
    """`python -m bie_backend_cutlass.tuning --show`: the table with its medians on a GPU, a plain message (no
    traceback) without one."""
    from bie_backend_cutlass import tuning
    rc = tuning._main(["--show"])
    out = capsys.readouterr().out
    if torch.cuda.is_available():
        assert rc == 0 and out.splitlines()[0].endswith(".json:")
    else:
        assert rc == 1 and "no CUDA device" in out


def test_tuning_table_follows_the_cache_place(tuner, tmp_path, monkeypatch):
    """The table's place is worked out once per cache setting (not on every lookup), and a new setting gets its own
    table: tuned there afresh, written there."""
    tuning, timings = tuner
    timings.update(a=2.0, b=1.0)
    calls = []
    cands = [(n, (lambda n=n: calls.append(n) or n)) for n in "ab"]
    assert tuning.choose("int_gemm", "M64", cands) == "b" and calls
    first = tuning.table_path()
    calls.clear()
    assert tuning.choose("int_gemm", "M64", cands) == "b" and calls == []
    other = tmp_path / "elsewhere"
    monkeypatch.setenv("BIE_CUTLASS_CACHE", str(other))
    assert tuning.choose("int_gemm", "M64", cands) == "b" and calls, "a new cache place is tuned afresh"
    assert tuning.table_path() != first and tuning.table_path().is_file()
    assert str(tuning.table_path()).startswith(str(other))

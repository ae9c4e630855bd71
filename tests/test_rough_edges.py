"""What a new user meets first: backend lists, fix hints, error prefixes, the
``bie`` command (backends, explain, build), the 1-bit MPQLinear on CPU, the
docs' size claim and the conformance kit's command."""
from __future__ import annotations

import io
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

import bie_core
from bie_core import ops
from bie_core.errors import BackendUnavailableError, BieFallbackWarning, UnknownBackendError

ROOT = Path(__file__).resolve().parent.parent

NODEVICE = """
from bie_core.plugins import BackendDescriptor
def _load():
    raise AssertionError("must not be loaded when the probe says no")
backend = BackendDescriptor(name="nodevice", api_version="1.0", device_types=("cuda",),
                            probe=lambda: "no CUDA device", load=_load, distribution="fake-bie-nodevice",
                            install_hint="pip install fake-bie-nodevice")
"""


def _bits():
    a = ops.pack_signs(torch.randn(3, 64))
    b = ops.pack_signs(torch.randn(5, 64))
    return a, b, 64


# ------------------------------------------------------------ backend lists
def test_ordered_list_skips_unavailable_everywhere_single_name_stays_strict(plugin_factory, monkeypatch):
    plugin_factory.make("nodevice", NODEVICE)
    a, b, k = _bits()
    want = ops.binary_gemm(a, b, k, None, None, None, backend="cpu")
    bie_core.set_backend("nodevice,cpu")
    try:
        assert bie_core.get_backend() == ("nodevice", "cpu")
        assert torch.equal(ops.binary_gemm(a, b, k, None, None, None), want)
    finally:
        bie_core.set_backend(None)
    with bie_core.use_backend(["nodevice", "cpu"]):
        assert torch.equal(ops.binary_gemm(a, b, k, None, None, None), want)
    layer = bie_core.BinaryLinear(64, 5, backend="nodevice,cpu")
    assert layer.backend == "nodevice,cpu"
    monkeypatch.setenv("BIE_BACKEND", "nodevice,cpu")          # the environment: the same rule
    bie_core.dispatch.clear_caches()
    assert torch.equal(ops.binary_gemm(a, b, k, None, None, None), want)
    # a single explicit name is strict, in every form
    with pytest.raises(BackendUnavailableError, match="backend 'nodevice' cannot be used here"):
        bie_core.set_backend("nodevice")
    with pytest.raises(BackendUnavailableError):
        with bie_core.use_backend("nodevice"):
            pass
    with pytest.raises(BackendUnavailableError, match=r"BinaryLinear\(backend='nodevice'\)"):
        bie_core.BinaryLinear(64, 5, backend="nodevice")
    # a list with no usable entry names every entry and why
    with pytest.raises(BackendUnavailableError) as info:
        bie_core.set_backend("nodevice,nope")
    msg = str(info.value)
    assert "none of the backends ['nodevice', 'nope']" in msg
    assert "nodevice: unavailable: no CUDA device" in msg and "nope: not installed" in msg
    assert bie_core.get_backend() is None


def test_ordered_list_skips_unknown_names_with_a_warning(fresh_bie):
    a, b, k = _bits()
    with pytest.warns(BieFallbackWarning, match=r"names \['nope'\] that no installed plugin provides"):
        with bie_core.use_backend("nope,cpu"):
            ops.binary_gemm(a, b, k, None, None, None)
    with pytest.raises(UnknownBackendError, match="installed backends"):
        bie_core.set_backend("nope")


def test_layer_errors_name_the_layer_and_the_value(fresh_bie):
    with pytest.raises(UnknownBackendError) as info:
        bie_core.BinaryLinear(4, 4, backend="nope")
    assert str(info.value).startswith("BinaryLinear(backend='nope'): unknown backend 'nope'; installed backends")
    with pytest.raises(UnknownBackendError) as info:
        bie_core.MPQLinear(64, 16, bits=4, group_size=32, backend="nope")
    assert str(info.value).startswith("MPQLinear(backend='nope'): unknown backend 'nope'")


# ------------------------------------------------------------------- hints
def _record(status, devices, hint="pip install bie-backend-x"):
    from bie_core.plugins.registry import BackendRecord
    return BackendRecord(name="x", distribution="bie-backend-x", status=status, cause="no CUDA device",
                         devices=devices, install_hint=hint)


def test_fix_hint_says_the_real_cause(monkeypatch):
    from bie_core.plugins.hints import fix_hint
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    h = fix_hint(_record("unavailable", ("cuda",)))
    assert "bie-backend-x is installed" in h and "built without CUDA" in h and "pip install bie-backend-x" not in h
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    h = fix_hint(_record("unavailable", ("cuda",)))
    assert "finds no CUDA device" in h and "CUDA_VISIBLE_DEVICES" in h
    # missing pieces of a broken install: its install hint
    assert fix_hint(_record("broken", ("cuda",))) == "pip install bie-backend-x"
    assert fix_hint(_record("loaded", ("cuda",))) == ""


def test_unavailable_backend_error_carries_the_machine_cause(plugin_factory, monkeypatch):
    plugin_factory.make("nodevice", NODEVICE)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    with pytest.raises(BackendUnavailableError) as info:
        bie_core.set_backend("nodevice")
    assert "fake-bie-nodevice is installed, but torch" in str(info.value)
    assert "pip install fake-bie-nodevice" not in str(info.value)


# -------------------------------------------------------------- bie command
def test_bie_backends_is_a_short_table_details_under_v(plugin_factory, capsys):
    plugin_factory.make("nodevice", NODEVICE)
    broken = "from bie_core.plugins import BackendDescriptor\nimport this_module_does_not_exist_anywhere\n"
    plugin_factory.make("broken", broken)
    from bie_core.cli import main
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    recs = bie_core.backends()
    not_loaded = [r for r in recs if r.status != "loaded"]
    # a header, one row per backend, a cause (and fix) line under each not loaded, a pointer to -v
    assert len(out.strip().splitlines()) <= 2 + len(recs) + 2 * len(not_loaded) + 2, out
    assert "kernels (" not in out and "Traceback" not in out
    assert "nodevice" in out and "cause: no CUDA device" in out
    assert main(["backends", "-v"]) == 0
    out_v = capsys.readouterr().out
    assert "kernels (" in out_v and "Traceback" in out_v and "this_module_does_not_exist_anywhere" in out_v


def test_bie_backends_json_into_a_closed_pipe_is_quiet():
    # the reader is gone before the command prints (it is still importing):
    # the write fails with EPIPE, as under `bie backends --json | head -0`
    p = subprocess.Popen([sys.executable, "-m", "bie_core", "backends", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err.decode()
    assert b"BrokenPipeError" not in err and b"Traceback" not in err, err.decode()


def test_bie_main_survives_a_broken_pipe(monkeypatch):
    class Gone(io.StringIO):
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self):
            raise io.UnsupportedOperation("no fd")
    monkeypatch.setattr(sys, "stdout", Gone())
    from bie_core.cli import main
    assert main(["backends", "--json"]) == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a torch without CUDA")
@pytest.mark.parametrize("device,needle", [
    ("foo", "'foo' is not a torch device"),
    ("cuda", "cannot create tensors there"),
    ("cuda:1", "cannot create tensors there"),
])
def test_bie_explain_on_a_device_torch_lacks_is_a_clear_error(capsys, device, needle):
    from bie_core.cli import main
    assert main(["explain", "--device", device]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_bie_build_cpu_does_not_compile_twice(monkeypatch):
    """``bie build`` loads the plugins first, and the cpu plugin's first use
    compiles; build() must then report that build, not compile again."""
    from bie_backend_cpu import native
    calls = []
    monkeypatch.setattr(native, "load", lambda **kw: calls.append(kw) or native._status)
    built = native.NativeStatus(state="active", build_dir="/x", build_seconds=12.0, level="avx2", fused="active")
    monkeypatch.setattr(native, "_status", built)
    assert "native kernels built in /x" in native.build()
    assert calls == []
    cached = native.NativeStatus(state="active", build_dir="/x", build_seconds=None, level="avx2", fused="active")
    monkeypatch.setattr(native, "_status", cached)         # loaded from the cache: build() rebuilds
    native.build()
    assert calls == [{"force_rebuild": True, "verbose": False}]


# -------------------------------------------------- docs agree with behaviour
def test_one_bit_mpq_on_cpu_is_served_by_the_reference_without_warning():
    # docs/weight-only.md "On CPU": a kernel of the same backend taking over is no fallback
    layer = bie_core.MPQLinear(128, 64, bits=1, group_size=32, dtype=torch.float32)
    x = torch.randn(2, 128)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BieFallbackWarning)
        layer(x)
    text = str(bie_core.explain(layer, x))
    assert "cpu:reference.wq_gemm" in text
    doc = (ROOT / "docs" / "weight-only.md").read_text()
    assert "1-bit layers are served by the reference kernels, without a warning" in doc


def test_qat_doc_size_claim_matches_its_example():
    from torch import nn
    model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(32),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(64),
                          nn.Flatten(), nn.Linear(64 * 8 * 8, 10))

    def size(m):
        return sum(t.numel() * t.element_size() for t in m.state_dict().values())
    before = size(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bie_core.convert(model, "binary")
        model(torch.randn(2, 1, 8, 8))
        conv = model[3]
        conv_before = size(conv)
        bie_core.pack(model)
    whole, conv_ratio = before / size(model), conv_before / size(conv)
    assert 1.3 < whole < 1.5 and 20 < conv_ratio < 35, (whole, conv_ratio)
    doc = (ROOT / "docs" / "qat.md").read_text()
    assert f"this model {whole:.1f}x smaller" in doc and "~20x smaller" not in doc


# ------------------------------------------------------ the conformance kit
def test_kit_without_paths_collects_only_the_kit():
    from bie_core.testing import plugin

    def cfg(backend, source):
        return types.SimpleNamespace(getoption=lambda k: backend if k == "--bie-backend" else None,
                                     args_source=source)
    src = pytest.Config.ArgsSource
    assert plugin.pytest_ignore_collect(ROOT / "tests", cfg("cpu", src.TESTPATHS)) is True
    assert plugin.pytest_ignore_collect(ROOT / "tests", cfg("cpu", src.INVOCATION_DIR)) is True
    assert plugin.pytest_ignore_collect(ROOT / "tests", cfg("cpu", src.ARGS)) is None     # paths given: kept
    assert plugin.pytest_ignore_collect(ROOT / "tests", cfg(None, src.TESTPATHS)) is None  # not kit mode

"""Plugin discovery and isolation, with fake third-party backends installed as
real distributions (their own dist-info and bie.backends entry points)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import bie_core
from bie_core import ops
from bie_core.errors import BackendUnavailableError, UnknownBackendError

FAST = """
from bie_core.plugins import BackendDescriptor, hookimpl
from bie_core import Capability

CALLS = []

def _gemm(a, b, k, scale, bias, out_dtype):
    CALLS.append((a.shape, b.shape))
    from bie_backend_cpu.reference.binary import binary_gemm
    return binary_gemm(a, b, k, scale, bias, out_dtype)

class Plugin:
    @hookimpl
    def bie_register_kernels(self, registry):
        registry.register("binary_gemm", _gemm, name="turbo_gemm", priority=500,
                          capability=Capability(devices=("cpu",)))

backend = BackendDescriptor(name="fast", api_version="1.0", device_types=("cpu",),
                            load=Plugin, description="a faster fake")
"""

BROKEN = """
from bie_core.plugins import BackendDescriptor
import this_module_does_not_exist_anywhere  # fails when the entry point is resolved
backend = None
"""

BROKEN_LOAD = """
from bie_core.plugins import BackendDescriptor
def _load():
    raise RuntimeError("libfoo.so: cannot open shared object file")
backend = BackendDescriptor(name="brokenload", api_version="1.0", device_types=("cpu",), load=_load)
"""

FUTURE = """
from bie_core.plugins import BackendDescriptor
def _load():
    raise AssertionError("must not be loaded: incompatible API")
backend = BackendDescriptor(name="future", api_version="2.3", device_types=("cpu",), load=_load)
"""

NODEVICE = """
from bie_core.plugins import BackendDescriptor
def _load():
    raise AssertionError("must not be loaded when the probe says no")
backend = BackendDescriptor(name="nodevice", api_version="1.0", device_types=("cuda",),
                            probe=lambda: "no CUDA device", load=_load,
                            install_hint="needs an NVIDIA GPU")
"""

TYPO = """
from bie_core.plugins import BackendDescriptor, hookimpl
class Plugin:
    @hookimpl
    def bie_register_kernels(self, registy):  # misspelled argument: pluggy must refuse it
        pass
backend = BackendDescriptor(name="typo", api_version="1.0", device_types=("cpu",), load=Plugin)
"""

EXITS = """
import sys
from bie_core.plugins import BackendDescriptor
def _load():
    sys.exit(1)  # a native library that exits must not take the process down
backend = BackendDescriptor(name="exits", api_version="1.0", device_types=("cpu",), load=_load)
"""


def _bits(m=4, n=8, k=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ops.pack_signs(torch.randn(m, k, generator=g)), ops.pack_signs(torch.randn(n, k, generator=g)), k


def test_import_is_lazy():
    """import bie_core must not load any backend (nor its heavy imports)."""
    code = ("import sys, bie_core; "
            "assert not any(m.startswith('bie_backend') for m in sys.modules), sorted(sys.modules); "
            "from bie_core.plugins.registry import get_registry; "
            "assert not get_registry()._discovered; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout


def test_higher_priority_plugin_is_picked_and_explained(plugin_factory):
    pkg = plugin_factory.make("fast", FAST, version="1.2.3")
    a, b, k = _bits()
    y = ops.binary_gemm(a, b, k, None, None, None)
    mod = sys.modules[pkg]
    assert len(mod.CALLS) == 1
    with bie_core.use_backend("cpu"):
        assert torch.equal(y, ops.binary_gemm(a, b, k, None, None, None))
    rec = {r.name: r for r in bie_core.backends()}["fast"]
    assert rec.status == "loaded" and rec.distribution == "fake-bie-fast" and rec.version == "1.2.3"
    ex = bie_core.explain(ops.binary_gemm, a, b, k, None, None, None)
    assert ex.chosen() == {"binary_gemm": "fast:turbo_gemm"}
    text = str(ex)
    assert "fast:turbo_gemm (priority 500; automatic)" in text
    assert "also able: cpu:reference.binary_gemm" in text


def test_broken_import_is_recorded_and_isolated(plugin_factory):
    plugin_factory.make("broken", BROKEN)
    plugin_factory.make("fast", FAST)
    a, b, k = _bits()
    ops.binary_gemm(a, b, k, None, None, None)  # works: other backends unaffected
    recs = {r.name: r for r in bie_core.backends()}
    assert recs["fast"].status == "loaded" and recs["cpu"].status == "loaded"
    br = recs["broken"]
    assert br.status == "broken"
    assert "this_module_does_not_exist_anywhere" in br.cause
    assert "Traceback" in br.traceback and "ModuleNotFoundError" in br.traceback
    with pytest.raises(BackendUnavailableError) as info:
        bie_core.set_backend("broken")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    assert "this_module_does_not_exist_anywhere" in str(info.value)
    assert bie_core.get_backend() is None


@pytest.mark.parametrize("name,code,status,needle", [
    ("brokenload", BROKEN_LOAD, "broken", "libfoo.so"),
    ("future", FUTURE, "incompatible", "major versions must match"),
    ("nodevice", NODEVICE, "unavailable", "no CUDA device"),
    ("typo", TYPO, "broken", "registy"),
    ("exits", EXITS, "broken", "SystemExit"),
], ids=["load-raises", "api-2.x", "probe-no-device", "hook-typo", "sys-exit"])
@pytest.mark.filterwarnings("ignore::bie_core.BieFallbackWarning")
def test_bad_plugins_are_recorded_with_cause(plugin_factory, name, code, status, needle):
    plugin_factory.make(name, code)
    recs = {r.name: r for r in bie_core.backends()}
    assert recs[name].status == status, recs[name]
    assert needle in (recs[name].cause or "") + (recs[name].traceback or "")
    assert recs["cpu"].status == "loaded"
    a, b, k = _bits()
    ops.binary_gemm(a, b, k, None, None, None)
    with pytest.raises(BackendUnavailableError, match=name):
        bie_core.set_backend(name)
    with pytest.raises(BackendUnavailableError):
        with bie_core.use_backend(name):
            pass


def test_bie_backends_command_exits_zero_with_broken_plugin(plugin_factory, capsys):
    plugin_factory.make("broken", BROKEN)
    from bie_core.cli import main
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "BROKEN" in out and "this_module_does_not_exist_anywhere" in out
    assert main(["backends", "-v"]) == 0
    assert "Traceback" in capsys.readouterr().out
    assert main(["backends", "--json"]) == 0


def test_unknown_backend_lists_known(fresh_bie):
    with pytest.raises(UnknownBackendError) as info:
        bie_core.set_backend("cutlas")
    assert "cutlas" in str(info.value) and "'cpu'" in str(info.value)


def test_allowlist_and_disable_autoload(plugin_factory, monkeypatch):
    plugin_factory.make("fast", FAST)
    monkeypatch.setenv("BIE_PLUGINS", "cpu")
    recs = {r.name: r for r in bie_core.backends()}
    assert recs["fast"].status == "disabled" and recs["cpu"].status == "loaded"
    bie_core.get_registry().reset()
    monkeypatch.setenv("BIE_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert bie_core.backends() == []
    with pytest.raises(bie_core.NoKernelError, match="bie-backend-cpu"):
        ops.pack_signs(torch.randn(2, 8))


def test_register_backend_in_code(fresh_bie):
    from bie_core.plugins import BackendDescriptor, hookimpl

    seen = []

    class P:
        @hookimpl
        def bie_register_kernels(self, registry):
            registry.register("pack_signs", lambda x: seen.append(1) or
                              __import__("bie_backend_cpu.reference.binary", fromlist=["x"]).pack_signs(x),
                              priority=1000, name="inline")

    bie_core.register_backend(BackendDescriptor("inline", "1.0", ("*",), load=P))
    ops.pack_signs(torch.randn(3, 9))
    assert seen == [1]
    with pytest.raises(bie_core.PluginValidationError):
        class Bad:
            @hookimpl
            def bie_register_kernels(self, registry):
                registry.register("no_such_op", lambda: None)
        fresh_bie.register_backend(BackendDescriptor("bad", "1.0", ("*",), load=Bad))
        rec = fresh_bie.record("bad")
        assert rec.status == "broken"
        raise rec.exception


def test_reference_fallback_hint_names_the_loaded_backends(fresh_bie):
    """Where only the reference serves an op on an accelerator, the warning says to install a backend for that
    device; where backends for it are loaded but none implements the op, it names them instead."""
    from bie_core import dispatch
    from bie_core.plugins import BackendDescriptor, hookimpl
    assert "pip install" in dispatch._reference_hint("cuda")

    class P:
        @hookimpl
        def bie_register_kernels(self, registry):
            pass
    bie_core.register_backend(BackendDescriptor("gpu_partial", "1.0", ("cuda",), load=P))
    fresh_bie.ensure_discovered()
    if {r.name: r.status for r in bie_core.backends()}.get("gpu_partial") != "loaded":
        pytest.skip("a CUDA-only backend does not load here")
    hint = dispatch._reference_hint("cuda")
    assert "gpu_partial" in hint and "pip install" not in hint

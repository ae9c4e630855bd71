"""Shared fixtures: an isolated plugin registry and fake third-party backends
installed as real distributions (dist-info with entry points) in a temp dir."""
from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture
def fresh_bie(monkeypatch):
    """Forget discovered backends and dispatch state before and after the test."""
    from bie_core import dispatch
    from bie_core.plugins.registry import get_registry
    for var in ("BIE_BACKEND", "BIE_PLUGINS", "BIE_DISABLE_PLUGIN_AUTOLOAD", "BIE_STRICT"):
        monkeypatch.delenv(var, raising=False)
    reg = get_registry()
    reg.reset()
    dispatch.reset()
    yield reg
    for name in [d.name for d, _ in reg._manual]:
        reg.unregister_backend(name)
    reg.reset()
    dispatch.reset()


class PluginFactory:
    """Writes ``<pkg>/__init__.py`` and ``<dist>.dist-info`` into a sys.path dir."""

    def __init__(self, root, monkeypatch):
        self.root = root
        self.mp = monkeypatch
        self.mp.syspath_prepend(str(root))
        self.pkgs = []

    def make(self, name: str, code: str, *, dist: str | None = None, version: str = "0.0.1",
             target: str = "backend"):
        pkg = f"fakebie_{name}"
        dist = dist or f"fake-bie-{name}"
        (self.root / pkg).mkdir()
        (self.root / pkg / "__init__.py").write_text(textwrap.dedent(code))
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[bie.backends]\n{name} = {pkg}:{target}\n")
        self.pkgs.append(pkg)
        importlib.invalidate_caches()
        return pkg

    def cleanup(self):
        for pkg in self.pkgs:
            sys.modules.pop(pkg, None)


@pytest.fixture
def plugin_factory(tmp_path, monkeypatch, fresh_bie):
    f = PluginFactory(tmp_path, monkeypatch)
    yield f
    f.cleanup()
    importlib.invalidate_caches()

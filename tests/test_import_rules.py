"""Backends reach bie only through its one door: ``bie_core.backend_api`` (and bie_core's public top-level
names), and never import another backend. The core's op table, dispatcher and registry do not import each other
in a circle."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import bie_core

ROOT = Path(__file__).resolve().parents[1]
#: backend distribution folder -> its top-level package
BACKENDS = {
    "backends/cpu": "bie_backend_cpu",
    "backend_cuda": "bie_backend_cuda",
    "backend_cutlass": "bie_backend_cutlass",
    "backend_mlx": "bie_backend_mlx",
    "examples/example_backend": "bie_backend_example",
}
ALLOWED_CORE = {"bie_core", "bie_core.backend_api"}


def _imports(path: Path):
    """(line, module, names) of every absolute import in a file."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, ()
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module, tuple(a.name for a in node.names)


def _sources(folder: str):
    pkg = ROOT / folder / BACKENDS[folder]
    return sorted(p for p in pkg.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("folder", sorted(BACKENDS))
def test_backend_imports_only_the_backend_api(folder):
    own = BACKENDS[folder]
    others = {pkg for pkg in BACKENDS.values() if pkg != own}
    files = _sources(folder)
    assert files, f"no sources found under {folder}"
    bad = []
    for path in files:
        for line, mod, names in _imports(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            top = mod.split(".")[0]
            if top in others:
                bad.append(f"{where} imports another backend: {mod}")
            elif top == "bie_core":
                if mod not in ALLOWED_CORE:
                    bad.append(f"{where} imports {mod} (only bie_core.backend_api is a backend's door)")
                elif mod == "bie_core":
                    private = [n for n in names if n.startswith("_") or n not in bie_core.__all__]
                    if private:
                        bad.append(f"{where} imports {private} from bie_core (not in bie_core.__all__)")
    assert not bad, "\n".join(bad)


def test_backend_api_exports_exactly_its_all():
    from bie_core import backend_api
    assert len(set(backend_api.__all__)) == len(backend_api.__all__)
    missing = [n for n in backend_api.__all__ if not hasattr(backend_api, n)]
    assert not missing, missing


def _core_module_imports(rel: str) -> set:
    """bie_core modules a core module imports, anywhere in it (late imports included), as dotted names."""
    path = ROOT / "bie_core" / rel
    pkg = ["bie_core"] + list(Path(rel).parent.parts)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[:len(pkg) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
                names = [a.name for a in node.names]
                out.add(mod)
                out.update(f"{mod}.{n}" for n in names)
            elif node.module and node.module.startswith("bie_core"):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("bie_core"))
    return out


def test_op_table_dispatcher_and_registry_import_no_circle():
    table = {"ops": "ops/_opdef.py", "dispatch": "dispatch.py", "registry": "plugins/registry.py",
             "optable": "optable.py"}
    module = {"ops": "bie_core.ops._opdef", "dispatch": "bie_core.dispatch",
              "registry": "bie_core.plugins.registry", "optable": "bie_core.optable"}
    edges = {a: {b for b in table if b != a and (module[b] in _core_module_imports(table[a])
                                                 or (b == "ops" and any(m.startswith("bie_core.ops")
                                                                        for m in _core_module_imports(table[a]))))}
             for a in table}
    assert "dispatch" not in edges["registry"] and "ops" not in edges["registry"], edges
    assert "ops" not in edges["dispatch"], edges
    assert not edges["optable"], edges

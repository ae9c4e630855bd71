"""Loading a script of benchmarks/ as a module in a test (the folder is no package): the scripts import their
siblings (bench_e2e_llm, gpu_timing) by name, so the folder is on sys.path while one loads, and taken off again."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_bench_script(name: str):
    """benchmarks/<name>.py as a module."""
    path = list(sys.path)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = path
    return mod

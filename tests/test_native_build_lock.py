"""The native build never waits on a dead process: an interrupted build leaves torch's lock file in the build
directory (torch waits while it exists, forever), which bie's OS lock makes safe to remove; a live build in another
process is waited for, and its result used. torch's compiler call is replaced by a stand-in (no compiler runs)."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bie_core import native_build
from bie_core.native_build import BUILD_LOCK, OK_STAMP, TORCH_LOCK, NativeExtension

pytest.importorskip("fcntl")


def _ext(tmp_path, monkeypatch) -> NativeExtension:
    csrc = tmp_path / "csrc"
    csrc.mkdir(exist_ok=True)
    (csrc / "k.cpp").write_text("int bie_answer() { return 42; }\n")
    monkeypatch.setenv("BIE_TEST_BUILD_CACHE", str(tmp_path / "cache"))
    return NativeExtension(name="bie_lock_test", csrc=csrc, sources=("k.cpp",), cache_env="BIE_TEST_BUILD_CACHE",
                           cache_subdir="lock_test")


class _FakeCompiler:
    """Stands in for torch.utils.cpp_extension: fails the way torch would hang if its lock file is there, and
    writes the library otherwise."""

    def __init__(self, ext):
        self.ext, self.calls = ext, []

    def load(self, name, sources, build_directory, **kw):
        from pathlib import Path
        d = Path(build_directory)
        if (d / TORCH_LOCK).exists():
            raise AssertionError("torch's build would wait on its lock file here")
        self.calls.append(time.monotonic())
        self.ext.library().write_bytes(b"\0")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    import torch.utils.cpp_extension as ce
    ext = _ext(tmp_path, monkeypatch)
    comp = _FakeCompiler(ext)
    monkeypatch.setattr(ce, "load", comp.load)
    return ext, comp


def test_a_lock_file_left_by_an_interrupted_build_is_removed(fake, capsys):
    ext, comp = fake
    d = ext.build_dir()
    d.mkdir(parents=True)
    (d / TORCH_LOCK).write_text("")               # what a killed build leaves behind
    assert ext.build() is not None
    assert len(comp.calls) == 1 and ext.is_built() and not (d / TORCH_LOCK).exists()
    assert "left by an interrupted build" in capsys.readouterr().err
    assert ext.build() is None                    # cached from now on


def _hold_lock(d, seconds, stamp=False):
    """A process that holds bie's build lock of directory ``d`` for ``seconds``, as a live build does, then
    optionally stamps the build finished (``stamp``); at the end it reports whether torch's lock file of its build
    was left alone, and removes it, as torch does when a build ends."""
    code = (f"import fcntl, pathlib, time\n"
            f"d = pathlib.Path({str(d)!r})\n"
            f"fh = open(d / {BUILD_LOCK!r}, 'a+')\n"
            f"fcntl.flock(fh, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            f"time.sleep({seconds})\n"
            + (f"(d / {OK_STAMP!r}).write_text('built')\n" if stamp else "")
            + f"lock = d / {TORCH_LOCK!r}\n"
            "print('intact' if lock.exists() else 'removed', flush=True)\n"
            "lock.unlink(missing_ok=True)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_live_build_in_another_process_is_waited_for(fake, capsys):
    ext, comp = fake
    d = ext.build_dir()
    d.mkdir(parents=True)
    (d / TORCH_LOCK).write_text("")               # the other process's build is running: its lock is not stale
    t0 = time.monotonic()
    holder = _hold_lock(d, 1.0)
    ext.build()
    assert holder.stdout.readline().strip() == "intact"   # not removed while its build ran
    holder.wait()
    assert comp.calls and comp.calls[0] - t0 >= 0.9
    assert "waiting for another process" in capsys.readouterr().err


def test_a_build_finished_by_the_process_waited_for_is_used(fake):
    ext, comp = fake
    d = ext.build_dir()
    d.mkdir(parents=True)
    ext.library().write_bytes(b"\0")              # the other process's result, stamped before it lets go
    holder = _hold_lock(d, 0.5, stamp=True)
    assert not ext.is_built()
    assert ext.build() is None                    # waited, found the build finished: nothing compiled here
    holder.wait()
    assert comp.calls == []


def test_the_lock_is_released_when_the_compiler_fails(fake, monkeypatch):
    import fcntl

    import torch.utils.cpp_extension as ce
    ext, _ = fake

    def broken(**kw):
        raise RuntimeError("error: the compiler failed")
    monkeypatch.setattr(ce, "load", lambda *a, **kw: broken())
    with pytest.raises(native_build.NativeBuildError, match="compiler failed"):
        ext.build()
    with open(ext.build_dir() / BUILD_LOCK, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)   # free again

"""Shared by the GPU backends' tests: bad input to native ops, called in a child process so that a crash
(a toolchain that links libstdc++ statically once turned every TORCH_CHECK message with a number into a
segmentation fault) fails the test instead of ending pytest."""
import subprocess
import sys

_LOOP = r'''
for _name, _expr in _CALLS.items():
    try:
        eval(_expr)
        print(_name, "-> no error")
    except RuntimeError as _e:
        print(_name, "-> RuntimeError:", str(_e).splitlines()[0][:160])
'''


def child_errors(setup: str, calls: dict) -> list:
    """Run `setup`, then evaluate every expression of `calls` (name -> Python expression) in a child process;
    return one line per call, "name -> RuntimeError: <first line>" or "name -> no error". The child must not die."""
    script = f"{setup}\n_CALLS = {calls!r}\n{_LOOP}"
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"the process died (rc {r.returncode}): {r.stdout[-2000:]} {r.stderr[-2000:]}"
    return r.stdout.strip().splitlines()

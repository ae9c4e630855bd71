"""What a results page records about the run: the CPU model and the commit measured."""
from __future__ import annotations

import os
import platform
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def git_commit() -> str:
    """The commit measured: $BIE_COMMIT where set (a device machine's copy may carry no .git), else the
    short hash of this checkout's HEAD, else "unknown"."""
    env = os.environ.get("BIE_COMMIT")
    if env:
        return env
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip() or "unknown"
        # a tracked file that differs from HEAD (or a device copy whose .git is older than its files): say so
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE,
                                 capture_output=True, text=True, check=True).stdout.strip()
        return head + "+uncommitted" if changed else head
    except (OSError, subprocess.CalledProcessError):
        return "unknown"

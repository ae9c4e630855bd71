"""What every backend that compiles a native extension (torch.utils.cpp_extension) shares.

No kernels here: only the build settings whose reason is the same for every backend.
"""
from __future__ import annotations

import sys


def link_flags() -> list[str]:
    """Linker flags for a native extension.

    Some toolchains link libstdc++ statically into shared objects (a GCC that has only
    ``libstdc++.a``, e.g. behind a ``CXX`` wrapper). The extension then carries its own copy of
    libstdc++ and, by default, exports it: the process's libstdc++ (loaded by torch) wins some
    symbols and the copy keeps others, so a stream built by one is formatted with the other's
    locale facets, and the first ``TORCH_CHECK`` message with a number in it crashes the process
    instead of raising. Keeping the symbols of static archives local makes the copy
    self-consistent; with a shared libstdc++ (the usual case) the flag changes nothing.
    """
    return ["-Wl,--exclude-libs,ALL"] if sys.platform.startswith("linux") else []

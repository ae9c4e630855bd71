"""The kernel families of this backend, one extension each (see ``_build``).

Each family module (``binary``, ``binary_conv``, ``integer``, ``weight_only``) declares its ``EXTENSION``; this list
is what ``bie build cutlass`` builds and what the probe checks.
"""
from __future__ import annotations

from . import binary, binary_conv, integer, weight_only

EXTENSIONS = (binary.EXTENSION, integer.EXTENSION, weight_only.EXTENSION, binary_conv.EXTENSION)

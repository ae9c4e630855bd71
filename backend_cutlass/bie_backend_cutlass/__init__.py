"""bie-backend-cutlass: CUTLASS kernels for bie's binary and 4/8-bit QAT ops.

Importing this package is cheap: nothing is compiled or loaded until a kernel
is first called (or ``bie build cutlass`` is run). The CUTLASS headers come
from the ``nvidia-cutlass`` wheel (no CUTLASS_HOME, no clone); each kernel
family is its own small extension built with ninja through
``torch.utils.cpp_extension`` and cached per torch / CUDA / GPU / source
version. Kernel configurations are chosen per GPU by a timing step whose
result is cached on disk (``tuning.py``).
"""
__version__ = "0.1.0"

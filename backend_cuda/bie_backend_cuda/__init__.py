"""bie-backend-cuda: CUDA kernels for bie's binary and weight-only ops.

Importing this package is cheap: no CUDA code is compiled or loaded until a
kernel is first called (or ``bie build cuda`` is run). The kernels are CUDA
C++ in ``csrc/``, built with ninja through ``torch.utils.cpp_extension`` for
the GPU in use and cached per torch / CUDA / architecture / source version.
"""
__version__ = "0.1.0"

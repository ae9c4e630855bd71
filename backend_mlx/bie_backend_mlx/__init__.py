"""bie-backend-mlx: bie kernels on Apple MLX.

* On Apple silicon, tensors on the ``mps`` device run on the Metal GPU through
  MLX (automatic selection prefers this backend there).
* On Linux (and for ``cpu`` tensors anywhere), the MLX CPU backend serves
  ``cpu`` tensors, but only when asked for (``bie_core.set_backend("mlx")``,
  ``use_backend``, ``BIE_BACKEND`` or a layer's ``backend=``): it is slower
  than the native CPU kernels, see ``docs/mlx-backend.md``.

Nothing here imports MLX until the backend is loaded (the descriptor module
is light); ``mlx`` is imported by :mod:`bie_backend_mlx.plugin`.
"""
__version__ = "0.1.0"

"""The executable definition of every bie op, in plain PyTorch.

Written for clarity first: each function is the math of docs/spec.md §2–3 with the
fewest steps that are exact. Integer results are exact by construction
(sums of small integers are computed in float64, exact below 2**53).
"""
from . import binary, dynamic, integer, weight_only  # noqa: F401

"""Quantizers for the weight-only layers: round-to-nearest statistics and GPTQ."""
from .gptq import HessianAccumulator, gptq_quantize, layer_error
from .rtn import rtn_stats, stats_from_range

__all__ = ["HessianAccumulator", "gptq_quantize", "layer_error", "rtn_stats", "stats_from_range"]

"""The bie op set, defined once: ``torch.ops.bie.*`` custom ops.

Each op is a ``torch.library`` custom op with a fake (meta) implementation
(``torch.compile(fullgraph=True)`` traces through it) and a single router
implementation that asks the bie dispatcher for a kernel. Call them as
``bie_core.ops.binary_gemm(a, b, k, None, None, None)`` (an :class:`OpDef`,
with an optional ``backend=`` keyword) or as ``torch.ops.bie.binary_gemm``.
"""
from ._opdef import Case, OpDef, all_ops, define_op, get_op
from .binary import (binary_bmm, binary_conv2d, binary_conv2d_signs, binary_gemm, binary_linear, conv_out_size,
                     pack_signs, packed_len, sign_embedding, sign_embedding_bag, sign_operand, unpack_signs)
from .integer import (code_range, int_bmm, int_conv2d, int_gemm, lsq_backward, pack_int4, quantize_int,
                      quantize_operand, transpose_2d, unpack_int4)
from .dynamic import dynamic_int8_linear, dynamic_quantize_act

try:  # the weight-only family (GPTQ / GBA / mixed widths)
    from .weight_only import *  # noqa: F401,F403
except ImportError as _e:  # pragma: no cover - only while the module is being written
    if "weight_only" not in str(_e):
        raise

__all__ = ["Case", "OpDef", "all_ops", "define_op", "get_op",
           "pack_signs", "unpack_signs", "binary_gemm", "binary_linear", "binary_bmm", "binary_conv2d",
           "binary_conv2d_signs", "sign_operand", "sign_embedding", "sign_embedding_bag", "packed_len", "conv_out_size",
           "quantize_int", "lsq_backward", "pack_int4", "unpack_int4", "transpose_2d", "int_gemm", "int_bmm", "int_conv2d",
           "quantize_operand", "code_range",
           "dynamic_quantize_act", "dynamic_int8_linear"]

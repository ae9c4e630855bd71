"""The table of defined ops (filled by :func:`bie_core.ops.define_op`), looked up by name.

A leaf module: the registry (which checks that a kernel names a known op), the dispatcher and the op
definitions all read it, and it imports none of them.
"""
from __future__ import annotations

LIB_NAME = "bie"

_OPS: dict = {}


def add_op(op) -> None:
    if op.name in _OPS:
        raise ValueError(f"op {op.name!r} is defined twice")
    _OPS[op.name] = op


def get_op(name: str):
    """The :class:`~bie_core.ops.OpDef` named ``name`` (``"binary_gemm"`` or ``"bie::binary_gemm"``);
    KeyError if no such op is defined."""
    if name.startswith(LIB_NAME + "::"):
        name = name[len(LIB_NAME) + 2:]
    return _OPS[name]


def has_op(name: str) -> bool:
    try:
        get_op(name)
        return True
    except KeyError:
        return False


def all_ops() -> list:
    return list(_OPS.values())

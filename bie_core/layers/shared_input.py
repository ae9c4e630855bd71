"""Fusion of sibling weight-only linears that a model calls with the same input.

A decoder layer calls ``q_proj``, ``k_proj`` and ``v_proj`` on one tensor, and
``gate_proj`` and ``up_proj`` on another. At decode time (one row per sequence)
each of these is a small GEMV whose cost is mostly the fixed cost of a launch
(GPU) or of a host call (eager CPU), not the bytes of its weight. One
``MPQLinear`` whose output columns are the members' columns side by side does
the work of the group in one call.

:func:`fuse_shared_input_linears` builds that layer (registered on the parent as
``fused_<member>_<member>...``) and puts a :class:`SharedInputSlice` where each
member was. The first member called with an input ``x`` runs the fused layer
and keeps ``(x, x._version, y)`` on the group; a later member called with the
*same tensor object at the same version* returns its columns of the kept ``y``.
Any other input (another tensor, or ``x`` written in place since) runs the fused
layer afresh, so a caller that calls the members in another order, calls only
one of them or gives each its own input gets the unfused results, at the cost
of one fused call per member. The kept tensors are dropped as soon as every
member has taken its columns.

An input written in place between the members' calls is seen through its
version counter. Tensors made under ``torch.inference_mode()`` have none, and
under ``torch.compile`` it is not a value the tracer can compare: there the
identity of the input decides alone, so a caller must not write the shared
input in place between the calls of one group's members (decoder layers do
not: they compute the normalized hidden states once and project them).

The reuse is ordinary Python state on a plain object, which
``torch.compile(fullgraph=True)`` traces: within one compiled frame the identity
test is resolved while tracing, the members after the first become slices of
one graph node, and the state at the end of the frame (nothing kept, once the
whole group has run) is written back as a side effect.

``state_dict()`` and ``load_state_dict()`` of a fused model use the members'
own keys and layout (``<parent>.q_proj.qweight``, ...), so checkpoints stay
those of the unfused model; the fused layer contributes no keys.
:func:`unfuse_shared_input_linears` puts separate ``MPQLinear`` layers back
(``save_quantized`` and ``load_quantized`` work on unfused models).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import torch
from torch import nn

from .. import ops
from .weight_only import MPQLinear

#: Hugging Face Llama / Mistral / Qwen style decoder layers: attention projections and the MLP's gate and up
DEFAULT_GROUPS: tuple = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))

_STATE_KEYS = ("bias", "qweight", "scales", "zeros", "g_idx")   # MPQLinear's state_dict order


@dataclass(frozen=True)
class FusedGroup:
    """One fused group: the parent's qualified name, the member attribute
    names, the fused layer's attribute on the parent and its out_features."""
    parent: str
    members: tuple
    fused: str
    out_features: int


class _SharedState:
    """What the members of one group share: the fused layer and the input and
    output of its latest call, while some member has not taken its columns."""

    def __init__(self, fused: MPQLinear, n_members: int):
        self.fused = fused
        self.complete = (1 << n_members) - 1
        self.kept = None      # (x, x._version, y, bit mask of the members that took their columns)


class FusedMPQLinear(MPQLinear):
    """The fused layer of a group. Its tensors are the members' tensors side by
    side; they are saved and loaded under the members' keys (see
    :class:`SharedInputSlice`), so this layer itself has no state_dict entries."""

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        pass

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        pass


class SharedInputSlice(nn.Module):
    """Stands where a member of a fused group was: returns its columns
    ``[start, stop)`` of the group's fused layer applied to its input (the
    fused call is made once per input tensor and version for the whole group;
    see the module doc)."""

    def __init__(self, state: _SharedState, index: int, start: int, stop: int, has_bias: bool, name: str):
        super().__init__()
        self.__dict__["_shared"] = state    # not a child: the fused layer is registered on the parent once
        self.in_features = state.fused.in_features
        self.out_features = stop - start
        self.index, self.start, self.stop, self.has_bias, self.member_name = index, start, stop, has_bias, name

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"columns=[{self.start}, {self.stop}) of the group's fused layer")

    @property
    def fused(self) -> MPQLinear:
        return self.__dict__["_shared"].fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        st = self.__dict__["_shared"]
        # identity and version counter decide; an inference tensor has no version counter and under
        # torch.compile it is a data-dependent value the tracer cannot compare: identity alone there
        ver = None if torch.compiler.is_compiling() or x.is_inference() else x._version
        bit = 1 << self.index
        kept = st.kept
        if kept is not None and kept[0] is x and kept[1] == ver:
            y, taken = kept[2], kept[3] | bit
        else:
            y, taken = st.fused(x), bit
        # once every member has its columns nothing is kept (no reference outlives the group's calls)
        st.kept = None if taken == st.complete else (x, ver, y, taken)
        return y[..., self.start:self.stop]

    # ------------------------------------------------ the member's own layout
    def member_state(self, keep_vars: bool = False) -> dict:
        """This member's tensors as a separate ``MPQLinear`` holds them (fresh tensors)."""
        f = self.fused
        cols = slice(self.start, self.stop)
        out = {}
        if self.has_bias:
            b = f.bias[cols]
            out["bias"] = b if keep_vars else b.detach().clone()
        out["qweight"] = f.qweight[:, cols].clone()
        out["scales"] = f.scales[:, cols].clone()
        if f.format == "gptq":
            z = ops.wq_unpack(f.zeros, f.bits, f.out_features, 1, backend=f.backend)[:, cols]
            out["zeros"] = ops.wq_pack(z.contiguous(), f.bits, 1, backend=f.backend)
        else:
            out["zeros"] = f.zeros[:, cols].clone()
        out["g_idx"] = f.g_idx.clone()
        return out

    def to_linear(self) -> MPQLinear:
        """A separate ``MPQLinear`` equal to this member."""
        f = self.fused
        layer = MPQLinear(self.in_features, self.out_features, bits=f.bits, group_size=f.group_size, sym=f.sym,
                          act_order=f.act_order, bias=self.has_bias, dtype=f.dtype, format=f.format,
                          device=f.qweight.device, backend=f.backend)
        layer.load_state_dict(self.member_state())
        return layer

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for k, v in self.member_state(keep_vars).items():
            destination[prefix + k] = v

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # an MPQLinear of the member's shape checks and takes the incoming tensors (all or nothing, with its
        # messages); what it then holds is written into the member's columns of the fused layer
        tmp = self.to_linear()
        before = len(error_msgs)
        tmp._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                  error_msgs)
        if len(error_msgs) > before:
            return
        f = self.fused
        where = f"{self.member_name} (fused into {type(f).__name__}, columns [{self.start}, {self.stop}))"
        if tmp.format != f.format:
            error_msgs.append(f"{where}: {prefix}zeros is in the {tmp.format!r} format but the fused layer holds "
                              f"{f.format!r} zeros; load into the unfused model (unfuse_shared_input_linears)")
            return
        if not torch.equal(tmp.g_idx.to(torch.long), f.g_idx.to(torch.long)):
            error_msgs.append(f"{where}: {prefix}g_idx differs from the other members' (a fused group shares one "
                              "row order); load into the unfused model (unfuse_shared_input_linears)")
            return
        cols = slice(self.start, self.stop)
        with torch.no_grad():
            f.qweight[:, cols] = tmp.qweight
            f.scales[:, cols] = tmp.scales
            if f.format == "gptq":
                z = ops.wq_unpack(f.zeros, f.bits, f.out_features, 1, backend=f.backend)
                z[:, cols] = ops.wq_unpack(tmp.zeros, f.bits, self.out_features, 1, backend=f.backend)
                f.zeros.copy_(ops.wq_pack(z, f.bits, 1, backend=f.backend))
            else:
                f.zeros[:, cols] = tmp.zeros
            if self.has_bias:
                f.bias[cols] = tmp.bias
        f._drop_lean()
        self.__dict__["_shared"].kept = None


# ------------------------------------------------------------------ building
def _why_not(members: dict) -> Optional[str]:
    """Why these members cannot share one fused layer (None when they can)."""
    for name, m in members.items():
        if isinstance(m, SharedInputSlice):
            return f"{name} is already part of a fused group"
        if type(m) is not MPQLinear:
            return (f"{name} is a {type(m).__name__}, not an MPQLinear (only bie GPTQ/GBA weight-only layers are "
                    "fused; adapters and other wrappers are not)")
        if m.trainable:
            return f"{name} is trainable (fusion is for inference; set trainable=False)"
    first_name, first = next(iter(members.items()))
    for name, m in list(members.items())[1:]:
        for attr in ("in_features", "bits", "group_size", "format", "dtype", "backend", "act_order"):
            a, b = getattr(first, attr), getattr(m, attr)
            if a != b:
                return f"{attr} differs: {first_name} has {a!r}, {name} has {b!r}"
        if m.qweight.device != first.qweight.device:
            return f"device differs: {first_name} is on {first.qweight.device}, {name} on {m.qweight.device}"
        if not torch.equal(m.g_idx.to(torch.long), first.g_idx.to(torch.long)):
            return f"g_idx (act-order row groups) differs between {first_name} and {name}"
    return None


def _fuse(members: Sequence[MPQLinear]) -> FusedMPQLinear:
    first = members[0]
    n = sum(m.out_features for m in members)
    has_bias = any(m.bias is not None for m in members)
    f = FusedMPQLinear(first.in_features, n, bits=first.bits, group_size=first.group_size,
                        sym=all(m.sym for m in members), act_order=first.act_order, bias=has_bias, dtype=first.dtype,
                        format=first.format, device=first.qweight.device, backend=first.backend)
    with torch.no_grad():
        f.qweight.copy_(torch.cat([m.qweight for m in members], 1))
        f.scales.copy_(torch.cat([m.scales for m in members], 1))
        if first.format == "gptq":
            z = torch.cat([ops.wq_unpack(m.zeros, m.bits, m.out_features, 1, backend=m.backend) for m in members], 1)
            f.zeros.copy_(ops.wq_pack(z, first.bits, 1, backend=first.backend))
        else:
            f.zeros.copy_(torch.cat([m.zeros for m in members], 1))
        f.g_idx.copy_(first.g_idx)
        if has_bias:
            f.bias.copy_(torch.cat([m.bias.detach() if m.bias is not None else
                                    torch.zeros(m.out_features, dtype=f.dtype, device=f.bias.device)
                                    for m in members]))
            f.bias.requires_grad_(False)   # a copy made for inference: training it would not reach the members
    f.act_order = first.act_order
    f.train(first.training)
    return f


def _fused_attr(members: Sequence[str]) -> str:
    return "fused_" + "_".join(members)


def fuse_shared_input_linears(model: nn.Module, groups: Optional[Iterable[Sequence[str]]] = None) -> list:
    """Fuse sibling ``MPQLinear`` layers that ``model`` calls with the same input
    into one call (inference; see ``docs/weight-only.md``).

    Args:
        model: the model, modified in place.
        groups: tuples of attribute names of sibling layers, e.g.
            ``[("q_proj", "k_proj", "v_proj")]``; every module that has all the
            names of a tuple as children gets that group fused. Default
            :data:`DEFAULT_GROUPS` (Llama / Mistral / Qwen style
            ``q_proj, k_proj, v_proj`` and ``gate_proj, up_proj``).

    Each group becomes one ``MPQLinear`` on the parent (``fused_q_proj_k_proj_v_proj``)
    whose output is the members' outputs side by side; each member is replaced
    by a :class:`SharedInputSlice` returning its columns. The members must agree
    on in_features, bits, group_size, format, dtype, backend, device and g_idx,
    and be frozen plain ``MPQLinear`` layers; a member without bias in a group
    where another has one gets zeros. Outputs are those of the unfused model
    (bit for bit where the kernel's columns do not depend on N), whatever the
    order or inputs the members are called with.

    Returns:
        list of :class:`FusedGroup`, one per fused group (a model without any
        module holding a group's names simply has none of it).

    Raises:
        ValueError naming the parent and the reason, for a group that exists in
        the model but cannot be fused; nothing is modified then.
    """
    given = groups is not None
    groups = [tuple(g) for g in (DEFAULT_GROUPS if groups is None else groups)]
    for g in groups:
        if len(g) < 2 or len(set(g)) != len(g) or not all(isinstance(a, str) and a and "." not in a for a in g):
            raise ValueError(f"fuse_shared_input_linears: each group is a tuple of two or more distinct attribute "
                             f"names of sibling modules (no dots), got {g!r}")
    plan = []
    claimed = {}
    for pname, parent in model.named_modules():
        for g in groups:
            if not all(a in parent._modules and parent._modules[a] is not None for a in g):
                continue
            where = pname or type(model).__name__
            for a in g:
                if (pname, a) in claimed:
                    raise ValueError(f"fuse_shared_input_linears: {where}.{a} is in two groups, {claimed[pname, a]} "
                                     f"and {g}")
                claimed[pname, a] = g
            members = {a: parent._modules[a] for a in g}
            why = _why_not(members)
            if why is not None:
                hint = "" if given else " (pass groups= to choose the groups to fuse)"
                raise ValueError(f"fuse_shared_input_linears: cannot fuse {where}.{{{', '.join(g)}}}: {why}{hint}")
            if _fused_attr(g) in parent._modules or hasattr(parent, _fused_attr(g)):
                raise ValueError(f"fuse_shared_input_linears: {where} already has an attribute {_fused_attr(g)!r}")
            plan.append((pname, parent, g))
    report = []
    for pname, parent, g in plan:
        layers = [parent._modules[a] for a in g]
        fused = _fuse(layers)
        state = _SharedState(fused, len(g))
        parent.add_module(_fused_attr(g), fused)
        start = 0
        for i, (a, m) in enumerate(zip(g, layers)):
            stop = start + m.out_features
            s = SharedInputSlice(state, i, start, stop, m.bias is not None, f"{pname}.{a}" if pname else a)
            s.train(m.training)
            parent._modules[a] = s      # same place in the parent's order (state_dict keys keep theirs)
            start = stop
        report.append(FusedGroup(pname, g, _fused_attr(g), fused.out_features))
    return report


def require_unfused(model: nn.Module, what: str) -> None:
    """Raise for a model with fused groups, naming one: exporters that walk the
    ``MPQLinear`` layers (``save_quantized``, ``save_pretrained``, dequantizing)
    would see the fused layer instead of the members."""
    for name, m in model.named_modules():
        if isinstance(m, SharedInputSlice):
            raise ValueError(f"{what}: {name or type(model).__name__} is a member of a fused group "
                             "(fuse_shared_input_linears); call bie_core.unfuse_shared_input_linears(model) first")


def unfuse_shared_input_linears(model: nn.Module) -> list:
    """Undo :func:`fuse_shared_input_linears`: every :class:`SharedInputSlice`
    becomes a separate ``MPQLinear`` again and the fused layers are removed.
    Returns the qualified names of the restored layers."""
    restored = []
    for pname, parent in list(model.named_modules()):
        fused_of = {}
        for a, m in list(parent._modules.items()):
            if isinstance(m, SharedInputSlice):
                parent._modules[a] = m.to_linear()
                fused_of[id(m.fused)] = m.fused
                restored.append(f"{pname}.{a}" if pname else a)
        for a, m in list(parent._modules.items()):
            if isinstance(m, FusedMPQLinear) and id(m) in fused_of:
                del parent._modules[a]
    return restored

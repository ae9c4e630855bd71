"""Optimizers for bie layers: DiodeMix (sign descent with hysteresis for binary
weights, AdamW for the rest, optional GaLore) and the GaLore projector."""
from .diode import DiodeMix
from .galore import GaLoreProjector

__all__ = ["DiodeMix", "GaLoreProjector"]

# packed weight-only layers (MPQLinear / MBWQLinear): the optimizer hook and a standalone Adam
from .packed import PackedAdam, packed_parameters  # noqa: E402

__all__ += ["PackedAdam", "packed_parameters"]

"""The light object an entry point of the ``bie.backends`` group resolves to.

Resolving the entry point must be cheap: the module that defines the
descriptor imports nothing heavy (no CUDA extension, no MLX, no compiler).
Heavy work happens in ``load()``, which bie calls only when kernels are
first needed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence


@dataclass
class BackendDescriptor:
    """Describes one backend plugin.

    name
        The name users select it by (``set_backend(name)``, ``BIE_BACKEND``).
    api_version
        ``"MAJOR.MINOR"`` of the bie plugin API the backend was written for.
    device_types
        Torch device types its kernels serve (``("cuda",)``); ``("*",)`` for
        a backend written in device-agnostic PyTorch.
    probe
        Cheap check that the backend can run here. Returns ``None`` when it
        can, or a short reason (``"no CUDA device"``) when it cannot. It may
        raise; that is recorded as a broken backend.
    load
        Does the heavy imports and returns the plugin object: anything that
        carries pluggy hook implementations (a module or an instance), most
        importantly ``bie_register_kernels(registry)``.
    install_hint
        What a user should install or do to get this backend working.
    """

    name: str
    api_version: str
    device_types: Sequence[str]
    load: Callable[[], object]
    probe: Optional[Callable[[], Optional[str]]] = None
    description: str = ""
    install_hint: str = ""
    distribution: Optional[str] = None
    version: Optional[str] = None
    extra: dict = field(default_factory=dict)

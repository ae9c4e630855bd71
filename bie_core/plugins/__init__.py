"""The backend plugin interface: descriptors, pluggy hooks, discovery and the registry."""
from .descriptor import BackendDescriptor
from .hookspecs import hookimpl, hookspec
from .registry import BackendRecord, KernelRegistrar, get_registry

__all__ = ["BackendDescriptor", "hookimpl", "hookspec", "BackendRecord", "KernelRegistrar", "get_registry"]

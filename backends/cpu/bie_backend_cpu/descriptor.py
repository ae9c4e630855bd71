"""Entry point of bie-backend-cpu: a light descriptor (imports nothing heavy)."""
from bie_core.backend_api import BackendDescriptor, plugin_loader

from . import __version__



backend = BackendDescriptor(
    name="cpu",
    api_version="1.0",
    device_types=("*",),
    load=plugin_loader(__package__ + ".plugin"),
    probe=None,  # plain PyTorch runs wherever torch does
    description="reference: every op in plain PyTorch (serves any device at the lowest priority)",
    install_hint="pip install bie-backend-cpu",
    distribution="bie-backend-cpu",
    version=__version__,
)

"""The entry point resolves to this object. Keep this module light: bie imports
it at discovery time, so heavy imports (native extensions, vendor SDKs) belong
in the module that ``load`` imports (``plugin_loader`` imports it on first use)."""
from bie_core.backend_api import BackendDescriptor, plugin_loader

from . import __version__


def _probe():
    # Return None when the backend can run here, or a short reason when it
    # cannot ("no CUDA device", "mlx is not installed"). Keep it cheap.
    return None


backend = BackendDescriptor(
    name="example",
    api_version="1.0",                 # the bie plugin API this backend was written for
    device_types=("cpu",),
    probe=_probe,
    load=plugin_loader(__package__ + ".kernels"),
    description="example backend: binary GEMM by XOR + byte popcount table",
    install_hint="pip install bie-backend-example",
    distribution="bie-backend-example",
    version=__version__,
)

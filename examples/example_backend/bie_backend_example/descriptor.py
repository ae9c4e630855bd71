"""The entry point resolves to this object. Keep this module light: bie imports
it at discovery time, so heavy imports (native extensions, vendor SDKs) belong
in ``load()``."""
from bie_core.plugins import BackendDescriptor

from . import __version__


def _probe():
    # Return None when the backend can run here, or a short reason when it
    # cannot ("no CUDA device", "mlx is not installed"). Keep it cheap.
    return None


def _load():
    from . import kernels  # the heavy part (here: nothing heavy)
    return kernels


backend = BackendDescriptor(
    name="example",
    api_version="1.0",                 # the bie plugin API this backend was written for
    device_types=("cpu",),
    probe=_probe,
    load=_load,
    description="example backend: binary GEMM by XOR + byte popcount table",
    install_hint="pip install bie-backend-example",
    distribution="bie-backend-example",
    version=__version__,
)

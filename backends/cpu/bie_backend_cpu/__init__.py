"""bie-backend-cpu: the reference backend.

``bie_backend_cpu.reference`` is the executable definition of every bie op in
plain PyTorch; being device-agnostic PyTorch it also serves any other device,
at the lowest priority (automatic selection warns when it does).
"""
__version__ = "0.1.0"

"""bie-backend-example: a minimal, complete bie backend (see docs/writing-a-backend.md)."""
__version__ = "0.1.0"

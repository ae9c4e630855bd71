"""Exceptions and warnings raised by bie.

Every error a user can trigger is a Python exception with a message that names
what was wrong and what is allowed; nothing in bie exits the process.
"""
from __future__ import annotations


class BieError(Exception):
    """Base class of every bie exception."""


class UnknownBackendError(BieError, ValueError):
    """A backend name that no installed plugin provides."""


class BackendUnavailableError(BieError, RuntimeError):
    """An explicitly requested backend is installed but cannot be used here
    (broken import, incompatible API version, no device). The original
    exception, if any, is chained as ``__cause__``."""


class NoKernelError(BieError, RuntimeError):
    """No kernel can serve a call. The message lists every kernel that was
    considered and why it was rejected."""

    def __init__(self, message: str, rejections=()):
        super().__init__(message)
        self.rejections = list(rejections)


class PluginValidationError(BieError, TypeError):
    """A plugin declared something inconsistent (bad kernel spec, unknown op)."""


class BieFallbackWarning(UserWarning):
    """Automatic selection fell back to a slower kernel (emitted once per op and reason)."""

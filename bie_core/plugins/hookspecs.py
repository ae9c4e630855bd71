"""Hook specifications a backend plugin implements (validated by pluggy).

pluggy checks at registration that each ``@hookimpl`` names only arguments
that the spec below declares, so a typo in a plugin is reported as a broken
backend with that message instead of failing later.
"""
from __future__ import annotations

import pluggy

PROJECT = "bie"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class BackendHooks:
    @hookspec
    def bie_register_kernels(self, registry):
        """Register every kernel of this backend.

        ``registry`` is a :class:`bie_core.plugins.KernelRegistrar` bound to
        the backend; call ``registry.register(op, fn, capability=..., priority=...)``.
        """

    @hookspec
    def bie_build(self, verbose):
        """Build native code ahead of time (``bie build NAME``). Return a
        short status string, or raise with a clear message."""

    @hookspec
    def bie_report(self):
        """Return extra lines for ``bie backends`` (native build state, tuning
        cache, device names...)."""

"""Backend discovery, isolated loading, and the table of registered kernels.

Discovery is lazy (first dispatch, ``backends()``, ``explain``) and cached.
Every step that runs plugin code (resolving the entry point, checking the API
version, ``probe()``, ``load()``, pluggy registration, kernel registration) is
wrapped: a failure is recorded on that backend's :class:`BackendRecord` with
the original exception and traceback, and never breaks ``import bie_core`` or
the other backends. The failure is raised only when the backend is requested
explicitly.

Environment controls (read at discovery):

``BIE_DISABLE_PLUGIN_AUTOLOAD=1``
    Do not load entry points at all; only backends registered in code with
    :func:`bie_core.register_backend` exist.
``BIE_PLUGINS=cpu,cuda``
    Allow-list of entry-point names; the others are listed as ``disabled``.
"""
from __future__ import annotations

import importlib.metadata as importlib_metadata
import os
import threading
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional

import pluggy

from ..errors import PluginValidationError
from ..kernels import Capability, Kernel
from ..optable import get_op
from ..version import API_VERSION
from .descriptor import BackendDescriptor
from .hookspecs import PROJECT, BackendHooks

ENTRY_POINT_GROUP = "bie.backends"

# A plugin that raises anything -- any BaseException, sys.exit included -- is
# recorded as broken. A KeyboardInterrupt (a real Ctrl-C during a slow import,
# or a plugin raising one) is delivered once, after discovery has finished, so
# that the interrupt is not lost and later calls do not meet it again.
# os._exit and fatal signals end the process before Python can intervene: no
# in-process isolation can contain them.
_ISOLATED = (BaseException,)

LOADED = "loaded"
UNAVAILABLE = "unavailable"      # installed and sound, but cannot run on this machine
BROKEN = "broken"                # raised while importing, probing, loading or registering
INCOMPATIBLE = "incompatible"    # written for another major version of the plugin API
DISABLED = "disabled"            # excluded by BIE_PLUGINS


@dataclass
class BackendRecord:
    """What bie knows about one backend (``bie_core.backends()`` lists these)."""

    name: str
    distribution: Optional[str] = None
    version: Optional[str] = None
    api_version: Optional[str] = None
    status: str = "discovered"
    cause: Optional[str] = None
    traceback: Optional[str] = None
    exception: Optional[BaseException] = None
    devices: tuple = ()
    kernels: list = field(default_factory=list)
    description: str = ""
    install_hint: str = ""
    plugin: object = None
    descriptor: Optional[BackendDescriptor] = None
    entry_point: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.status == LOADED

    def summary(self) -> str:
        s = f"{self.name} [{self.status}]"
        if self.cause:
            s += f": {self.cause}"
        return s

    def __repr__(self) -> str:
        return (f"BackendRecord(name={self.name!r}, status={self.status!r}, distribution={self.distribution!r}, "
                f"version={self.version!r}, devices={self.devices!r}, kernels={len(self.kernels)}"
                + (f", cause={self.cause!r}" if self.cause else "") + ")")

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "api_version": self.api_version,
            "status": self.status,
            "cause": self.cause,
            "devices": list(self.devices),
            "kernels": [k.qualname + " -> " + k.op for k in self.kernels],
        }


class KernelRegistrar:
    """Handed to a backend's ``bie_register_kernels``; binds kernels to it."""

    def __init__(self, registry: "Registry", backend: str):
        self._registry = registry
        self.backend = backend
        self.kernels: list[Kernel] = []

    def register(self, op: str, fn: Callable, *, capability: Capability | None = None,
                 priority: int = 0, name: str = "", prepare: Callable | None = None,
                 unprepare: Callable | None = None, description: str = "",
                 reference: bool = False, prepare_static=(), bind: Callable | None = None) -> Kernel:
        try:
            get_op(op)
        except KeyError:
            raise PluginValidationError(
                f"backend {self.backend!r} registers a kernel for unknown op {op!r}") from None
        if not callable(fn):
            raise PluginValidationError(f"backend {self.backend!r}: kernel for {op!r} is not callable")
        unknown = [n for n in prepare_static if n not in get_op(op).arg_names]
        if unknown:
            raise PluginValidationError(f"backend {self.backend!r}: prepare_static names {unknown} "
                                        f"that are not arguments of {op} {get_op(op).arg_names}")
        k = Kernel(backend=self.backend, op=op, fn=fn, capability=capability or Capability(),
                   priority=int(priority), name=name, prepare=prepare, unprepare=unprepare,
                   description=description, reference=reference, prepare_static=tuple(prepare_static),
                   bind=bind)
        self.kernels.append(k)
        return k

    def kernel(self, op: str, **kw):
        """Decorator form of :meth:`register`."""
        def deco(fn):
            self.register(op, fn, **kw)
            return fn
        return deco


def _format_exc(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _short(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}".rstrip(": ")


def _parse_api(v: str) -> tuple[int, int]:
    parts = str(v).split(".")
    return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0


class Registry:
    """Backends and their kernels. One process-wide instance (:func:`get_registry`)."""

    def __init__(self):
        self._lock = threading.RLock()
        self._records: dict[str, BackendRecord] = {}
        self._manual: list[tuple[BackendDescriptor, Optional[object]]] = []
        self._discovered = False
        self._kernels: dict[str, list[Kernel]] = {}
        self._pm = pluggy.PluginManager(PROJECT)
        self._pm.add_hookspecs(BackendHooks)
        self._interrupt: Optional[BaseException] = None  # a KeyboardInterrupt to deliver after discovery
        self.generation = 0  # bumped whenever the kernel table changes; dispatch caches key on it

    # ---------------------------------------------------------------- discovery
    def ensure_discovered(self) -> None:
        if self._discovered:
            return
        with self._lock:
            if self._discovered:
                return
            self._discover()
            self._discovered = True
            self.generation += 1
            self._deliver_interrupt()

    def _deliver_interrupt(self) -> None:
        exc, self._interrupt = self._interrupt, None
        if exc is not None:
            raise KeyboardInterrupt(f"interrupted while loading a bie backend ({exc!r}); that backend is "
                                    "recorded as broken (bie backends -v)") from exc

    def _discover(self) -> None:
        if os.environ.get("BIE_DISABLE_PLUGIN_AUTOLOAD", "").strip() not in ("", "0", "false", "False"):
            eps = []
        else:
            eps = list(importlib_metadata.entry_points(group=ENTRY_POINT_GROUP))
        allow = os.environ.get("BIE_PLUGINS", "").strip()
        allowed = {a.strip() for a in allow.split(",") if a.strip()} if allow else None
        seen = set()
        for ep in eps:
            dist = getattr(ep, "dist", None)
            dist_name = dist.metadata["Name"] if dist is not None else None
            key = (ep.name, (dist_name or "").lower().replace("_", "-"))
            if key in seen:  # the same distribution visible twice on sys.path
                continue
            seen.add(key)
            rec = BackendRecord(name=ep.name, distribution=dist_name,
                                version=dist.version if dist is not None else None,
                                entry_point=ep.value)
            if ep.name in self._records and self._records[ep.name].status == LOADED:
                # two distributions claim the same name: keep the first, record the clash
                warnings.warn(f"bie: two plugins are named {ep.name!r}; keeping "
                              f"{self._records[ep.name].distribution}, ignoring {dist_name}")
                continue
            self._records[ep.name] = rec
            if allowed is not None and ep.name not in allowed:
                rec.status = DISABLED
                rec.cause = f"not in BIE_PLUGINS={allow!r}"
                continue
            try:
                desc = ep.load()
                if callable(desc) and not isinstance(desc, BackendDescriptor):
                    desc = desc()
                if not isinstance(desc, BackendDescriptor):
                    raise PluginValidationError(
                        f"entry point {ep.name} = {ep.value} resolved to {type(desc).__name__}, "
                        "expected a bie_core.plugins.BackendDescriptor")
                if desc.name != ep.name:
                    raise PluginValidationError(
                        f"entry point is named {ep.name!r} but its descriptor says {desc.name!r}")
            except _ISOLATED as exc:  # isolation is the point: record, never crash
                self._fail(rec, BROKEN, exc, "import failed")
                continue
            self._load(desc, rec)
        for desc, plugin in self._manual:
            self._register_manual(desc, plugin)

    def _fail(self, rec: BackendRecord, status: str, exc: BaseException | None, what: str,
              cause: str | None = None) -> None:
        rec.status = status
        rec.exception = exc
        if isinstance(exc, KeyboardInterrupt):
            self._interrupt = exc
        if exc is not None:
            rec.traceback = _format_exc(exc)
            rec.cause = f"{what}: {_short(exc)}"
        else:
            rec.cause = cause or what
        for k in rec.kernels:
            self._drop_kernel(k)
        rec.kernels = []

    def _load(self, desc: BackendDescriptor, rec: BackendRecord, plugin: object | None = None) -> None:
        rec.descriptor = desc
        rec.api_version = str(desc.api_version)
        rec.devices = tuple(desc.device_types)
        rec.description = desc.description
        rec.install_hint = desc.install_hint
        rec.distribution = rec.distribution or desc.distribution
        rec.version = rec.version or desc.version
        try:
            major, minor = _parse_api(desc.api_version)
        except (TypeError, ValueError) as exc:
            self._fail(rec, INCOMPATIBLE, exc, f"unreadable api_version {desc.api_version!r}")
            return
        if major != API_VERSION[0]:
            self._fail(rec, INCOMPATIBLE, None,
                       f"plugin API {major}.{minor}, but this bie-core speaks "
                       f"{API_VERSION[0]}.{API_VERSION[1]} (major versions must match); "
                       f"install a {rec.distribution or desc.name} release built for bie-core "
                       f"{API_VERSION[0]}.x")
            return
        if minor > API_VERSION[1]:
            warnings.warn(f"bie: backend {desc.name!r} was written for plugin API {major}.{minor}, "
                          f"newer than this bie-core's {API_VERSION[0]}.{API_VERSION[1]}; "
                          "upgrade bie-core if something is missing")
        try:
            reason = desc.probe() if desc.probe is not None else None
        except _ISOLATED as exc:
            self._fail(rec, BROKEN, exc, "probe failed")
            return
        if reason:
            self._fail(rec, UNAVAILABLE, None, str(reason))
            return
        try:
            if plugin is None:
                plugin = desc.load()
            if self._pm.is_registered(plugin):
                raise PluginValidationError("the same plugin object is registered twice")
            self._pm.register(plugin, name=f"bie-backend:{desc.name}")
        except _ISOLATED as exc:
            self._fail(rec, BROKEN, exc, "load failed")
            return
        rec.plugin = plugin
        registrar = KernelRegistrar(self, desc.name)
        try:
            caller = self._pm.subset_hook_caller(
                "bie_register_kernels",
                remove_plugins=[p for p in self._pm.get_plugins() if p is not plugin])
            caller(registry=registrar)
        except _ISOLATED as exc:
            self._pm.unregister(plugin)
            rec.plugin = None
            self._fail(rec, BROKEN, exc, "kernel registration failed")
            return
        rec.kernels = list(registrar.kernels)
        for k in rec.kernels:
            self._kernels.setdefault(k.op, []).append(k)
            self._kernels[k.op].sort(key=lambda k: -k.priority)
        rec.status = LOADED
        rec.cause = None

    def _drop_kernel(self, k: Kernel) -> None:
        lst = self._kernels.get(k.op)
        if lst and k in lst:
            lst.remove(k)

    # ----------------------------------------------------------------- manual
    def register_backend(self, desc: BackendDescriptor, plugin: object | None = None) -> BackendRecord:
        """Register a backend from code (no packaging). Replaces one of the same name."""
        with self._lock:
            self._manual = [(d, p) for d, p in self._manual if d.name != desc.name]
            self._manual.append((desc, plugin))
            if self._discovered:
                self._register_manual(desc, plugin)
                self.generation += 1
                self._deliver_interrupt()
            return self._records.get(desc.name)

    def _register_manual(self, desc: BackendDescriptor, plugin: object | None) -> None:
        old = self._records.get(desc.name)
        if old is not None:
            self._unload(old)
        rec = BackendRecord(name=desc.name, distribution=desc.distribution, version=desc.version)
        self._records[desc.name] = rec
        self._load(desc, rec, plugin)

    def unregister_backend(self, name: str) -> None:
        with self._lock:
            self._manual = [(d, p) for d, p in self._manual if d.name != name]
            rec = self._records.pop(name, None)
            if rec is not None:
                self._unload(rec)
            self.generation += 1

    def _unload(self, rec: BackendRecord) -> None:
        for k in rec.kernels:
            self._drop_kernel(k)
        rec.kernels = []
        if rec.plugin is not None and self._pm.is_registered(rec.plugin):
            self._pm.unregister(rec.plugin)

    def reset(self) -> None:
        """Forget everything discovered (the next use discovers again).
        Backends registered in code stay registered."""
        with self._lock:
            for rec in self._records.values():
                self._unload(rec)
            self._records.clear()
            self._kernels.clear()
            self._discovered = False
            self.generation += 1

    # ---------------------------------------------------------------- queries
    def records(self) -> list[BackendRecord]:
        self.ensure_discovered()
        return list(self._records.values())

    def record(self, name: str) -> Optional[BackendRecord]:
        self.ensure_discovered()
        return self._records.get(name)

    def names(self) -> list[str]:
        self.ensure_discovered()
        return list(self._records)

    def kernels(self, op: str) -> list[Kernel]:
        """Kernels of ``op`` from loaded backends, highest priority first."""
        self.ensure_discovered()
        return self._kernels.get(op, [])

    def reference_kernel(self, op: str) -> Optional[Kernel]:
        for k in self.kernels(op):
            if k.reference:
                return k
        return None

    def call_hook(self, name: str, backend: str, **kwargs):
        rec = self.record(backend)
        if rec is None or rec.plugin is None:
            return []
        caller = self._pm.subset_hook_caller(
            name, remove_plugins=[p for p in self._pm.get_plugins() if p is not rec.plugin])
        return caller(**kwargs)


_REGISTRY = Registry()


def get_registry() -> Registry:
    return _REGISTRY

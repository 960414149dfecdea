"""Finding, loading and listing plugins: pluggy hooks fed by the `twinkle` entry-point group.

Plugins load lazily, once per process, on first need. Core's own built-ins are an ordinary
entry point (`core = twinkle_core.builtins`), registered through the same hooks as any
third-party plugin. A plugin that fails to import, or that needs another twinkle-core, is
recorded with its error; it breaks nothing unless something it would provide is asked for.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import os
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pluggy
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from . import hookspecs
from .errors import DuplicatePluginError, PluginLoadError, PluginNotFoundError
from .install_hints import install_hint, providing_sentence

ENTRY_POINT_GROUP = "twinkle"
CORE_DISTRIBUTION = "twinkle-core"
CORE_PLUGIN_NAME = "core"
CORE_PLUGIN_MODULE = "twinkle_core.builtins"
KINDS = ("backends", "dispatchers", "collectors", "platforms", "notifiers", "transports")

_SINGULAR = {
    "backends": "backend",
    "dispatchers": "dispatcher",
    "collectors": "collector",
    "platforms": "platform",
    "notifiers": "notifier",
    "transports": "transport",
}


@dataclass
class Registration:
    """One name registered by one plugin; `target` is the object or a `"module:attr"` string."""

    kind: str
    name: str
    target: Any
    plugin: str
    override: bool = False
    _loaded: Any = field(default=None, repr=False)
    _is_loaded: bool = field(default=False, repr=False)

    def load(self) -> Any:
        if not self._is_loaded:
            if isinstance(self.target, str):
                self._loaded = _import_target(self.target, self)
            else:
                self._loaded = self.target
            self._is_loaded = True
        return self._loaded


@dataclass
class PluginInfo:
    """What `twinkle plugins` shows for one plugin."""

    name: str
    distribution: str | None
    version: str | None
    registers: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})
    error: str | None = None
    exception: BaseException | None = field(default=None, repr=False)
    #: Hook implementations whose name twinkle does not define (a typo, or a newer core's).
    unknown_hooks: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "registers": {k: list(v) for k, v in self.registers.items()},
            "error": self.error,
        }


def _import_target(target: str, reg: Registration) -> Any:
    module_name, _, attr = target.partition(":")
    try:
        obj = importlib.import_module(module_name)
        for part in attr.split(".") if attr else ():
            obj = getattr(obj, part)
    except Exception as exc:
        raise PluginLoadError(
            f"twinkle {_SINGULAR[reg.kind]} {reg.name!r} from plugin {reg.plugin!r} could not be "
            f"imported from {target!r}: {type(exc).__name__}: {exc}"
        ) from exc
    return obj


def core_version() -> str:
    """The installed twinkle-core version (the source tree's when it is not installed)."""
    try:
        return metadata.version(CORE_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        from . import __version__

        return __version__


def _incompatibility(dist: metadata.Distribution | None) -> str | None:
    """Why `dist` cannot work with this twinkle-core, or None when its declared range fits."""
    if dist is None or canonicalize_name(dist.metadata["Name"] or "") == CORE_DISTRIBUTION:
        return None
    try:
        current = Version(core_version())
    except InvalidVersion:
        return None
    for line in dist.requires or ():
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != CORE_DISTRIBUTION:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if not req.specifier.contains(current, prereleases=True):
            name = dist.metadata["Name"]
            return (
                f"{name} {dist.version} requires twinkle-core{req.specifier}, but twinkle-core "
                f"{current} is installed; install matching versions, e.g. "
                f'pip install -U "{name}" "twinkle-core{req.specifier}"'
            )
    return None


def _selected_entry_points() -> list[metadata.EntryPoint]:
    """Entry points of the `twinkle` group, filtered by the autoload environment variables."""
    eps = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    unique: dict[tuple[str, str], metadata.EntryPoint] = {}
    for ep in eps:
        unique.setdefault((ep.name, ep.value), ep)
    eps = list(unique.values())
    if os.environ.get("TWINKLE_DISABLE_PLUGIN_AUTOLOAD", "").strip() not in ("", "0"):
        return [ep for ep in eps if ep.name == CORE_PLUGIN_NAME]
    wanted = os.environ.get("TWINKLE_PLUGINS", "").strip()
    if wanted:
        names = {n.strip() for n in wanted.split(",") if n.strip()}
        return [ep for ep in eps if ep.name == CORE_PLUGIN_NAME or ep.name in names]
    return eps


class PluginSystem:
    """The process-wide plugin manager and the name registries it fills."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._loaded = False
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}
        self._registrations: dict[str, dict[str, list[Registration]]] = {k: {} for k in KINDS}
        #: Bumped whenever registrations change (`add`), so lookups cached elsewhere (e.g. a
        #: method's resolved dispatcher and collector) know when to look again.
        self.generation = 0

    # ----------------------------------------------------------------- loading
    def ensure_loaded(self) -> PluginSystem:
        if not self._loaded:
            with self._lock:
                if not self._loaded:
                    self._load()
                    self._loaded = True
        return self

    def _load(self) -> None:
        for ep in _selected_entry_points():
            dist = getattr(ep, "dist", None)
            info = PluginInfo(
                name=ep.name,
                distribution=dist.metadata["Name"] if dist is not None else None,
                version=dist.version if dist is not None else None,
            )
            self.infos[ep.name] = info
            problem = _incompatibility(dist)
            if problem:
                info.error = problem
                info.exception = PluginLoadError(problem)
                continue
            try:
                module = ep.load()
                self.pm.register(module, name=ep.name)
            except Exception as exc:
                info.error = f"{type(exc).__name__}: {exc}"
                info.exception = exc
        if self.pm.get_plugin(CORE_PLUGIN_NAME) is None:
            # Running from a source tree where twinkle-core's entry point is not installed.
            module = importlib.import_module(CORE_PLUGIN_MODULE)
            self.pm.register(module, name=CORE_PLUGIN_NAME)
            self.infos[CORE_PLUGIN_NAME] = PluginInfo(
                CORE_PLUGIN_NAME, CORE_DISTRIBUTION, core_version()
            )
        self._check_pending()
        self._run_register_hooks()

    def _check_pending(self) -> None:
        """pluggy's `check_pending()`, for every plugin: an implementation of a hook twinkle
        does not define is recorded on that plugin (shown by `twinkle plugins`), and using the
        plugin then fails loudly instead of the hook silently never being called."""
        try:
            self.pm.check_pending()
            return
        except pluggy.PluginValidationError:
            pass
        for hook_name, caller in vars(self.pm.hook).items():
            if hook_name.startswith("_") or caller.has_spec():
                continue
            for impl in caller.get_hookimpls():
                if impl.optionalhook:
                    continue
                info = self.infos.setdefault(
                    impl.plugin_name, PluginInfo(impl.plugin_name, None, None)
                )
                if hook_name not in info.unknown_hooks:
                    info.unknown_hooks.append(hook_name)
        known = ", ".join(sorted(n for n in dir(hookspecs) if _is_hookspec(n)))
        for info in self.infos.values():
            if info.unknown_hooks:
                problem = (
                    f"implements {', '.join(info.unknown_hooks)}, which twinkle-core "
                    f"{core_version()} does not define (a typo? its hooks are: {known})"
                )
                info.error = f"{info.error}; {problem}" if info.error else problem
                info.exception = info.exception or PluginLoadError(problem)

    def add(self, plugin: object, name: str) -> None:
        """Register a plugin object at run time, as if found through an entry point.

        For tests, notebooks and plugins defined in a driver script: its hooks are checked
        and its `register_*` hooks run at once.
        """
        self.ensure_loaded()
        with self._lock:
            self.pm.register(plugin, name=name)
            self.infos.setdefault(name, PluginInfo(name, None, None))
            self._check_pending()
            for kind in KINDS:
                caller = getattr(self.pm.hook, f"register_{kind}")
                for impl in caller.get_hookimpls():
                    if impl.plugin_name == name:
                        impl.function(register=self._register_callback(kind, name))
            self.generation += 1

    def _run_register_hooks(self) -> None:
        # Each plugin's hook is called on its own so a failing plugin is blamed alone and every
        # name is attributed to the plugin that registered it. Core goes first.
        for kind in KINDS:
            caller = getattr(self.pm.hook, f"register_{kind}")
            impls = sorted(caller.get_hookimpls(), key=lambda i: i.plugin_name != CORE_PLUGIN_NAME)
            for impl in impls:
                info = self.infos.setdefault(
                    impl.plugin_name, PluginInfo(impl.plugin_name, None, None)
                )
                try:
                    impl.function(register=self._register_callback(kind, impl.plugin_name))
                except Exception as exc:
                    info.error = f"register_{kind} failed: {type(exc).__name__}: {exc}"
                    info.exception = exc
        for kind, by_name in self._registrations.items():
            for name, regs in by_name.items():
                conflict = _conflict(kind, name, regs)
                if conflict:
                    for reg in regs:
                        info = self.infos[reg.plugin]
                        info.error = (info.error + "; " if info.error else "") + conflict

    def _register_callback(self, kind: str, plugin: str) -> Callable[..., None]:
        def register(name: str, obj: Any, *, override: bool = False) -> None:
            if not isinstance(name, str) or not name:
                raise ValueError(f"register: name must be a non-empty string, got {name!r}")
            if isinstance(obj, str) and ":" not in obj:
                raise ValueError(
                    f"register({name!r}, {obj!r}): a string target must be 'module:attr'"
                )
            reg = Registration(kind, name, obj, plugin, override)
            self._registrations[kind].setdefault(name, []).append(reg)
            self.infos[plugin].registers[kind].append(name)

        return register

    # ----------------------------------------------------------------- lookups
    def names(self, kind: str) -> list[str]:
        self.ensure_loaded()
        return sorted(self._registrations[kind])

    def registration(self, kind: str, name: str) -> Registration:
        self.ensure_loaded()
        regs = self._registrations[kind].get(name)
        if not regs:
            raise self._not_found(kind, name)
        conflict = _conflict(kind, name, regs)
        if conflict:
            raise DuplicatePluginError(conflict)
        overrides = [r for r in regs if r.override]
        chosen = overrides[0] if overrides else regs[0]
        info = self.infos.get(chosen.plugin)
        if info is not None and info.unknown_hooks:
            raise PluginLoadError(
                f"the {_SINGULAR[kind]} {name!r} comes from plugin {info.name!r}, which "
                f"{info.error}; fix the hook name(s) in that plugin"
            )
        return chosen

    def get(self, kind: str, name: str) -> Any:
        """The object registered as `name` for `kind`, imported on first use."""
        return self.registration(kind, name).load()

    def registrations(self, kind: str, name: str) -> list[Registration]:
        """Every registration of `name` for `kind`, overrides first, then in hook order."""
        self.ensure_loaded()
        regs = self._registrations[kind].get(name) or []
        return [r for r in regs if r.override] + [r for r in regs if not r.override]

    def _not_found(self, kind: str, name: str) -> PluginNotFoundError:
        installed = ", ".join(self.names(kind)) or "none"
        msg = f"no twinkle {_SINGULAR[kind]} named {name!r} is installed (installed: {installed})."
        hint = providing_sentence(kind, name)
        if hint:
            msg += f" {hint}"
        else:
            msg += (
                f" Install the plugin distribution that provides it, or register it with a "
                f"register_{kind} hook; `twinkle plugins` lists what is loaded."
            )
        culprit = self._failed_plugin_for(kind, name)
        if culprit is not None:
            msg += f" Plugin {culprit.name!r} failed to load: {culprit.error}"
        error = PluginNotFoundError(msg)
        if culprit is not None:
            error.__cause__ = culprit.exception
        return error

    def _failed_plugin_for(self, kind: str, name: str) -> PluginInfo | None:
        hint = install_hint(kind, name)
        providers = {canonicalize_name(p) for p in hint[1]} if hint else set()
        for info in self.infos.values():
            if info.error is None:
                continue
            dist = canonicalize_name(info.distribution) if info.distribution else None
            if info.name == name or dist in providers or name in info.name:
                return info
        return None

    def plugins(self) -> list[PluginInfo]:
        """Every plugin found, loaded or not, core first."""
        self.ensure_loaded()
        return sorted(self.infos.values(), key=lambda i: (i.name != CORE_PLUGIN_NAME, i.name))

    @property
    def hook(self) -> Any:
        return self.ensure_loaded().pm.hook


def _conflict(kind: str, name: str, regs: list[Registration]) -> str | None:
    plain = [r for r in regs if not r.override]
    overrides = [r for r in regs if r.override]
    clash = overrides if len(overrides) > 1 else plain if len(plain) > 1 else None
    if not clash:
        return None
    who = " and ".join(f"plugin {r.plugin!r}" for r in clash)
    return (
        f"twinkle {_SINGULAR[kind]} {name!r} is registered twice, by {who}; uninstall one of "
        f"them, or disable one with TWINKLE_PLUGINS=<names to load>"
    )


_system: PluginSystem | None = None
_system_lock = threading.Lock()


def _is_hookspec(name: str) -> bool:
    return hasattr(getattr(hookspecs, name, None), f"{hookspecs.PROJECT_NAME}_spec")


def plugin_system() -> PluginSystem:
    """The process-wide plugin system, loaded on first use."""
    global _system
    if _system is None:
        with _system_lock:
            if _system is None:
                _system = PluginSystem()
    return _system.ensure_loaded()


def reset_plugins() -> None:
    """Forget loaded plugins so the next lookup loads them again (tests, changed environment)."""
    global _system
    with _system_lock:
        _system = None


def get_plugin(kind: str, name: str) -> Any:
    """The object registered as `name` of `kind` (one of `KINDS`)."""
    return plugin_system().get(kind, name)


def registered_names(kind: str) -> list[str]:
    """The names registered for `kind` (one of `KINDS`) by every loaded plugin, sorted."""
    return plugin_system().names(kind)


def format_exception_short(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()

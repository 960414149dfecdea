"""Run a function right after a module is first imported (a one-shot post-import hook).

Used to seed torch when the user's code imports it, instead of importing torch at
`initialize()` only to seed it. The hook is a `sys.meta_path` finder that finds the module with
the other finders and wraps its loader, so the callback runs once the module is fully executed,
in the importing thread. It removes itself after firing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

_lock = threading.Lock()
_callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}


class _AfterImport(importlib.abc.Loader):
    """Delegates to the real loader, then runs the callbacks waiting for the module."""

    def __init__(self, loader: Any, name: str) -> None:
        self.loader = loader
        self.name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        with _lock:
            callbacks = _callbacks.pop(self.name, [])
        for callback in callbacks:
            callback(module)

    def __getattr__(self, attr: str) -> Any:  # is_package, get_code, ... for tools that ask
        return getattr(self.loader, attr)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in _callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _AfterImport(spec.loader, name)
        return spec


_finder = _Finder()


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call `callback(module)` once `name` is imported: now if it already is, else right after
    its first import completes."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _callbacks.setdefault(name, []).append(callback)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            return
    callback(module)


def cancel(name: str) -> None:
    """Forget the callbacks waiting for `name` (e.g. a newer seed replaces an older one)."""
    with _lock:
        _callbacks.pop(name, None)

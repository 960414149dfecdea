"""Exceptions that survive the trip from a worker process to the driver.

Most exceptions pickle as `(type, args)` and are rebuilt by calling `type(*args)`. That fails
for classes whose `__init__` takes other arguments than it passes to `Exception.__init__`, and
pickling fails for exceptions holding a lock, a socket or a closure. A worker wraps such an
exception with `portable_exception()`; the driver receives the original type rebuilt without
calling its `__init__` (`cls.__new__` plus its `args` and attributes), or, when even the type
cannot be rebuilt there, a `RemoteError` naming it, with its message and traceback.
"""

from __future__ import annotations

import pickle
import sys
from typing import Any

from .errors import TwinkleError
from .failures import safe_str


class RemoteError(TwinkleError):
    """A worker raised an exception whose type cannot be rebuilt in this process.

    `type_name` is the original `module.QualName`; `remote_traceback` its traceback text.
    """

    def __init__(self, type_name: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback

    def __reduce__(self) -> tuple[Any, ...]:
        return (RemoteError, (self.type_name, self.message, self.remote_traceback))


def _serializer() -> Any:
    """cloudpickle where the backend already loaded it (Ray ships it; it pickles classes
    defined in a driver's `__main__` by value), else the standard pickle."""
    return sys.modules.get("ray.cloudpickle") or sys.modules.get("cloudpickle") or pickle


def _pickles(value: Any) -> bool:
    try:
        _serializer().dumps(value)
    except Exception:
        return False
    return True


def _round_trips(exc: BaseException) -> bool:
    serializer = _serializer()
    try:
        str(exc)  # a broken __str__ breaks the backend's own reporting too: carried instead
        back = serializer.loads(serializer.dumps(exc))
        return type(back) is type(exc) and len(back.args) == len(exc.args)
    except Exception:
        return False


def _rebuild(
    cls: type[BaseException] | None, type_name: str, message: str, args: tuple, state: dict, tb: str
) -> BaseException:
    if cls is not None:
        try:
            exc = cls.__new__(cls)
            exc.args = args
            exc.__dict__.update(state)
            return exc
        except Exception:
            pass
    return RemoteError(type_name, message, tb)


class PortableException(Exception):
    """Carries an exception that does not pickle as it is; unpickles as the original type."""

    def __init__(self, exc: BaseException, traceback_text: str = "") -> None:
        cls = type(exc)
        self.type_name = f"{cls.__module__}.{cls.__qualname__}"
        self.message = safe_str(exc)
        super().__init__(f"{self.type_name}: {self.message}")
        args = exc.args if _pickles(exc.args) else tuple(repr(a)[:200] for a in exc.args)
        attributes = getattr(exc, "__dict__", {})
        state = {k: v for k, v in attributes.items() if k != "__notes__" and _pickles(v)}
        notes = [n for n in getattr(exc, "__notes__", []) or [] if isinstance(n, str)]
        if notes:
            state["__notes__"] = notes
        self.payload = (
            cls if _pickles(cls) else None,
            self.type_name,
            self.message,
            args,
            state,
            traceback_text,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, self.payload)


def portable_exception(exc: BaseException, traceback_text: str = "") -> BaseException:
    """`exc` itself when it pickles and unpickles as itself, else a `PortableException` that
    unpickles as `exc`'s type (or a `RemoteError` where the type cannot be rebuilt)."""
    if _round_trips(exc):
        return exc
    return PortableException(exc, traceback_text)


def rebuilt(exc: BaseException) -> BaseException:
    """What the receiving side of `portable_exception(exc)` gets, in this process."""
    if isinstance(exc, PortableException):
        return _rebuild(*exc.payload)
    return exc

"""Arguments (and results) Ray cannot ship faithfully fail early, named, and without their values.

Two kinds of argument go wrong on Ray when nothing checks them:

- Objects tied to this process (an open file, a socket, a lock, a thread, a generator).
  Ray's pickler sends a file opened for reading as a `StringIO` copy of its contents and
  fails on the others; neither is what the caller meant. `check_arguments` finds them by type
  before anything is sent (top-level arguments and the items of small containers: a few
  `isinstance` checks per argument, nothing is pickled).
- Objects that do not pickle (a function closing over a lock, an object holding a socket).
  Ray's own error dumps the arguments' closures and attributes (values included: a secret in a
  closure was printed). `checked_arguments` turns a failed submission into a
  `ConfigurationError` naming the method, the argument and the types on the way to the part that
  failed, and nothing else (only on the error path is anything pickled again, one argument at a
  time, to find which).

Wire both with one line in the backend's submit, around the shipping and the `.remote()` calls:

    with checked_arguments(self.class_name, method, calls):

Calls whose arguments are all plain data (`all_plain_data`: a config dict, token ids) need
neither check and skip it.

A worker's result is looked at the same way (`result_problem`, in the worker, for results
that are not a plain scalar): Ray would send an open file back as a `StringIO` and a generator
as its first item, where the in-process and torchrun backends fail that rank. A result that
does not pickle at all fails in Ray's own serializer, as the same rank's failure.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import socket
import threading
import types
from collections.abc import Iterator, Sequence
from typing import Any

from twinkle_core import ConfigurationError
from twinkle_core.plugin import is_plain_data

#: Containers whose items are looked at (up to `SCAN_ITEMS` of them, `SCAN_DEPTH` levels deep).
SCAN_ITEMS = 32
SCAN_DEPTH = 2

_LOCKS: tuple[type, ...] = (
    type(threading.Lock()),
    type(threading.RLock()),
    threading.Condition,
    threading.Semaphore,
    threading.Event,
)

#: What each process-bound type is called in the error, and what to pass instead.
_PROCESS_BOUND: tuple[tuple[tuple[type, ...], str, str], ...] = (
    (
        (io.IOBase,),
        "an open file",
        "Ray would send a copy of what is left to read (as a StringIO), not the file: pass its "
        "path and open it in the worker",
    ),
    ((socket.socket,), "a socket", "open the connection in the worker"),
    (_LOCKS, "a lock or other threading primitive", "create it in the worker"),
    ((threading.Thread,), "a thread", "start it in the worker"),
    (
        (types.GeneratorType, types.AsyncGeneratorType, types.CoroutineType),
        "a generator or coroutine",
        "pass the data (e.g. a list) or what the worker needs to build it",
    ),
)

#: In-memory streams pickle faithfully: not process-bound.
_IN_MEMORY = (io.BytesIO, io.StringIO)


def _process_bound(value: Any) -> tuple[str, str] | None:
    if isinstance(value, _IN_MEMORY):
        return None
    for types_, what, fix in _PROCESS_BOUND:
        if isinstance(value, types_):
            return what, fix
    return None


def _type_name(value: Any) -> str:
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _label(index: int | str) -> str:
    return f"argument {index}" if isinstance(index, int) else f"keyword argument {index!r}"


def _arguments(args: Sequence[Any], kwargs: dict[str, Any]) -> Iterator[tuple[int | str, Any]]:
    yield from enumerate(args)
    yield from kwargs.items()


def _name_like(key: Any) -> bool:
    if isinstance(key, int) and not isinstance(key, bool):
        return True
    return isinstance(key, str) and len(key) <= 40 and key.replace("_", "a").isalnum()


#: Types that are never process-bound and hold nothing that could be: not looked into.
PLAIN_TYPES = frozenset({int, float, complex, bool, str, bytes, type(None)})


def _all_plain(items: Any) -> bool:
    """Whether each of the first `SCAN_ITEMS` items (all that `_scan` would look at) is of a
    plain type: the set of types is made at C speed, so a config dict or a list of token ids
    costs almost nothing on every call."""
    return set(map(type, itertools.islice(items, SCAN_ITEMS))) <= PLAIN_TYPES


#: Builtin containers: never process-bound themselves, so only their items are looked at.
_SEQUENCES = (list, tuple, set, frozenset)


def _scan(value: Any, depth: int) -> tuple[list[str], Any, str, str] | None:
    """The first process-bound part of `value`: (the path to it as parts, innermost first),
    the part, what it is and the fix. The path is built only on a find: this runs on every
    call with arguments, and a config dict holding a list is the common case."""
    kind = type(value)
    if kind in PLAIN_TYPES:
        return None
    if kind is dict:
        if _all_plain(value.values()) or depth >= SCAN_DEPTH:
            return None
        for key, item in itertools.islice(value.items(), SCAN_ITEMS):
            found = _scan(item, depth + 1)
            if found:
                # Keys are shown only when they look like names (a key might be data).
                found[0].append(f"[{key!r}]" if _name_like(key) else "[...]")
                return found
        return None
    if kind in _SEQUENCES:
        if _all_plain(value) or depth >= SCAN_DEPTH:
            return None
        for i, item in enumerate(itertools.islice(value, SCAN_ITEMS)):
            found = _scan(item, depth + 1)
            if found:
                if kind is list or kind is tuple:
                    found[0].append(f"[{i}]")
                return found
        return None
    bound = _process_bound(value)
    if bound is not None:
        return ([], value, *bound)
    return None


def check_arguments(class_name: str, method: str, args: Sequence[Any], kwargs: dict) -> None:
    """Raise `ConfigurationError` when an argument is bound to this process (a file, socket,
    lock, thread, generator), naming the method, the argument and its type, not its value."""
    for index, value in _arguments(args, kwargs):
        _check_one(class_name, method, index, value)


def _check_one(class_name: str, method: str, index: int | str, value: Any) -> None:
    found = _scan(value, 0)
    if found is not None:
        path, bad, what, fix = found
        where = _label(index) + "".join(reversed(path))
        raise ConfigurationError(
            f"{class_name}.{method}: {where} is {what} ({_type_name(bad)}), which cannot be "
            f"sent to a Ray worker; {fix}"
        )


def result_problem(value: Any) -> str | None:
    """Why `value`, a worker's result, cannot be sent back as it is: its part tied to the
    worker's process (an open file, socket, lock, thread, generator), as "its ['out'][0] is an
    open file"; None for anything else. Looked for as for arguments (`_scan`: a few type
    checks, nothing pickled), so a dict of numbers costs a set of types."""
    found = _scan(value, 0)
    if found is None:
        return None
    path, _, what, _ = found
    where = f"its {''.join(reversed(path))}" if path else "it"
    return f"{where} is {what}"


def _serialize(value: Any) -> None:
    """Pickle `value` as Ray would (its serialization context when connected)."""
    try:
        import ray

        context = ray._private.worker.global_worker.get_serialization_context()
    except Exception:  # not connected, or a Ray without this private API
        context = None
    if context is not None:
        context.serialize(value)
        return
    import ray.cloudpickle

    ray.cloudpickle.dumps(value)


def _pickles(value: Any) -> bool:
    try:
        _serialize(value)
    except Exception:
        return False
    return True


def _parts(value: Any) -> Iterator[tuple[str, Any]]:
    """What a value is made of, each with a value-free name of how it is held."""
    if isinstance(value, types.FunctionType):
        for cell in value.__closure__ or ():
            try:
                yield "closure", cell.cell_contents
            except ValueError:  # an empty cell
                continue
        for default in value.__defaults__ or ():
            yield "default", default
        for default in (value.__kwdefaults__ or {}).values():
            yield "default", default
        names = set(value.__code__.co_names)
        for name, item in value.__globals__.items():
            if name in names and not isinstance(item, types.ModuleType):
                yield "global", item
        return
    if isinstance(value, types.MethodType):
        yield "self", value.__self__
        yield "function", value.__func__
        return
    if type(value) in (list, tuple, set, frozenset):
        for i, item in enumerate(value):
            yield f"item {i}" if type(value) in (list, tuple) else "item", item
        return
    if type(value) is dict:
        for key, item in value.items():
            yield "key", key
            yield "item", item
        return
    state = getattr(value, "__dict__", None)
    if isinstance(state, dict):
        for item in state.values():
            yield "attribute", item


def _culprit(value: Any, depth: int = 0) -> list[str]:
    """The value-free path from `value` to the innermost part that does not pickle."""
    here = [_type_name(value)]
    bound = _process_bound(value)
    if bound is not None or depth >= 6:
        return here
    for how, part in _parts(value):
        if part is value or _pickles(part):
            continue
        return [*here, how, *_culprit(part, depth + 1)]
    return here


def all_plain_data(calls: Sequence[Any], known: tuple | None = None) -> bool:
    """Whether every argument of `calls` is plain data (`twinkle_core.plugin.is_plain_data`):
    nothing then to refuse or to explain, so `checked_arguments` can be skipped. The very same
    args tuple for every worker (`dispatch='all'`) is looked at once, and `known` (an args
    tuple core already found plain: `PreparedCall.plain_args`) not at all."""
    last = known
    for call in calls:
        args = call.args
        if args is not last:
            if not is_plain_data(args):
                return False
            last = args
        if call.kwargs and not is_plain_data(call.kwargs):
            return False
    return True


@contextlib.contextmanager
def checked_arguments(class_name: str, method: str, calls: Sequence[Any]) -> Iterator[None]:
    """Around shipping `calls` (objects with `.args` and `.kwargs`, one per worker) to Ray.

    Before: `check_arguments` on each distinct argument object. After a failure: if an
    argument does not pickle, a `ConfigurationError` naming it replaces Ray's message (which
    prints values); any other error passes through unchanged.
    """
    seen: set[int] = set()
    for call in calls:
        for index, value in _arguments(call.args, call.kwargs):
            if id(value) in seen:
                continue
            seen.add(id(value))
            _check_one(class_name, method, index, value)
    try:
        yield
    except Exception as exc:
        error = _explain(class_name, method, calls, exc)
        if error is None:
            raise
        raise error from None


def _explain(
    class_name: str, method: str, calls: Sequence[Any], exc: BaseException
) -> ConfigurationError | None:
    seen: set[int] = set()
    for call in calls:
        for index, value in _arguments(call.args, call.kwargs):
            if id(value) in seen or isinstance(value, (int, float, str, bytes, type(None))):
                continue
            seen.add(id(value))
            if _pickles(value):
                continue
            path = _culprit(value)
            inner = f"; what fails: {' -> '.join(path)}" if len(path) > 1 else ""
            return ConfigurationError(
                f"{class_name}.{method}: {_label(index)} ({path[0]}) cannot be pickled for a Ray "
                f"worker ({type(exc).__name__}){inner}. Values are not shown; pass plain data "
                "or create the object in the worker"
            )
    return None

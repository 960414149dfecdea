"""Submitting an actor task without Ray's per-call Python: `actor_method(handle, name)`.

`handle.<method>.remote(*args)` makes 51 Python function calls where submitting the same
task directly makes 13 (`sys.setprofile`, one argument; Ray's serialization of the argument is
the rest): option defaults filled in on every call (`ActorMethod._remote`), two wrapping
decorators, a closure made per call, Ray Direct Transport's look for tensor refs, and
`flatten_args`, which builds an `inspect.Signature` and binds the arguments to it on every
call (2.6 us alone here). Measured with `time.thread_time` over 1000 `.remote()`s of a
one-argument method (40 alternating rounds, 2-core machine): 45 us of driver CPU per call
against 38 us for the core worker's `submit_actor_task` called directly with the same task.
Every twinkle call to a worker makes one such submission, so on the pipelined path (1000 calls
issued then resolved) this is about a third of what twinkle used to add over raw Ray.

`DirectMethod.remote` submits the very task `.remote()` would (the same function descriptor,
the same flattened arguments, the method's own options read once from its `ActorMethod`), and
checks an argument shape (how many positional arguments, which keywords) against the method's
signature with Ray's own `flatten_args` the first time it is seen, so a call that does not fit
raises Ray's `TypeError` as before. It hands the call to the `ActorMethod` itself whenever
Ray's Python would do more than fill in defaults: Ray's tracing is on, an argument is an
`ObjectRef` (Ray Direct Transport may have to start a transfer for it), or a keyword is one of
Ray's own (`_ray_trace_ctx`). A method Ray would submit differently (a generator, a tensor
transport, a decorator, a cross-language actor, retries of chosen exceptions) is never
submitted here: `actor_method` returns its `ActorMethod`.

The core worker's `submit_actor_task` is not public API; `SUPPORTED` is true only when its
parameters are the ones this module passes (Ray 2.60's), read from the installed Ray at
import. Otherwise every method is Ray's own `ActorMethod`, as before this module existed;
`tests/ray/test_submission.py` fails if the installed Ray leaves the direct path unused.
"""

from __future__ import annotations

from typing import Any

from ray import ObjectRef

try:  # everything below is Ray-internal: any change means Ray's own path
    import ray._common.signature as _signature
    from ray._private import worker as _worker
    from ray._raylet import CoreWorker
    from ray.util.tracing.tracing_helper import _is_tracing_enabled
except ImportError:  # pragma: no cover - a Ray this module does not know
    _signature = _worker = CoreWorker = _is_tracing_enabled = None  # type: ignore[assignment]

#: The parameters of `CoreWorker.submit_actor_task` this module passes, in order (Ray 2.60).
SUBMIT_PARAMETERS = (
    "self",
    "language",
    "actor_id",
    "function_descriptor",
    "args",
    "name",
    "num_returns",
    "max_retries",
    "retry_exceptions",
    "retry_exception_allowlist",
    "num_method_cpus",
    "concurrency_group_name",
    "generator_backpressure_num_objects",
    "num_objects_per_yield",
    "enable_task_events",
    "tensor_transport",
    "labels",
)


def _supported() -> bool:
    """Whether the installed Ray's core worker takes exactly the task this module builds."""
    if CoreWorker is None or not hasattr(_signature, "DUMMY_TYPE"):
        return False
    code = getattr(CoreWorker.submit_actor_task, "__code__", None)
    if code is None:
        return False
    return tuple(code.co_varnames[: code.co_argcount]) == SUBMIT_PARAMETERS


SUPPORTED = _supported()


class DirectMethod:
    """`handle.<name>` for submitting: `.remote(*args, **kwargs)` returns the task's ObjectRef,
    as the `ActorMethod` does, with Ray's per-call Python left out (module docstring)."""

    __slots__ = (
        "_actor_id",
        "_cpus",
        "_descriptor",
        "_events",
        "_language",
        "_name",
        "_parameters",
        "_retries",
        "_shapes",
        "method",
    )

    def __init__(self, handle: Any, name: str, method: Any) -> None:
        #: Ray's own `ActorMethod`, for the calls this class hands back to it.
        self.method = method
        self._name = name
        self._language = handle._ray_actor_language
        self._actor_id = handle._ray_actor_id
        self._descriptor = handle._ray_function_descriptor[name]
        self._parameters = handle._ray_method_signatures[name]
        self._cpus = handle._ray_actor_method_cpus
        self._retries = method._max_task_retries or 0
        self._events = method._enable_task_events
        #: Argument shapes (positional count, keyword names) already bound to the signature.
        self._shapes: set[Any] = set()

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs or _is_tracing_enabled():
            return self._remote_with_keywords(args, kwargs)
        flat: list[Any] = []
        dummy = _signature.DUMMY_TYPE
        for arg in args:
            if isinstance(arg, ObjectRef):
                return self.method.remote(*args)
            flat += (dummy, arg)
        if len(args) not in self._shapes:
            _signature.flatten_args(self._parameters, args, {})  # Ray's TypeError if unfit
            self._shapes.add(len(args))
        return self._submit(flat)

    def _remote_with_keywords(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        if _is_tracing_enabled() or "_ray_trace_ctx" in kwargs:
            return self.method.remote(*args, **kwargs)
        if any(isinstance(v, ObjectRef) for v in (*args, *kwargs.values())):
            return self.method.remote(*args, **kwargs)
        shape = (len(args), tuple(kwargs))
        if shape not in self._shapes:
            _signature.flatten_args(self._parameters, args, kwargs)
            self._shapes.add(shape)
        flat: list[Any] = []
        dummy = _signature.DUMMY_TYPE
        for arg in args:
            flat += (dummy, arg)
        for item in kwargs.items():
            flat += item
        return self._submit(flat)

    def _submit(self, flat: list[Any]) -> Any:
        refs = _worker.global_worker.core_worker.submit_actor_task(
            self._language,
            self._actor_id,
            self._descriptor,
            flat,
            "",  # name
            1,  # num_returns
            self._retries,
            False,  # retry_exceptions
            None,  # retry_exception_allowlist
            self._cpus,
            b"",  # concurrency_group_name: the method's own, as `.remote()` gives
            -1,  # generator_backpressure_num_objects
            1,  # num_objects_per_yield
            self._events,
            None,  # tensor_transport
            None,  # labels
        )
        return refs[0]

    def __repr__(self) -> str:
        return f"DirectMethod({self._name!r} of {self._actor_id})"


def _direct_possible(handle: Any, method: Any) -> bool:
    """Whether `.remote()` of `method` does nothing per call beyond filling in defaults that
    `DirectMethod` fills in alike."""
    return (
        SUPPORTED
        and not getattr(handle, "_ray_is_cross_language", True)
        and method._decorator is None
        and method._tensor_transport is None
        and not method._is_generator
        and method._num_returns == 1
        and method._retry_exceptions in (None, False)
        and method._generator_backpressure_num_objects in (None, -1)
        and method._num_objects_per_yield == 1
    )


def actor_method(handle: Any, name: str) -> Any:
    """What submits `name` on the actor `handle`: a `DirectMethod` where the installed Ray
    allows it, else Ray's own `ActorMethod` (`getattr(handle, name)`); both have `.remote`."""
    method = getattr(handle, name)
    try:
        if _direct_possible(handle, method):
            return DirectMethod(handle, name, method)
    except (AttributeError, KeyError):  # a handle of a shape this module does not know
        pass
    return method


class Submitters(dict):
    """What submits each `(index, method)` on `handles[index]` (`actor_method`), made when
    first looked up and kept: `submitters[rank, name].remote(*args)`."""

    def __init__(self, handles: list[Any]) -> None:
        super().__init__()
        self.handles = handles

    def __missing__(self, key: tuple[int, str]) -> Any:
        index, name = key
        made = self[key] = actor_method(self.handles[index], name)
        return made


__all__ = ["SUPPORTED", "DirectMethod", "Submitters", "actor_method"]

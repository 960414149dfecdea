"""Submitting a task to a worker the way Ray's `.remote()` does, without its per-call option
handling.

`actor.method.remote(*args)` goes through Ray's auto-init check, its tracing wrapper and
`ActorMethod._remote`, which resolves the method's options and checks Ray Direct Transport
arguments on every call, then calls `ActorHandle._actor_method_call`, which builds and submits
the task. For a twinkle worker method those steps decide the same thing on every call: the
options are fixed when the actor class is made, and the arguments of the calls sent this way
hold no object ref. Measured on the 2-core machine (`benchmarks/ab_issue_path.py`, part 4):
`.remote()` of a plain actor's method with a small dict 48.8 us of driver CPU per call,
`_actor_method_call` with the same options 40.5 us, and the cost is paid once per worker of
every call. So twinkle resolves the options once per method (`task_submitter`) and calls
`_actor_method_call` itself.

`_actor_method_call` is not public API. It is used only when its parameters are the ones this
module passes (checked once against the installed Ray: `SUPPORTED`), when Ray's tracing is off
(its wrapper adds the trace context), and for methods without options of their own (a
tensor transport, a decorator, several or streaming returns); otherwise, and for calls
whose arguments hold object refs (Ray Direct Transport looks at those), `.remote()` is used.
`tests/ray/test_task_submit.py` fails if the installed Ray stops fitting, so a Ray upgrade
that changes it is noticed rather than slowed down in silence.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from ray.actor import ActorHandle

#: The parameters of `ActorHandle._actor_method_call` this module passes.
PARAMETERS = (
    "method_name",
    "args",
    "kwargs",
    "name",
    "num_returns",
    "max_task_retries",
    "retry_exceptions",
    "concurrency_group_name",
    "generator_backpressure_num_objects",
    "num_objects_per_yield",
    "enable_task_events",
    "tensor_transport",
)


def _fits() -> bool:
    try:
        params = inspect.signature(ActorHandle._actor_method_call).parameters
    except (AttributeError, TypeError, ValueError):
        return False
    # `submit(args, kwargs)` passes both by position, after the bound method name.
    return list(params)[:4] == ["self", "method_name", "args", "kwargs"] and all(
        name in params for name in PARAMETERS
    )


#: Whether the installed Ray's `_actor_method_call` takes what `task_submitter` passes.
SUPPORTED = _fits()

#: What `task_submitter` returns: `submit(args, kwargs)` -> the task's object ref.
Submit = Callable[[tuple, dict], Any]


def _tracing() -> bool:
    try:
        from ray.util.tracing.tracing_helper import _is_tracing_enabled

        return bool(_is_tracing_enabled())
    except Exception:  # another Ray: take the public path
        return True


def task_submitter(method: Any) -> Submit:
    """`submit(args, kwargs)` for a Ray actor method: the ref of one task running it, as
    `method.remote(*args, **kwargs)` would return. The arguments must hold no object ref at
    the top level (Ray Direct Transport's look at them is skipped)."""
    bare = _bare(method)
    if bare is not None:
        return bare

    def public(args: tuple, kwargs: dict) -> Any:
        return method.remote(*args, **kwargs)

    return public


def _bare(method: Any) -> Submit | None:
    """`_actor_method_call` with `method`'s own options bound, or None where the public path
    must decide per call."""
    if not SUPPORTED or _tracing():
        return None
    try:
        handle = method._actor
        if (
            not isinstance(handle, ActorHandle)
            or handle._ray_is_cross_language
            or method._decorator is not None
            or method._tensor_transport is not None
            or method._num_returns != 1
            or method._is_generator
        ):
            return None
        backpressure = method._generator_backpressure_num_objects
        per_yield = method._num_objects_per_yield
        return functools.partial(
            handle._actor_method_call,
            method._method_name,
            name="",
            num_returns=1,
            max_task_retries=method._max_task_retries or 0,
            retry_exceptions=method._retry_exceptions,
            concurrency_group_name=None,
            generator_backpressure_num_objects=-1 if backpressure is None else backpressure,
            num_objects_per_yield=1 if per_yield is None else per_yield,
            enable_task_events=method._enable_task_events,
            tensor_transport=None,
        )
    except AttributeError:  # another Ray's ActorMethod: the public path
        return None

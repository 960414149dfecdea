"""Turning what a user names as a dispatch or collect strategy into the object core uses."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

from .errors import ConfigurationError

S = TypeVar("S")


def as_strategy(
    obj: Any,
    *,
    kind: str,
    base: Any,  # an abstract class: mypy refuses type[S] for those
    wrap: Callable[[Callable], S],
    argument: str,
    expected: str,
) -> S:
    """`obj` as an instance of `base`: a name registered for `kind` (looked up through the
    plugins), an instance, a subclass (instantiated), or a plain function (`wrap(obj)`).

    Anything else is a `ConfigurationError` saying what `argument` accepts (`expected`).
    """
    if isinstance(obj, str):
        from .plugins import get_plugin

        obj = get_plugin(kind, obj)
    if isinstance(obj, base):
        return cast(S, obj)
    if inspect.isclass(obj) and issubclass(obj, base):
        return cast(S, obj())
    if callable(obj):
        return wrap(obj)
    raise ConfigurationError(f"{argument} must be {expected}; got {obj!r}")

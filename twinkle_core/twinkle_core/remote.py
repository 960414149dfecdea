"""`@remote_class` and `@remote_function`: the decorators a user puts on their classes."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from .calls import EXECUTE_MODES, MethodSpec, RemoteBinding, invoke, resolve_lazy_values
from .callsite import user_call_site
from .collect import Collector
from .device_mesh import DeviceMesh
from .dispatch import Dispatcher
from .errors import ConfigurationError
from .swapping import swap_methods
from .transport import check_transport

T = TypeVar("T", bound=type)
F = TypeVar("F", bound=Callable[..., Any])

BINDING_ATTR = "_twinkle_binding"
SPEC_ATTR = "__twinkle_remote_function__"
CLASS_ATTR = "__twinkle_remote_class__"


def _check_strategy(value: Any, argument: str, base: type) -> None:
    if isinstance(value, (str, base)) or (inspect.isclass(value) and issubclass(value, base)):
        return
    if callable(value):
        return
    raise ConfigurationError(
        f"remote_function({argument}=...) must be a registered name, a {base.__name__} or a "
        f"function; got {value!r}"
    )


def remote_function(
    _fn: F | None = None,
    *,
    dispatch: str | Dispatcher | Callable = "slice",
    execute: str = "all",
    collect: str | Collector | Callable = "none",
    sync: bool = False,
    lazy_collect: bool | None = None,
    timeout: float | None = None,
    transport: str = "auto",
    writable_args: bool = False,
) -> Any:
    """Make a method of a `@remote_class` run on the workers of the object's group.

    On the driver, a call splits its arguments with `dispatch`, runs on the workers chosen by
    `execute` ('all', 'first' or 'peer'), and combines their results with `collect`. It returns
    a `LazyCollect` while lazy collection is on. Inside a worker the method runs directly.
    `transport` names how large tensor results travel to other groups: 'auto', 'object_store'
    or a registered transport (`twinkle_core.transport`). `writable_args=True` says the
    method writes in place into its array/tensor arguments: backends that hand out read-only
    views of large arguments (Ray's object store) give it private copies instead.
    """
    check_transport(transport)
    if not isinstance(writable_args, bool):
        raise ConfigurationError(
            f"remote_function(writable_args=...) must be True or False, got {writable_args!r}"
        )
    _check_strategy(dispatch, "dispatch", Dispatcher)
    _check_strategy(collect, "collect", Collector)
    if execute not in EXECUTE_MODES:
        raise ConfigurationError(
            f"remote_function(execute=...) must be one of {EXECUTE_MODES}, got {execute!r}"
        )
    if not isinstance(sync, bool):
        raise ConfigurationError(f"remote_function(sync=...) must be True or False, got {sync!r}")
    if lazy_collect is not None and not isinstance(lazy_collect, bool):
        raise ConfigurationError(
            f"remote_function(lazy_collect=...) must be None, True or False, got {lazy_collect!r}"
        )
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
    ):
        raise ConfigurationError(
            f"remote_function(timeout=...) must be a positive number of seconds, got {timeout!r}"
        )

    def decorate(fn: F) -> F:
        if isinstance(fn, (staticmethod, classmethod, property)):
            kind = type(fn).__name__
            raise ConfigurationError(
                f"@remote_function cannot decorate a {kind} "
                f"({getattr(fn, '__func__', fn)!r}): a remote function runs on each worker's "
                f"instance, so it must be a plain method taking self; drop @{kind}, or keep "
                "the helper local without @remote_function"
            )
        if not callable(fn):
            raise ConfigurationError(f"@remote_function decorates methods, got {fn!r}")
        spec = MethodSpec(
            name=fn.__name__,
            qualname=fn.__qualname__,
            dispatch=dispatch,
            execute=execute,
            collect=collect,
            sync=sync,
            lazy_collect=lazy_collect,
            timeout=timeout,
            transport=transport,
            writable_args=writable_args,
        )

        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            try:
                binding = self.__dict__[BINDING_ATTR]
            except (AttributeError, KeyError):  # a plain local object, or one on a worker
                return fn(self, *args, **kwargs)
            if binding is None:
                return fn(self, *args, **kwargs)
            return invoke(binding, spec, args, kwargs, user_call_site(2))

        setattr(wrapper, SPEC_ATTR, spec)
        return wrapper  # type: ignore[return-value]

    if _fn is not None:
        return decorate(_fn)
    return decorate


def class_options(cls: type) -> Mapping[str, Any]:
    """What `@remote_class` declared on `cls` (`execute`, `colocate`), read-only; the
    defaults for a class without it. Backends ask here, never for the attribute itself."""
    declared = getattr(cls, CLASS_ATTR, None)
    return declared if declared is not None else _DEFAULT_CLASS_OPTIONS


_DEFAULT_CLASS_OPTIONS: Mapping[str, Any] = MappingProxyType(
    {"execute": "all", "colocate": True, "swap": True}
)


def method_options(cls: type, method: str) -> MethodSpec | None:
    """What `@remote_function` declared on `cls.method` (dispatch, collect, timeout,
    transport, writable_args, ...), or None for a method without it. The one reader of
    those options: backends ask here, never for the attribute core stores them under."""
    spec = getattr(getattr(cls, method, None), SPEC_ATTR, None)
    return spec if isinstance(spec, MethodSpec) else None


def remote_specs(cls: type) -> dict[str, MethodSpec]:
    """The remote-function specs of a class, by method name."""
    out = {}
    for name in dir(cls):
        spec = method_options(cls, name)
        if spec is not None:
            out[name] = spec
    return out


def remote_class(
    _cls: T | None = None, *, execute: str = "all", colocate: bool = True, swap: bool = True
) -> Any:
    """Let a class be constructed on a device group: `Model(..., remote_group='model')`.

    Objects created on the same group share that group's worker processes, one per rank, in
    every mode (a policy and a reference model on the same devices; calls to them run in the
    order issued). `colocate=False` gives each object of the class processes of its own on
    backends that can (Ray), for a role that must not share (a crash-prone library); a
    backend whose processes are fixed (torchrun) refuses it.

    Colocated roles take turns on the devices: a class defining `offload(self)` and
    `onload(self)` has them run on its workers when its group switches to or from another
    object (`twinkle_core.swapping`); `swap=False` opts out.

    With `remote_group`, the object on the driver stands for one worker instance per rank of
    the group (only the first with `execute='first'`); `device_mesh=` arranges them. A class
    whose `__init__` declares a `device_mesh` parameter receives the object's mesh in every
    worker (the one passed, by keyword or position, or the default twinkle builds for the
    group); one that does not declare it never sees it. Without `remote_group` it is an
    ordinary local object, which also receives `device_mesh` when it declares it (the mesh
    passed, else a one-worker mesh).
    """
    if execute not in ("all", "first"):
        raise ConfigurationError(
            f"remote_class(execute=...) must be 'all' or 'first', got {execute!r}"
        )
    if not isinstance(swap, bool):
        raise ConfigurationError(
            f"remote_class(swap=...) must be True (offload()/onload() around role switches) "
            f"or False, got {swap!r}"
        )
    if not isinstance(colocate, bool):
        raise ConfigurationError(
            f"remote_class(colocate=...) must be True (share the group's processes) or False "
            f"(processes of its own), got {colocate!r}"
        )

    def decorate(cls: T) -> T:
        if not inspect.isclass(cls):
            raise ConfigurationError(f"@remote_class decorates classes, got {cls!r}")
        _reject_wrapped_remote_functions(cls)
        original_init = cls.__init__
        mesh_signature = _signature_with_mesh(original_init)

        @functools.wraps(original_init)
        def __init__(self, *args, remote_group=None, device_mesh=None, **kwargs):
            if mesh_signature is not None:
                args, kwargs, device_mesh = _take_mesh(
                    mesh_signature, self, args, kwargs, device_mesh
                )
            if remote_group is None:
                if mesh_signature is None:
                    if device_mesh is not None:
                        raise ConfigurationError(
                            f"{cls.__name__}(device_mesh=...) needs remote_group=...: a mesh "
                            f"arranges the workers of a group (or declare a device_mesh "
                            f"parameter in {cls.__name__}.__init__ to receive it locally)"
                        )
                    original_init(self, *args, **kwargs)
                    return
                mesh = _check_mesh(cls, device_mesh) or DeviceMesh.from_sizes(dp_size=1)
                original_init(self, *args, device_mesh=mesh, **kwargs)
                return
            _bind(
                self,
                cls,
                execute,
                remote_group,
                device_mesh,
                args,
                kwargs,
                pass_mesh=mesh_signature is not None,
            )

        setattr(cls, "__init__", __init__)  # noqa: B010 - mypy rejects assigning a method
        if not hasattr(cls, "__getattr__"):  # a class's own __getattr__ is left alone
            setattr(cls, "__getattr__", _missing_attribute)  # noqa: B010
        setattr(
            cls,
            CLASS_ATTR,
            MappingProxyType({"execute": execute, "colocate": colocate, "swap": swap}),
        )
        if "__iter__" in cls.__dict__ and "__next__" in cls.__dict__:
            iter_fn = cls.__dict__["__iter__"]

            def _twinkle_restart_iteration(self) -> None:
                iter_fn(self)  # the worker keeps its iterator; nothing travels back

            setattr(cls, "_twinkle_restart_iteration", _twinkle_restart_iteration)  # noqa: B010
            setattr(cls, "__iter__", _remote_iter(iter_fn))  # noqa: B010
            setattr(cls, "__next__", _remote_next(cls.__dict__["__next__"]))  # noqa: B010
        return cls

    if _cls is not None:
        return decorate(_cls)
    return decorate


def _missing_attribute(self: Any, name: str) -> Any:
    """An attribute the object does not have. On the driver side of a remote object (which
    holds no state: its `__init__` ran in the workers) the error says where the state is and
    how to read it; anywhere else it is Python's own error. Runs only for missing attributes."""
    try:
        bound = object.__getattribute__(self, "__dict__").get(BINDING_ATTR) is not None
    except AttributeError:  # a class with __slots__: never a driver-side object
        bound = False
    kind = type(self).__name__
    message = f"{kind!r} object has no attribute {name!r}"
    if bound and not name.startswith("__"):
        message += (
            f" on the driver: a remote object's state lives in its workers ({kind}.__init__ "
            "ran there, not here) and only its @remote_function methods run there. Read it "
            "through one, e.g. @remote_function(execute='first', collect='first') def "
            f"get_{name.lstrip('_')}(self): return self.{name}"
        )
    raise AttributeError(message, name=name, obj=self)


def _reject_wrapped_remote_functions(cls: type) -> None:
    """`@staticmethod`/`@classmethod`/`@property` above `@remote_function` would run on the
    driver, never on the workers: an error at class definition instead of a silent one."""
    for name, attr in vars(cls).items():
        inner: Any
        if isinstance(attr, (staticmethod, classmethod)):
            inner = attr.__func__
        elif isinstance(attr, property):
            inner = attr.fget
        else:
            continue
        if isinstance(getattr(inner, SPEC_ATTR, None), MethodSpec):
            kind = type(attr).__name__
            raise ConfigurationError(
                f"{cls.__name__}.{name}: @{kind} above @remote_function makes it run on the "
                f"driver, never on the workers; a remote function must be a plain method "
                f"taking self: drop @{kind}"
            )


def _signature_with_mesh(init: Callable) -> inspect.Signature | None:
    """The signature of `init` when it declares a `device_mesh` parameter, else None."""
    try:
        signature = inspect.signature(init)
    except (TypeError, ValueError):  # builtins without a signature
        return None
    param = signature.parameters.get("device_mesh")
    if param is None or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
        return None
    if param.kind is param.POSITIONAL_ONLY:
        return None  # cannot be handed over by keyword; the class manages it itself
    return signature


def _take_mesh(
    signature: inspect.Signature, obj: Any, args: tuple, kwargs: dict, given: Any
) -> tuple[tuple, dict, Any]:
    """Separate a mesh passed positionally from the other arguments.

    Returns the arguments without the mesh and the mesh (the keyword one when given). When
    the arguments do not fit the signature they are left alone, so the class's own
    `__init__` raises its usual `TypeError`.
    """
    if given is not None:
        return args, kwargs, given
    try:
        bound = signature.bind_partial(obj, *args, **kwargs)
    except TypeError:
        return args, kwargs, None
    if "device_mesh" not in bound.arguments:
        return args, kwargs, None
    mesh = bound.arguments.pop("device_mesh")
    return tuple(bound.args[1:]), dict(bound.kwargs), mesh


def _check_mesh(cls: type, mesh: Any) -> DeviceMesh | None:
    if mesh is not None and not isinstance(mesh, DeviceMesh):
        raise ConfigurationError(
            f"{cls.__name__}(device_mesh=...) must be a DeviceMesh, got {mesh!r}; build one "
            f"with DeviceMesh.from_sizes(dp_size=...)"
        )
    return mesh


def _iteration_spec(fn: Callable) -> MethodSpec:
    return MethodSpec(
        name=fn.__name__,
        qualname=fn.__qualname__,
        dispatch="all",
        execute="first",
        collect="first",
        lazy_collect=False,
    )


def _remote_iter(fn: Callable) -> Callable:
    """Iterating the driver object restarts iteration on the first worker."""
    spec = _iteration_spec(fn)
    spec = MethodSpec(**{**spec.__dict__, "name": "_twinkle_restart_iteration"})

    @functools.wraps(fn)
    def __iter__(self):
        binding = self.__dict__.get(BINDING_ATTR)
        if binding is None:
            return fn(self)
        invoke(binding, spec, (), {}, user_call_site(2))
        return self

    return __iter__


def _remote_next(fn: Callable) -> Callable:
    """`next()` on the driver object fetches the first worker's next item (StopIteration ends)."""
    spec = _iteration_spec(fn)

    @functools.wraps(fn)
    def __next__(self):
        binding = self.__dict__.get(BINDING_ATTR)
        if binding is None:
            return fn(self)
        return invoke(binding, spec, (), {}, user_call_site(2))

    return __next__


def _bind(
    obj: Any,
    cls: type,
    execute: str,
    remote_group: str,
    device_mesh: DeviceMesh | None,
    args: tuple,
    kwargs: dict,
    *,
    pass_mesh: bool = False,
) -> None:
    from .runtime import BoundClass, current_runtime

    runtime = current_runtime()
    if not isinstance(remote_group, str):
        raise ConfigurationError(
            f"{cls.__name__}(remote_group=...) must be a group name, got {remote_group!r}"
        )
    group = runtime.group(remote_group)
    num_workers = 1 if execute == "first" else group.num_workers
    if device_mesh is None:
        mesh = runtime.config.global_device_mesh
        if mesh is None or mesh.world_size != num_workers:
            mesh = DeviceMesh.from_sizes(dp_size=num_workers)
    else:
        _check_mesh(cls, device_mesh)
        mesh = device_mesh
    if sorted(mesh.ranks) != list(range(num_workers)):
        raise ConfigurationError(
            f"{cls.__name__}(device_mesh={mesh!r}) does not fit group {group.name!r} with "
            f"{num_workers} workers: the mesh must hold ranks 0..{num_workers - 1}, e.g. "
            f"DeviceMesh.from_sizes(dp_size={num_workers})"
        )
    for spec in remote_specs(cls).values():
        spec.resolved()  # unknown dispatcher/collector names fail here, not at the first call
    # Constructor arguments are resolved here, once, for every backend: a LazyCollect (also
    # inside lists, tuples and dicts) becomes its collected value.
    args, kwargs = resolve_lazy_values((args, kwargs))
    if pass_mesh:
        kwargs = {**kwargs, "device_mesh": mesh}
    offload, onload = swap_methods(cls, class_options(cls)["swap"])
    runtime.turns.before_construct(group.name, user_call_site())
    workers = runtime.backend.create_workers(
        cls, group, mesh, args, kwargs, num_workers=num_workers
    )
    binding = RemoteBinding(
        workers,
        runtime.config.name,
        runtime.config.mode,
        runtime.config.lazy_collect,
        offload=offload,
        onload=onload,
    )
    obj.__dict__[BINDING_ATTR] = binding
    runtime.turns.constructed(binding)
    runtime.bound.append(BoundClass(cls.__name__, workers))

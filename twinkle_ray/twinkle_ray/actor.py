"""The Ray actor that hosts one rank of a device group: the worker of every remote object
created on that group (colocated roles), each in a slot of its own.

It sets the worker's environment first (rank variables, its visible devices, the pass-through
variables), checks it landed where the plan says, and only then builds the user's object, so
`torch.distributed.init_process_group()` inside the object's methods just works. The user's class
is instantiated as `cls(*args, **kwargs)`: without `remote_group`, the `@remote_class` wrapper
hands the arguments straight to the class's own `__init__`.

The actor class is made for the group's first object (`actor_class_for`), with one actor
method per method of that class, so its calls travel as `handle.<method>.remote(*args,
**kwargs)`: exactly the arguments the user's method takes and nothing else (every extra
argument of a Ray call costs serialization on both sides). The group's later objects are built
in the same actors (`_tw_construct_more`, slot 1, 2, ...), each seeded as a fresh worker with
generators of its own that are switched in for its calls (`WorkerState`: left in place after a
call, so a role called many times in a row switches once; slot 0's call puts the process's
back), and are called by
name (`_tw_call(key, ...)`, one key naming the slot and the method: `call_key`). Twinkle's own
methods and attributes are named `_tw_*`.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

import ray

from twinkle_core.plugin import (
    WorkerContext,
    WorkerState,
    exit_error,
    format_remote_traceback,
    method_options,
    now_ns,
    portable_exception,
    recorder,
    seed_everything,
    set_process_worker_context,
    unsendable_result,
)

from . import tracing as _tracing
from .payload_check import PLAIN_TYPES, result_problem
from .transfer import (
    WRITE_GUARD,
    is_large,
    materialize,
    pack_result,
    register_tensor_serializer,
    writable_copies,
)

#: Prefix of twinkle's own actor methods; user methods with it go through `_tw_call`.
RESERVED_PREFIX = "_tw_"


@dataclass(frozen=True)
class ActorBoot:
    """What an actor needs before the user's object exists."""

    group: str
    class_name: str
    rank: int
    expected_node: str
    device_type: str
    devices: tuple[int, ...]
    env: dict[str, str]
    noset_env: tuple[str, ...]


def free_port() -> int:
    """A TCP port that was free on this node a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class TwinkleActor:
    """One worker process of a remote class (subclassed per user class by `actor_class_for`,
    wrapped by `ray.remote` in `backend.py`). Its own attributes and methods are all named
    `_tw_*`, so they never hide a method of the user's class."""

    def __init__(self, boot: ActorBoot) -> None:
        for name in boot.noset_env:
            os.environ[name] = "1"  # keep Ray from overriding the visibility twinkle sets
        os.environ.update(boot.env)
        self._tw_boot = boot
        self._tw_instance: Any = None
        #: Every object this actor hosts: (instance, class name, its worker state or None for
        #: slot 0, whose context and generators are the process's own).
        self._tw_slots: list[tuple[Any, str, WorkerState | None]] = []
        self._tw_refused: BaseException | None = None  # why `_tw_hello` failed, if it did
        #: Whether a later slot's call ran (its generators may be in place: slot 0's calls
        #: then put the process's back first).
        self._tw_kept = False
        WRITE_GUARD.on = True  # notice in-place writes into received object-store views
        _tracing.start_actor(boot.group, boot.class_name, boot.rank)  # trace, stack probe

    def _tw_hello(self) -> dict[str, Any]:
        """Where this actor runs; fails when it is not on the planned node or devices (and
        then `_tw_construct`, queued right behind it, refuses to build the user's object)."""
        try:
            return self._tw_check_placement()
        except BaseException as exc:
            self._tw_refused = exc
            raise

    def _tw_check_placement(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        node_id = ctx.get_node_id()
        boot = self._tw_boot
        where = f"worker rank {boot.rank} of group {boot.group!r} ({boot.class_name})"
        if boot.expected_node and node_id != boot.expected_node:
            raise RuntimeError(
                f"{where} started on node {node_id[:8]} but was planned on {boot.expected_node[:8]}"
            )
        visible = {k: os.environ.get(k) for k in boot.env if k.endswith("VISIBLE_DEVICES")}
        for key, value in visible.items():
            if value != boot.env[key]:
                raise RuntimeError(
                    f"{where}: {key}={value!r} but twinkle planned {boot.env[key]!r}; Ray "
                    f"overrode it (set {', '.join(boot.noset_env) or 'the NOSET variables'})"
                )
        if boot.device_type != "cpu" and boot.devices:
            from twinkle_core.plugin import get_platform

            platform = get_platform(boot.device_type)
            if platform.is_available() and platform.device_count() != len(boot.devices):
                raise RuntimeError(
                    f"{where} should see {len(boot.devices)} {boot.device_type} device(s) "
                    f"{list(boot.devices)} but sees {platform.device_count()}"
                )
        return {
            "node_id": node_id,
            "ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "visible": visible,
        }

    def _tw_ping(self) -> bool:
        """Answer the driver's liveness probe (groups that may restart: `restarts.Watcher`)."""
        return True

    def _tw_free_port(self) -> tuple[str, int]:
        """An address and free port on this node for the torch.distributed rendezvous."""
        return ray.util.get_node_ip_address(), free_port()

    def _tw_construct(
        self,
        master: tuple[str, int],
        ctx: WorkerContext,
        seed: int,
        full_determinism: bool,
        cls: type,
        /,
        *args: Any,
        **kwargs: Any,
    ) -> bool:
        """Build the user's object as worker `ctx.rank`, seeded like every fresh worker.

        The user's arguments are this call's own arguments, so Ray resolves object refs among
        them (shared shards put once by the driver) before the call, fetching them concurrently.
        """
        if self._tw_refused is not None:
            raise RuntimeError(
                f"not constructing {self._tw_boot.class_name}: this actor failed its start-up "
                f"check ({type(self._tw_refused).__name__}: {self._tw_refused})"
            )
        os.environ["MASTER_ADDR"] = master[0]
        os.environ["MASTER_PORT"] = str(master[1])
        self._tw_context = ctx
        set_process_worker_context(ctx)
        seed_everything(seed, full_determinism)
        rec = recorder()  # None unless the driver traces (tracing.py)
        start = now_ns() if rec is not None else 0
        try:
            self._tw_instance = cls(*args, **kwargs)
        except BaseException as exc:
            _raise_portable(exc, "__init__", ctx.rank)
        finally:
            if rec is not None:
                boot = self._tw_boot
                _tracing.record(rec, boot.group, boot.class_name, boot.rank, "__init__", start)
        self._tw_slots = [(self._tw_instance, self._tw_boot.class_name, None)]
        self._maybe_register_tensors()
        return True

    def _tw_construct_more(
        self,
        slot: int,
        ctx: WorkerContext,
        seed: int,
        full_determinism: bool,
        cls: type,
        /,
        *args: Any,
        **kwargs: Any,
    ) -> bool:
        """Build another object of the group in this process, in slot `slot`: seeded as a
        fresh worker would be, with generators of its own; the generators in place (the
        process's, or the last role's called) are left as they were. Costs the object's
        `__init__` and nothing else."""
        if len(self._tw_slots) > slot:
            raise RuntimeError(
                f"actor of group {self._tw_boot.group!r} rank {self._tw_boot.rank} holds "
                f"{len(self._tw_slots)} object(s) and was asked to build slot {slot}"
            )
        while len(self._tw_slots) < slot:  # (a restart skips objects that failed to build)
            self._tw_slots.append((None, "", None))
        # Collective and transport groups are joined by the process: its objects share them.
        ctx = dataclasses.replace(ctx, collectives=self._tw_context.collectives)
        try:
            instance, state = WorkerState.construct(
                cls, args, kwargs, ctx, seed=seed, full_determinism=full_determinism
            )
        except BaseException as exc:
            # The slot stays taken (empty), so every rank numbers the later objects alike.
            self._tw_slots.append((None, cls.__name__, None))
            _raise_portable(exc, "__init__", ctx.rank)
        self._tw_slots.append((instance, cls.__name__, state))
        self._maybe_register_tensors()
        return True

    def _tw_run(self, method: str, args: tuple, kwargs: dict, slot: int = 0) -> Any:
        """Run one method of the object in `slot`; its result, large ones as a `Stored`
        envelope (or a `Held` one when a device-direct transport carries it:
        `transfer.pack_result`). A later slot runs as its own worker: its context is set
        around the call and its generators are switched in for it (and left in place after
        it: slot 0's call puts the process's back first)."""
        instance, class_name, state = self._tw_slots[slot]
        seen = WRITE_GUARD.start()  # large tensors received as object-store views
        if _writable_args(type(instance), method):
            args, kwargs = writable_copies((args, kwargs))
        rec = recorder()  # None unless the driver traces (tracing.py)
        start = now_ns() if rec is not None else 0
        try:
            if state is None:
                if self._tw_kept:  # a later slot's generators may be in place
                    WorkerState.restore_process_generators()
                value = getattr(instance, method)(*args, **kwargs)
            else:
                # Nothing but calls runs in this process: the role's generators stay in place
                # after the call, and its next call (the common case: a role called many
                # times in a row) switches nothing.
                self._tw_kept = True
                with state.activate(keep=True):
                    value = getattr(instance, method)(*args, **kwargs)
        except BaseException as exc:
            _raise_portable(exc, method, self._tw_boot.rank)
        finally:
            if rec is not None:
                boot = self._tw_boot
                _tracing.record(rec, boot.group, class_name, boot.rank, method, start)
        if seen:
            WRITE_GUARD.finish(seen, f"{class_name}.{method}")
        if not _tensors_registered:
            self._maybe_register_tensors()
        if type(value) not in PLAIN_TYPES:  # a file or generator would travel as something else
            why = result_problem(value)
            if why is not None:
                rank = self._tw_boot.rank
                error = unsendable_result(f"{class_name}.{method}", rank, value, why)
                _raise_portable(error, method, rank)
        if not is_large(value):  # most results: returned as they are, nothing more to decide
            return value
        transport = _transport(type(instance), method)
        colocated = len(self._tw_slots) > 1
        return pack_result(value, transport, f"{class_name}.{method}", colocated)

    def _tw_call(self, key: str, /, *args: Any, **kwargs: Any) -> Any:
        """Any method of any object of this actor by name: `key` (`call_key`) says which
        object (slot), which method, and whether the arguments hold remote placeholders
        (results of another group, fetched here)."""
        slot, method, has_remote = _KEYS.get(key) or _parse_key(key)
        if has_remote:
            args, kwargs = materialize((args, kwargs))
        return self._tw_run(method, args, kwargs, slot)

    def _tw_call_rdt(
        self, slot: int, method: str, keys: tuple, /, *args: Any, **kwargs: Any
    ) -> Any:
        """`_tw_call` for a consumer of held results whose tensors travel as arguments of
        the task: the first `len(keys)` arguments are their refs (RDT ones, moved device to
        device, or object-store ones the holders put), resolved by Ray before the task runs
        into the tensors that stand in for those held results (`transports.receive`)."""
        from .transports import delivered

        n = len(keys)
        with delivered(keys, args[:n]):
            rest, kwargs = materialize((args[n:], kwargs))
            return self._tw_run(method, rest, kwargs, slot)

    def _tw_rdt_give(self, key: str) -> list:
        """A held result's tensors, for a call submitted with `.options(tensor_transport=...)`:
        Ray keeps them here in its RDT store and moves them to the consuming tasks."""
        from .transports import give_tensors

        return give_tensors(key)

    def _tw_apply(self, fn: Any, /, *args: Any) -> Any:
        """Run twinkle's own function `fn(*args)` in this actor's process (e.g. joining a
        collective group, `twinkle_ray.collective`); user code never comes through here."""
        return fn(*args)

    def _tw_environment(self, names: list[str] | None = None) -> dict[str, str]:
        """This process's environment (or the listed variables): for tests and debugging."""
        if names is None:
            return dict(os.environ)
        return {n: os.environ[n] for n in names if n in os.environ}

    def _maybe_register_tensors(self) -> None:
        global _tensors_registered
        if "torch" in sys.modules:
            register_tensor_serializer()
            _tensors_registered = True


#: Whether this process already sends tensors as numpy buffers (checked once per call).
_tensors_registered = False

#: (class, method) -> (writable_args, transport) the method declared.
_declared: dict[tuple[type, str], tuple[bool, str]] = {}


def _declared_options(cls: type, method: str) -> tuple[bool, str]:
    """What `method`'s `@remote_function` declared for this actor (looked up once)."""
    key = (cls, method)
    hit = _declared.get(key)
    if hit is None:
        spec = method_options(cls, method)
        hit = _declared[key] = (
            bool(getattr(spec, "writable_args", False)),
            str(getattr(spec, "transport", "auto")),
        )
    return hit


def _writable_args(cls: type, method: str) -> bool:
    """Whether `method` declared `@remote_function(writable_args=True)`: its tensor and array
    arguments then arrive as private copies instead of read-only views of the object store."""
    return _declared_options(cls, method)[0]


def _transport(cls: type, method: str) -> str:
    """The transport `method` declared (`auto` when it declared none)."""
    return _declared_options(cls, method)[1]


def _raise_portable(exc: BaseException, method: str, rank: int) -> NoReturn:
    """Re-raise what user code raised so that it reaches the driver with its type.

    Ray rebuilds an exception on the driver by calling its class with its `args`, which fails
    for classes whose `__init__` takes other arguments (and pickling fails for ones holding a
    lock or a socket); those travel as a `PortableException` that unpickles as the original
    type. `SystemExit` and `KeyboardInterrupt` would end or cancel the actor: they become a
    `WorkerExitError` of this call.
    """
    if isinstance(exc, Exception):
        carried = portable_exception(exc, format_remote_traceback(exc))
        if carried is exc:
            raise exc
        raise carried.with_traceback(exc.__traceback__) from None
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        raise exit_error(exc, method, rank) from None
    raise exc


def call_key(slot: int, method: str, has_remote: bool) -> str:
    """`_tw_call`'s first argument: the object's slot, the method, and whether the arguments
    hold remote placeholders, in one short string (every argument of a Ray task costs
    serialization on both sides: three took about 50 us more of the worker's CPU per call
    than a direct method here)."""
    return f"{'!' if has_remote else ''}{slot}:{method}"


#: Keys `_tw_call` has seen, parsed (one per object and method called through it).
_KEYS: dict[str, tuple[int, str, bool]] = {}


def _parse_key(key: str) -> tuple[int, str, bool]:
    slot, method = key.removeprefix("!").split(":", 1)
    parsed = _KEYS[key] = (int(slot), method, key.startswith("!"))
    return parsed


def _direct_method(name: str) -> Any:
    def method(self: TwinkleActor, *args: Any, **kwargs: Any) -> Any:
        return self._tw_run(name, args, kwargs)

    method.__name__ = name
    method.__qualname__ = f"TwinkleActor.{name}"
    return method


def direct_method_names(cls: type) -> frozenset[str]:
    """The methods of `cls` that get an actor method of their own.

    Every callable attribute except dunders (iteration's `__next__` goes through `_tw_call`),
    twinkle's reserved `_tw_*` names, and names the actor or an actor handle already has.
    """
    from ray.actor import ActorHandle

    names = set()
    for name in dir(cls):
        if name.startswith("__") or name.startswith(RESERVED_PREFIX):
            continue
        if hasattr(TwinkleActor, name) or hasattr(ActorHandle, name):
            continue
        try:
            attr = getattr(cls, name)
        except Exception:
            continue
        if callable(attr) and not isinstance(attr, type):
            names.add(name)
    return frozenset(names)


_class_names: dict[str, int] = {}


def actor_class_for(cls: type) -> tuple[type, frozenset[str]]:
    """A `TwinkleActor` subclass hosting `cls` (not yet `ray.remote`), and its direct methods.

    Named after the user's class so Ray's logs and process titles read `Model.forward`; a
    second class of the same name in this process gets a numbered name, because Ray tells
    actor classes apart by module and name.
    """
    names = direct_method_names(cls)
    base = cls.__name__
    count = _class_names.get(base, 0) + 1
    _class_names[base] = count
    name = base if count == 1 else f"{base}_{count}"
    body: dict[str, Any] = {n: _direct_method(n) for n in sorted(names)}
    body["__module__"] = __name__
    body["__qualname__"] = name
    body["__doc__"] = f"Ray actor hosting one worker of {cls.__module__}.{cls.__qualname__}."
    return type(name, (TwinkleActor,), body), names

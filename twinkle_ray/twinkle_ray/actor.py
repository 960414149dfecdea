"""The Ray actor that hosts one worker of a remote class.

It sets the worker's environment first (rank variables, its visible devices, the pass-through
variables), checks it landed where the plan says, and only then builds the user's object, so
`torch.distributed.init_process_group()` inside the object's methods just works. The user's class
is instantiated as `cls(*args, **kwargs)`: without `remote_group`, the `@remote_class` wrapper
hands the arguments straight to the class's own `__init__`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ray

from twinkle_core.plugin import (
    WorkerContext,
    exit_error,
    format_remote_traceback,
    portable_exception,
    seed_everything,
    set_process_worker_context,
)

from .transfer import materialize, register_tensor_serializer, result_meta


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
    """One worker process of a remote class (wrapped by `ray.remote` in `workers.py`)."""

    def __init__(self, boot: ActorBoot) -> None:
        for name in boot.noset_env:
            os.environ[name] = "1"  # keep Ray from overriding the visibility twinkle sets
        os.environ.update(boot.env)
        self.boot = boot
        self.instance: Any = None

    def hello(self) -> dict[str, Any]:
        """Where this actor runs; fails when it is not on the planned node or devices."""
        ctx = ray.get_runtime_context()
        node_id = ctx.get_node_id()
        boot = self.boot
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

    def free_port(self) -> tuple[str, int]:
        """An address and free port on this node for the torch.distributed rendezvous."""
        return ray.util.get_node_ip_address(), free_port()

    def construct(
        self,
        master: tuple[str, int],
        ctx: WorkerContext,
        seed: int,
        full_determinism: bool,
        cls: type,
        has_remote: bool,
        kwnames: tuple[str, ...],
        *values: Any,
    ) -> bool:
        """Build the user's object as worker `ctx.rank`, seeded like every fresh worker.

        Arguments arrive flat (`*values`, the last `len(kwnames)` being keyword values) so Ray
        resolves object refs among them before the call, fetching them concurrently.
        """
        os.environ["MASTER_ADDR"] = master[0]
        os.environ["MASTER_PORT"] = str(master[1])
        set_process_worker_context(ctx)
        seed_everything(seed, full_determinism)
        args, kwargs = _unflatten(values, kwnames, has_remote)
        with _portable_errors("__init__", ctx.rank):
            self.instance = cls(*args, **kwargs)
        self._maybe_register_tensors()
        return True

    def call(
        self, method: str, has_remote: bool, kwnames: tuple[str, ...], *values: Any
    ) -> tuple[Any, Any]:
        """Run one method of the user's object; returns (value, small metadata about it)."""
        args, kwargs = _unflatten(values, kwnames, has_remote)
        with _portable_errors(method, self.boot.rank):
            value = getattr(self.instance, method)(*args, **kwargs)
        self._maybe_register_tensors()
        return value, result_meta(value)

    def environment(self, names: list[str] | None = None) -> dict[str, str]:
        """This process's environment (or the listed variables): for tests and debugging."""
        if names is None:
            return dict(os.environ)
        return {n: os.environ[n] for n in names if n in os.environ}

    def _maybe_register_tensors(self) -> None:
        if "torch" in sys.modules:
            register_tensor_serializer()


@contextlib.contextmanager
def _portable_errors(method: str, rank: int) -> Iterator[None]:
    """Let every exception user code raises reach the driver with its type.

    Ray rebuilds an exception on the driver by calling its class with its `args`, which fails
    for classes whose `__init__` takes other arguments (and pickling fails for ones holding a
    lock or a socket); those travel as a `PortableException` that unpickles as the original
    type. `SystemExit` and `KeyboardInterrupt` would end or cancel the actor: they become a
    `WorkerExitError` of this call.
    """
    try:
        yield
    except Exception as exc:
        carried = portable_exception(exc, format_remote_traceback(exc))
        if carried is exc:
            raise
        raise carried.with_traceback(exc.__traceback__) from None
    except (SystemExit, KeyboardInterrupt) as exc:
        raise exit_error(exc, method, rank) from None


def flatten_call(args: tuple, kwargs: dict) -> tuple[tuple[str, ...], tuple]:
    """(keyword names, positional values then keyword values): the wire form of a call."""
    return tuple(kwargs), (*args, *kwargs.values())


def _unflatten(values: tuple, kwnames: tuple[str, ...], has_remote: bool) -> tuple[tuple, dict]:
    split = len(values) - len(kwnames)
    args, kwargs = tuple(values[:split]), dict(zip(kwnames, values[split:], strict=True))
    if has_remote:
        args, kwargs = materialize((args, kwargs))
    return args, kwargs

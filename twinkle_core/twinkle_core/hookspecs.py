"""The hooks a twinkle plugin can implement.

Every hook is optional. The `register_*` hooks receive a `register(name, obj, *, override=False)`
callback; `obj` may be the object itself or a `"module:attr"` string imported on first use, so
listing plugins stays cheap. Each hook is documented with an example in docs/plugins.md.
"""

from __future__ import annotations

from typing import Any

import pluggy

PROJECT_NAME = "twinkle"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def register_backends(register) -> None:
    """Register `ExecutionBackend` subclasses by mode name (`initialize(mode=name)`)."""


@hookspec
def register_dispatchers(register) -> None:
    """Register `Dispatcher` objects or plain dispatch functions by name."""


@hookspec
def register_collectors(register) -> None:
    """Register `Collector` objects or plain collect functions by name."""


@hookspec
def register_platforms(register) -> None:
    """Register `AcceleratorPlatform` subclasses by device type name."""


@hookspec
def register_notifiers(register) -> None:
    """Register `Notifier` subclasses by name; they are built with `from_env()`."""


@hookspec
def register_transports(register) -> None:
    """Register `Transport` subclasses by name, for `@remote_function(transport=name)` and the
    `auto` rule (`twinkle_core.transport.choose_transport`)."""


@hookspec
def twinkle_secret_env_vars() -> list[str] | None:
    """Environment variables that hold this plugin's secrets or driver-only settings.

    Return names or `fnmatch` patterns (e.g. `["MYCHAT_*"]`); matched case-insensitively.
    Backends never send a matching variable to a worker, whatever the user's pass-through
    list says: a notifier's webhook token stays on the driver that notifies.
    """


@hookspec(firstresult=True)
def twinkle_doctor_probe(backend: str, address: str, timeout: float) -> dict[str, Any] | None:
    """Look at `backend`'s cluster at `address` for `twinkle doctor --<backend> [ADDRESS]`.

    Return None unless `backend` is yours. Otherwise a dict: `data` (JSON-able, shown as the
    report's `<backend>_cluster`), `problems` and `warnings` (lists of `{"problem", "fix"}`),
    `text` (the lines the text report shows). Must return within `timeout` seconds and must
    not import heavy libraries into the doctor's process (use a child process, as the Ray backend
    does). `address` is "auto" when none was given.
    """


@hookspec(firstresult=True)
def twinkle_init_distributed(
    context: Any, platform: Any, backend: str, timeout: Any
) -> bool | None:
    """Set up torch.distributed's default group for the worker `context` runs (the
    `WorkerContext`, or None outside any worker), for `twinkle_core.init_distributed()`.

    Return None unless the worker is yours (`context.mode` is your backend's name). Otherwise
    create the group with `backend` ("nccl", "hccl", "gloo": already resolved from
    `platform`, an `AcceleratorPlatform`) and `timeout` (a `datetime.timedelta`), making the
    worker's device current first on an accelerator; return True, or False when the process
    already had a default group (leave it as it is).
    """


@hookspec
def twinkle_seed(seed: int, full_determinism: bool) -> None:
    """Seed the random generators of a library twinkle does not import itself (e.g. torch)."""


@hookspec
def twinkle_get_rng_state() -> dict[str, Any] | None:
    """Return this plugin's random-generator state, to be handed back to `twinkle_set_rng_state`.

    The in-process backend uses the pair to give each simulated worker its own generators, as
    separate processes would have.
    """


@hookspec
def twinkle_set_rng_state(state: dict[str, Any]) -> None:
    """Restore a state produced by `twinkle_get_rng_state` (pick out the keys you returned)."""


@hookspec
def twinkle_random_generators() -> list[Any] | None:
    """Return this plugin's random generators as `twinkle_core.plugin.RandomGenerator`s.

    A process hosting several workers (colocated roles on Ray, the driver and its workers
    under torchrun, in-process workers) switches their generators for each call; a
    generator given here is switched by fingerprint (only what changed is saved and set)
    instead of being copied through `twinkle_get_rng_state`/`twinkle_set_rng_state` twice
    per call. Its `owns(key)` must claim every key this plugin's `twinkle_get_rng_state`
    returns. Called once per process (and again after plugins are reloaded).
    """


@hookspec
def twinkle_group_restarted(group: str, generation: int, cause: str) -> None:
    """A device group's workers were rebuilt after a death (`DeviceGroup(max_restarts=N)`):
    called once per restart on the driver, after every hosted object was constructed again
    and brought up to date (`on_restart`), with the group's new generation and what killed
    the previous one. Must not raise."""


@hookspec
def twinkle_remote_failure(failure) -> None:
    """Observe a remote call failure (a `twinkle_core.CallFailure`) on the driver.

    Called once per distinct failure, before the exception reaches the caller. Must not raise.
    """

"""Transports: how a method's large tensor results travel to another group (issue 11, item 3).

`@remote_function(..., transport=...)` names one: `auto` (the default), `object_store` (the
backend's own path: Ray's object store, torchrun's process memory), or a transport registered by
a plugin (device-direct paths such as Ray Direct Transport's `nccl`/`gloo`/`cuda_ipc`/`nixl`, or a
torch.distributed path over a collective group twinkle creates). A `Transport` says which
devices it serves and from what size it pays; `choose_transport` applies the `auto` rule:

- payloads under `AUTO_MIN_BYTES` (about 1 MB) stay on the object store, where a device-direct
  transfer is slower than the store's inline path;
- a larger payload on a device uses the first registered transport serving that device that
  the backend carries and lets `auto` pick;
- otherwise the object store, with one log line per (method, reason): `auto` never fails where
  the object store would have worked.

Only the selection lives in core; backends carry the payload. A transport says what it moves
(device types, the torch.distributed backend that carries it, from what size it pays); each
name is registered by one plugin. Which registered transports a backend can carry, and which
of them `auto` may pick there, is the backend's to say (`carries`, `auto_picks` below): the
torch.distributed transports `gloo`/`nccl`/`hccl` are one definition, carried by every backend
that builds process groups between its groups.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from .errors import ConfigurationError

log = logging.getLogger("twinkle")

AUTO = "auto"
OBJECT_STORE = "object_store"
#: Names every backend understands.
BUILTIN_TRANSPORTS = (AUTO, OBJECT_STORE)
#: Below this many bytes `auto` keeps a payload on the object store.
AUTO_MIN_BYTES = 1 << 20


class Transport:
    """A way to move tensors between workers, registered by name by a plugin.

    Class attributes describe it so the driver can choose without importing torch or ray.
    """

    #: Device types it moves tensors of, e.g. ("cuda",) for nccl, ("cpu",) for gloo.
    device_types: ClassVar[tuple[str, ...]] = ()
    #: Payloads smaller than this go to the object store under `auto`.
    min_bytes: ClassVar[int] = AUTO_MIN_BYTES
    #: Device types `auto` may pick it for; None: all of `device_types`. (Ray's `nixl` moves
    #: CPU tensors when named but is no faster than the object store for them on one node.)
    auto_device_types: ClassVar[tuple[str, ...] | None] = None
    #: The torch.distributed backend that carries it point to point ("gloo", "nccl", "hccl"),
    #: or "" when it is carried some other way (e.g. Ray Direct Transport). A backend that
    #: builds process groups between its groups carries every transport that names one, so a
    #: platform plugin registers e.g. `hccl` without knowing any backend.
    torch_backend: ClassVar[str] = ""

    @classmethod
    def is_available(cls) -> bool:
        """Whether its library is installed here; never raises."""
        return True

    @classmethod
    def serves(cls, device_type: str) -> bool:
        """Whether it moves tensors of `device_type`."""
        return device_type in cls.device_types


#: A backend's rule for which registered transports it can carry (default: all of them).
Carries = Callable[[type[Transport]], bool]
#: A backend's rule for whether `auto` may pick a transport for a device type there.
AutoPicks = Callable[[type[Transport], str], bool]


def check_transport(value: Any, argument: str = "remote_function(transport=...)") -> str:
    """`value` as a transport name; a clear error for anything but a non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"{argument} must be {AUTO!r}, {OBJECT_STORE!r} or the name of a registered "
            f"transport, got {value!r}"
        )
    return value


def check_known(value: str, registered: Iterable[str], argument: str) -> str:
    """`value` must be built in or registered; the error lists what is."""
    names = set(registered)
    if value in BUILTIN_TRANSPORTS or value in names:
        return value
    known = ", ".join(repr(n) for n in (*BUILTIN_TRANSPORTS, *sorted(names)))
    raise ConfigurationError(
        f"{argument}: no transport named {value!r} is registered (known: {known}); install the "
        "plugin that provides it, or use 'auto'"
    )


def check_registered(value: str, argument: str) -> str:
    """`value` must be built in or registered through the `register_transports` hook."""
    if value in BUILTIN_TRANSPORTS:
        return value
    from .plugins import KINDS, registered_names

    names = registered_names("transports") if "transports" in KINDS else []
    return check_known(value, names, argument)


def registered_transports() -> dict[str, type[Transport]]:
    """Every registered transport by name (sorted); one that fails to import is left out,
    with a debug line: a broken plugin must not stop a result from travelling."""
    from .plugins import plugin_system

    system = plugin_system()
    out: dict[str, type[Transport]] = {}
    for name in system.names("transports"):
        try:
            out[name] = system.get("transports", name)
        except Exception as exc:
            log.debug("twinkle: transport %r could not be loaded: %s", name, exc)
    return out


_logged: set[tuple[str, str]] = set()


def choose_transport(
    requested: str,
    nbytes: int,
    device_type: str,
    mode: str,
    registered: dict[str, type[Transport]],
    *,
    method: str = "",
    carries: Carries | None = None,
    auto_picks: AutoPicks | None = None,
) -> str:
    """The transport a result of `nbytes` bytes on `device_type` takes in `mode`.

    `requested` is the method's `transport=`; a named transport that cannot carry this payload
    falls back to the object store like `auto` does (with one log line), since the object store
    always works. `carries` and `auto_picks` are the backend's rules (see the module docstring).
    """
    name, why = explain_transport(
        requested, nbytes, device_type, mode, registered, carries=carries, auto_picks=auto_picks
    )
    if why is not None:
        note_fallback(method, why)
    return name


def explain_transport(
    requested: str,
    nbytes: int,
    device_type: str,
    mode: str,
    registered: dict[str, type[Transport]],
    *,
    carries: Carries | None = None,
    auto_picks: AutoPicks | None = None,
) -> tuple[str, str | None]:
    """`choose_transport` without logging: (the transport, why the object store was taken
    instead, or None). For backends that decide where the payload is (a worker) and log where
    the user looks (the driver, with `note_fallback`)."""
    if requested == OBJECT_STORE:
        return OBJECT_STORE, None

    def usable(cls: type[Transport]) -> bool:
        return cls.serves(device_type) and (carries is None or carries(cls)) and cls.is_available()

    if requested != AUTO:
        cls = registered.get(requested)
        if cls is not None and usable(cls):
            return requested, None
        why = f"transport {requested!r} cannot move {device_type} tensors in mode {mode!r}"
        return OBJECT_STORE, why
    if nbytes < AUTO_MIN_BYTES:
        return OBJECT_STORE, None
    for name, cls in registered.items():
        only = getattr(cls, "auto_device_types", None)
        if only is not None and device_type not in only:
            continue
        if auto_picks is not None and not auto_picks(cls, device_type):
            continue
        if nbytes >= cls.min_bytes and usable(cls):
            return name, None
    if device_type != "cpu":
        return OBJECT_STORE, f"no device-direct transport for {device_type} in mode {mode!r}"
    return OBJECT_STORE, None


def note_fallback(method: str, reason: str) -> None:
    """Log once per (method, reason) that a result took the object store instead."""
    key = (method, reason)
    if key not in _logged:
        _logged.add(key)
        log.info("twinkle: %s: %s; using the object store", method or "a call", reason)

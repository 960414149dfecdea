"""Exception types raised by twinkle itself (not by user code running in workers)."""

from __future__ import annotations


class TwinkleError(Exception):
    """Base class of every error twinkle raises on its own behalf."""


class ConfigurationError(TwinkleError, ValueError):
    """An argument or setting is invalid; the message names it and says how to fix it."""


class NotInitializedError(TwinkleError, RuntimeError):
    """A call needs `twinkle_core.initialize()` first."""


class PluginNotFoundError(TwinkleError, LookupError):
    """A backend, dispatcher, collector, platform or notifier name is not registered."""


class PluginLoadError(TwinkleError, ImportError):
    """A plugin failed to import, or declares a twinkle-core range this core does not satisfy."""


class DuplicatePluginError(TwinkleError):
    """Two plugins registered the same name for the same kind."""


class WorkerDiedError(TwinkleError, RuntimeError):
    """A worker process died (killed, out of memory, crashed) while the driver waited on it."""


class CallLostError(TwinkleError, RuntimeError):
    """A call's way to its workers broke while the workers live on: whether each worker ran
    the call is unknown. On Ray, a relay that hands a multi-node group's calls to its node's
    workers died on its own (its node and workers did not). The workers and their state are
    intact, nothing restarts and no restart is spent: twinkle starts new relays and later
    calls go through them. Call again if the call is safe to repeat.
    """


class CollectiveBrokenError(TwinkleError, RuntimeError):
    """A collective group lost a member (it died, or left): the surviving members' collective
    failed, and every later one on that group fails at once. The message names the group and
    its members; form a new collective group once the dead member's object is created again.
    """


class CallTimeoutError(TwinkleError, TimeoutError):
    """A remote call did not finish within its deadline."""


class WorkerExitError(TwinkleError, RuntimeError):
    """User code in a worker raised `SystemExit` (or, on Ray, `KeyboardInterrupt`).

    A method cannot end its worker's process without ending the group's other ranks' peer,
    so twinkle reports it as this error of the call, naming the rank, instead.
    """


class CollectError(TwinkleError, TypeError):
    """A collector could not combine the workers' results (e.g. `collect='mean'` of strings).

    The message names the method, the collector and the driver call site; the collector's own
    exception is chained as `__cause__`.
    """

"""Telling a worker that died from a worker whose code raised, and saying how it died.

A Ray call fails either because the user's method raised (the error travels back as a
`RayTaskError`) or because the worker's process or node is gone (`DEATH_ERRORS`). A death
tears the whole group down (its other ranks would hang in their next collective), so the
worker group classifies every failure with these before deciding what to do.
"""

from __future__ import annotations

import ray.exceptions as rex

#: Ray errors that mean the worker process (or its node) is gone, not that user code raised.
DEATH_ERRORS: tuple[type[BaseException], ...] = (
    rex.RayActorError,
    rex.WorkerCrashedError,
    rex.NodeDiedError,
    rex.OutOfMemoryError,
    rex.LocalRayletDiedError,
    rex.ObjectLostError,
)


def how_it_died(exc: BaseException) -> str:
    """Words for a death error: a lost node reads differently from a crashed process.

    An actor whose node is killed without warning first shows as unreachable
    (`ActorUnavailableError`, about 2 s after the loss, while the cluster still lists the node
    as alive for a while); with `max_restarts=0` it never comes back, so it counts as dead.
    """
    text = str(exc)
    if isinstance(exc, rex.NodeDiedError) or "node has died" in text or "node died" in text:
        return "died with its node"
    if isinstance(exc, rex.ActorUnavailableError):
        return "died or became unreachable (its process or its whole node is gone)"
    return "died"


def actor_state(handle: object) -> str | None:
    """The state the cluster's control store (GCS) lists for the actor behind `handle`
    (`ALIVE`, `DEAD`, ...), or None when it gives none.

    Asked only on failure paths, where a death error may stand for an actor other than the
    worker (a relay that handed the call on): the GCS is what Ray itself decides deaths by,
    it answers while the worker is busy with a call (a liveness task would wait for it), and
    it lists an actor whose process died as `DEAD` at once, but one on a node lost without
    warning as `ALIVE` until the node's loss is noticed (seconds).
    """
    from ray._private import state  # no public API reads one actor's state without the dashboard

    try:
        info = state.actors(actor_id=handle._actor_id.hex())  # type: ignore[attr-defined]
    except Exception:
        return None
    return info.get("State") if info else None

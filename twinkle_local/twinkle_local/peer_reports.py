"""What this process can tell about the others when a wait for them failed.

A process whose wait for the others timed out asks them where they are (each one's watchdog
answers through the store, `watchdog.py`) and names those that stay silent. A process that finds
the job broken reads the notes the others left in the store when they shut twinkle down, which
tells an extra remote call on this process from a dead peer. Both go into the error message.
"""

from __future__ import annotations

import logging

from twinkle_core.plugin import user_call_site

from .channel import ControlChannel

log = logging.getLogger("twinkle")

#: Seconds a process whose wait timed out gives the others to report where they are.
STACK_WAIT_S = 2.0


def stacks_text(stacks: dict[int, str], world_size: int, rank: int) -> str:
    """The other processes' own reports of where they are, for an error message."""
    if world_size <= 1:
        return ""
    silent = [r for r in range(world_size) if r != rank and r not in stacks]
    parts = [stacks[r] for r in sorted(stacks)]
    if silent:
        parts.append(
            f"process{'es' if len(silent) > 1 else ''} {', '.join(map(str, silent))}: no "
            f"answer within {STACK_WAIT_S:g}s (dead, or stuck without releasing Python's GIL)"
        )
    return "; where the other processes are:\n" + "\n".join(parts)


def leave_shutdown_note(channel: ControlChannel, rank: int, sequence: int) -> None:
    """Tell the others through the store that this process shut twinkle down, after which
    call and from which line of the driver script."""
    store = channel.store
    if store is None or channel.world_size <= 1:
        return
    try:
        store.set(
            channel.key("shutdown", rank),
            f"shut twinkle down after call #{sequence} (shutdown() from {user_call_site()!s})",
        )
    except Exception as exc:
        log.debug("twinkle: could not leave the shutdown note: %s", exc)


def shutdown_notes(channel: ControlChannel, rank: int, sequence: int) -> str:
    """Which other processes already shut twinkle down (an extra call on this one?)."""
    store = channel.store
    if store is None:
        return ""
    notes = []
    for other in range(channel.world_size):
        if other == rank:
            continue
        key = channel.key("shutdown", other)
        try:
            if store.check([key]):
                notes.append(f"process {other} {store.get(key).decode(errors='replace')}")
        except Exception:
            return ""
    if not notes:
        return ""
    return (
        f"; {'; '.join(notes)}, while this process (rank {rank}) made call "
        f"#{sequence}: every process must make the same remote calls"
    )

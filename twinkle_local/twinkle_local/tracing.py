"""The call timeline under torchrun: every rank records, rank 0 writes one merged file.

Every process of the job is a driver and holds at most one worker per group, so each records
its own driver track ("driver rank r") and its workers' executions (core's `run_method` does
that while a trace is on). At start-up the processes measure their clock offsets to rank 0
over twinkle's control group; at shutdown every process sends its events to rank 0, which
shifts them onto its own clock and writes the file.
"""

from __future__ import annotations

import logging
import statistics
from typing import TYPE_CHECKING, Any

from twinkle_core.plugin import now_ns, recorder

if TYPE_CHECKING:
    from .session import Session

log = logging.getLogger("twinkle.trace")

#: Rounds of the clock-offset measurement (the median is kept).
OFFSET_ROUNDS = 5


def measure_offset(channel: Any) -> int:
    """This process's trace clock minus rank 0's, in ns (0 on rank 0 or a lone process).

    Each round is a barrier (an all-gather every process leaves at about the same moment)
    followed by an all-gather of the time each process read when it left the barrier.
    """
    if not channel.distributed:
        return 0
    samples = []
    for _ in range(OFFSET_ROUNDS):
        channel.all_gather(None)
        mine = now_ns()
        times = channel.all_gather(mine)
        samples.append(mine - times[0])
    return int(statistics.median(samples))


def start(session: Session) -> None:
    """Join the trace of this run (after the processes agreed on the run): name this process's
    driver track, measure the clock offset, and gather the events to rank 0 at shutdown.

    Every process must call it at the same point (it runs collectives when tracing is on);
    all of them trace, or none (the trace path is part of what they agree on).
    """
    rec = recorder()
    if rec is None:
        return
    channel = session.channel
    rank = session.env.rank
    if channel.world_size > 1:
        rec.label = f"driver rank {rank}"
    rec.meta["local_offset_ns"] = measure_offset(channel)
    if rank != 0:
        rec.path = None  # rank 0 writes the merged file


def gather(rec: Any, session: Session, broken: BaseException | None) -> None:
    """Send every process's events to rank 0 (at shutdown, on every process at once; the
    backend registers it with core as its gatherer). `broken`: the run's broken state."""
    if "local_offset_ns" not in rec.meta:
        return
    channel = session.channel
    if not channel.distributed:
        return
    offset_ns = rec.meta["local_offset_ns"]
    if broken is not None:
        log.warning(
            "twinkle: the run broke (%s); rank %d's trace events are not gathered",
            broken,
            session.env.rank,
        )
        return
    snapshot = rec.snapshot() if session.env.rank != 0 else None
    parts = channel.all_gather((offset_ns, snapshot))
    if session.env.rank != 0:
        return
    for their_offset, part in parts[1:]:
        if part is not None:
            rec.merge(part, their_offset - offset_ns)

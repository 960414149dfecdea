"""One sender per alert in a torchrun job, and keeping the job alive until it has sent.

Every process of the job sees the same failure and would send the same alert. The store elects
one sender per alert (`ControlChannel.claim`). At shutdown the sender flushes its alerts and
marks them done, and the other processes wait for that: torchrun stops every process as soon as
one exits with an error, which could otherwise kill the sender before it sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .session import Session

log = logging.getLogger("twinkle")


class AlertElection:
    """The alerts this process was asked about in one run, and whether it sends each."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._claims: list[tuple[str, bool]] = []

    def claim(self, key: str) -> bool:
        """One process of the whole job sends each alert: elected through the store."""
        try:
            won = self.session.channel.claim(key)
        except Exception as exc:  # the store is gone (launcher died): rank 0 speaks
            log.warning("twinkle: could not elect the notifying process: %s", exc)
            won = self.session.env.rank == 0
        self._claims.append((key, won))
        return won

    def settle(self, flush: Callable[[float], bool], alerts: Any) -> None:
        """Keep every process alive until the elected ones have sent their alerts.

        `flush(timeout)` waits for this process's queued alerts; `alerts` (core's alert queue,
        or None) bounds the wait of the others by the shutdown's deadline.
        """
        if not self._claims:
            return
        session = self.session
        notify_wait = session.notify_wait
        won = [k for k, w in self._claims if w]
        lost = [k for k, w in self._claims if not w]
        if won:
            if not flush(notify_wait):
                log.warning("twinkle: alerts still unsent after %.0fs", notify_wait)
            for key in won:
                try:
                    session.channel.mark_done(key)
                except Exception as exc:
                    log.warning("twinkle: could not tell the other processes: %s", exc)
        if lost:
            # Within the shutdown's deadline (`shutdown(timeout=...)`), as the sender's flush.
            wait = notify_wait if alerts is None else alerts.time_left(notify_wait)
            session.channel.wait_done(lost, wait)
        self._claims = []

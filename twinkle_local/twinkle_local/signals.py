"""Let queued alerts out before torchrun's SIGTERM ends a process.

When one process of a torchrun job exits with an error, torchrun sends SIGTERM to the others
and SIGKILLs them 30 s later. Python's default SIGTERM action ends a process at once, so an
alert a survivor has just queued (a slow HTTP notifier) would be lost. While a run is active
this handler waits, bounded, for the alert queue to drain, then ends the process with the
default SIGTERM action as before. It is installed only when SIGTERM still has the default
action: a handler the user installed is never replaced.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("twinkle")


class AlertFlushOnTerm:
    """Installs/uninstalls the SIGTERM handler; `flush(timeout)` is called before dying."""

    def __init__(self, flush: Callable[[float], Any], timeout: float) -> None:
        self.flush = flush
        self.timeout = timeout
        self.installed = False

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return False
        signal.signal(signal.SIGTERM, self._handle)
        self.installed = True
        return True

    def uninstall(self) -> None:
        if not self.installed:
            return
        self.installed = False
        if threading.current_thread() is threading.main_thread() and (
            signal.getsignal(signal.SIGTERM) == self._handle
        ):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def _handle(self, signum: int, frame: Any) -> None:
        try:
            self.flush(self.timeout)
        except Exception as exc:  # dying anyway: never let the handler fail the exit
            log.warning("twinkle: flushing alerts on SIGTERM failed: %s", exc)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

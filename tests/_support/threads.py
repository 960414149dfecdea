"""Running code in a thread with a bound, so a held lock fails a test instead of hanging it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def in_thread(fn: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Run `fn` in a daemon thread and return its value (or raise its exception); fail when it
    does not finish within `timeout` seconds."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # pragma: no cover - re-raised below
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"{fn} did not finish within {timeout}s: a lock is held"
    if "error" in box:
        raise box["error"]
    return box["value"]


def from_threads(fn: Callable[[], Any], threads: int, per_thread: int, timeout: float = 120.0):
    """Call `fn` `per_thread` times in each of `threads` threads at once; return every value
    (in completion order). Fails when a thread has not finished within `timeout` seconds."""
    out: list[Any] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(per_thread):
            value = fn()
            with lock:
                out.append(value)

    workers = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout)
    assert not any(w.is_alive() for w in workers), "a driver thread hung"
    return out

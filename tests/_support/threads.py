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

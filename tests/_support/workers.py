"""Remote classes that several suites use unchanged."""

from __future__ import annotations

from twinkle_core import remote_class, remote_function


@remote_class()
class OkOrFail:
    """`ok()` returns "ok" from rank 0; `fail()` raises ValueError on every rank."""

    def __init__(self) -> None:
        pass

    @remote_function(dispatch="all", collect="first")
    def fail(self):
        raise ValueError("nobody collects this")

    @remote_function(dispatch="all", collect="first")
    def ok(self):
        return "ok"

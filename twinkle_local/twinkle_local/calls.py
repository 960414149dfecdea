"""Pending calls of the local backend, and turning worker outcomes into bytes and back.

Every process runs the calls aimed at its own rank, then the outcomes are exchanged so each
process holds the same results (or the same failures) as a Ray driver would.
"""

from __future__ import annotations

import copy
import io
import pickle
from typing import Any

import cloudpickle

from twinkle_core import CallTimeoutError, DeviceMesh, TwinkleError
from twinkle_core.plugin import (
    Collector,
    CompletedCall,
    WorkerFailure,
    WorkersFailedError,
    portable_exception,
    unsendable_result,
)

_UNSET = object()


class LocalPendingCall(CompletedCall):
    """A finished call: the full results, or the value an all-reduce already produced.

    Outcomes are exchanged when the call is submitted, so collecting never waits and never
    runs a collective (which would have to happen at the same point on every process).
    """

    def __init__(
        self,
        results: list[Any] | None,
        failures: list[WorkerFailure] | None = None,
        *,
        reduced: Any = _UNSET,
        reduce_op: str | None = None,
        mesh: DeviceMesh | None = None,
        label: str = "",
        partial: bool = False,
        error: BaseException | None = None,
        private: bool = False,
    ) -> None:
        super().__init__(results if results is not None else [], failures)
        #: An error of the call itself (not of a worker), raised on every process.
        self.error = error
        #: False when only some results were exchanged (an all-reduce, or only the results
        #: the collector looks at); `wait()` then cannot return the per-rank list.
        self.complete = results is not None and not partial
        self.reduced = reduced
        self.reduce_op = reduce_op
        self.mesh = mesh
        self.label = label
        #: Whether results hold tensors a transport delivered that nothing else references
        #: (received, or the holder's copy): a hand-off gives them on without a copy.
        self.private = private
        #: Whether they were handed to another call (`hand_off`): later collects copy them.
        self.handed = False

    def _raise_failures(self) -> None:
        if self.error is not None:
            raise self.error
        if self.failures:
            # A method stopped at its timeout: the call timed out (as where it is waited
            # for), not a worker error.
            for failure in sorted(self.failures, key=lambda f: f.rank):
                if isinstance(failure.exception, CallTimeoutError):
                    raise failure.exception
            raise WorkersFailedError(self.failures)

    def wait(self, timeout: float | None) -> list[Any]:
        self._raise_failures()
        if not self.complete:
            how = (
                f"were summed with an all-reduce for its '{self.reduce_op}' collector"
                if self.reduce_op
                else "were exchanged only where its collector uses them"
            )
            raise TwinkleError(
                f"{self.label}: the results {how}, so the per-rank list is not available in "
                "mode 'local'; use a gathering collector (e.g. collect='none') to get every result"
            )
        return self.results

    def succeeded(self) -> bool:
        return self.error is None and not self.failures

    def collect(self, collector: Collector, device_mesh: DeviceMesh, timeout: float | None) -> Any:
        value = self._collect(collector, device_mesh, timeout)
        # The tensors handed to another call are that call's (it may keep them): a copy here.
        return copy.deepcopy(value) if self.handed else value

    def hand_off(self, collector: Collector, device_mesh: DeviceMesh) -> Any:
        """The collected value for another call's argument, without a copy (`private`)."""
        value = self._collect(collector, device_mesh, None)
        self.handed = True
        return value

    def _collect(self, collector: Collector, device_mesh: DeviceMesh, timeout: float | None) -> Any:
        self._raise_failures()
        same_mesh = device_mesh is self.mesh or device_mesh == self.mesh
        if self.reduced is not _UNSET and collector.reduce_op == self.reduce_op and same_mesh:
            return self.reduced
        if self.results and not self.complete and same_mesh:
            # Only the results the collector looks at (one per data shard) were exchanged.
            return collector.collect(self.results, device_mesh)
        return collector.collect(self.wait(timeout), device_mesh)


def portable_failure(failure: WorkerFailure) -> WorkerFailure:
    """`failure` with an exception that survives pickling (a RuntimeError stand-in otherwise).

    The stand-in keeps the original type name and message, and the traceback text travels too.
    """
    carried = portable_exception(failure.exception, failure.traceback)
    if carried is failure.exception:
        return failure
    return WorkerFailure(failure.rank, carried, failure.node, failure.traceback)


def encode(ok: bool, value: Any, rank: int, node: str | None, label: str) -> tuple[bytes, bool]:
    """Pickle one outcome: (bytes, whether they hold a result). An unpicklable result
    becomes that rank's failure.

    A result `pickle` cannot name (a closure, an instance of a class defined in the method)
    goes by value with cloudpickle, as Ray sends every result, so it comes back in every mode
    (conformance check `results_made_in_the_call`); `pickle.loads` reads either. Plain
    `pickle` first: it is the fast path, and cloudpickle's only for what it refuses."""
    if not ok:
        return pickle.dumps((False, portable_failure(value))), False
    try:
        return pickle.dumps((True, value)), True
    except Exception:
        pass  # e.g. "Can't pickle local object": by value below, which says what really fails
    try:
        return _by_value((True, value)), True
    except Exception as exc:
        error = unsendable_result(label, rank, value, f"{type(exc).__name__}: {exc}")
        return pickle.dumps((False, WorkerFailure(rank, error, node, ""))), False


class _ByValue(cloudpickle.Pickler):
    """cloudpickle, but an open file is refused: cloudpickle would send it as a `StringIO`
    copy of what is left to read, a stand-in the caller did not return."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, io.IOBase) and not isinstance(obj, (io.BytesIO, io.StringIO)):
            raise TypeError(f"cannot pickle {type(obj).__qualname__!r} object (an open file)")
        return super().reducer_override(obj)


def _by_value(value: Any) -> bytes:
    with io.BytesIO() as out:
        _ByValue(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
        return out.getvalue()


def decode(
    blob: bytes, rank: int, node: str | None, label: str, note: bool = True
) -> tuple[bool, Any]:
    """Unpickle one outcome; one that cannot be read here becomes that rank's failure.

    A failure gets its rank's traceback as a note unless `note` is False."""
    try:
        ok, value = pickle.loads(blob)
    except Exception as exc:
        error = TypeError(
            f"the result of {label} on rank {rank} cannot be read in this process: "
            f"{type(exc).__name__}: {exc}"
        )
        return False, WorkerFailure(rank, error, node, "")
    if note and not ok and value.traceback:
        # Raised in another process: its frames are not in this exception's traceback.
        note = f"twinkle: traceback on rank {value.rank}:\n{value.traceback.rstrip()}"
        notes = getattr(value.exception, "__notes__", None) or []
        if note not in notes:
            value.exception.__notes__ = [*notes, note]
    return ok, value

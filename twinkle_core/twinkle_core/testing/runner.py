"""Running conformance checks in one process: results, comparisons, the summary.

A check is a short driver program with its expected values written down in the kit's source.
`run_check` starts a fresh run for it (`initialize(mode, seed=SEED, groups=...)`), runs it and
shuts the run down, so one failing check never changes the next one's outcome.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: The seed every check's run is initialized with.
SEED = 1234

PASSED = "passed"
FAILED = "failed"
NOT_APPLICABLE = "not applicable"


class CheckFailed(AssertionError):
    """A check saw something else than its written-down expectation; the message says both."""


class NotApplicable(Exception):
    """Raised by a check that cannot run on this backend, saying why: the backend lacks an
    optional feature (collective groups), or the premise does not hold (a backend sharing the
    driver's objects sends no argument anywhere). Reported as `not applicable`, never passed."""


@dataclass(frozen=True)
class Check:
    """One named conformance check.

    `groups` are the device groups the check's run declares, as `(name, workers)` pairs (all
    CPU). `world_size` is the number of workers of its largest group: on a backend that runs
    every group on the same processes (the torchrun backend puts a group of k workers on ranks
    0..k-1), the number of processes the check needs; in a smaller world it is reported as not
    applicable. `total_workers` is what a backend giving every group processes of its own
    needs. `body(session)` runs the driver code in a started `Session` and raises `CheckFailed`
    on a mismatch.
    """

    name: str
    description: str
    groups: tuple[tuple[str, int], ...]
    body: Callable[[Session], None] = field(repr=False, compare=False)

    @property
    def world_size(self) -> int:
        return max(n for _, n in self.groups)

    @property
    def total_workers(self) -> int:
        return sum(n for _, n in self.groups)


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check: `passed`, `failed` or `not applicable`, and why."""

    name: str
    outcome: str
    detail: str = ""
    #: Wall-clock time the check took, its session's start included when it started one.
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "outcome": self.outcome,
            "detail": self.detail,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class ConformanceReport:
    """The results of a conformance run, in check order."""

    results: list[CheckResult]
    errors: list[str] = field(default_factory=list)

    def _named(self, outcome: str) -> list[CheckResult]:
        return [r for r in self.results if r.outcome == outcome]

    @property
    def passed(self) -> list[CheckResult]:
        return self._named(PASSED)

    @property
    def failed(self) -> list[CheckResult]:
        return self._named(FAILED)

    @property
    def not_applicable(self) -> list[CheckResult]:
        return self._named(NOT_APPLICABLE)

    @property
    def ok(self) -> bool:
        """Every check that could run passed, at least one ran, and nothing else went wrong."""
        return not self.failed and not self.errors and bool(self.passed)

    def summary_line(self) -> str:
        """`N passed, M failed`, then `, K not applicable` and `, E error(s)` when non-zero."""
        line = f"{len(self.passed)} passed, {len(self.failed)} failed"
        if self.not_applicable:
            line += f", {len(self.not_applicable)} not applicable"
        if self.errors:
            line += f", {len(self.errors)} error" + ("s" if len(self.errors) > 1 else "")
        return line

    def lines(self, verbose: bool = False) -> list[str]:
        """One line per failed (and not applicable) check, the errors, then the summary."""
        out = []
        for r in self.results:
            if r.outcome == FAILED:
                out.append(f"FAILED {r.name}: {r.detail}")
            elif r.outcome == NOT_APPLICABLE:
                out.append(f"NOT APPLICABLE {r.name}: {r.detail}")
            elif verbose:
                out.append(f"PASSED {r.name} ({r.seconds:.2f}s)")
        out += [f"ERROR {e}" for e in self.errors]
        out.append(self.summary_line())
        return out


# --------------------------------------------------------------------- comparing
def show(value: Any, limit: int = 300) -> str:
    """A one-line repr, cut at `limit` characters."""
    if isinstance(value, np.ndarray):
        text = f"array({value.tolist()!r}, dtype={value.dtype})"
    else:
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )


def same(got: Any, expected: Any) -> bool:
    """Whether `got` matches `expected`: containers of the same kind (list, tuple, dict,
    numpy array) holding matching items; numbers equal up to float rounding (a numpy scalar
    matches a Python number); everything else by `==`."""
    if isinstance(expected, bool) or expected is None:
        return got is expected
    if _is_number(expected):
        if not _is_number(got):
            return False
        return math.isclose(float(got), float(expected), rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(expected, np.ndarray):
        return (
            isinstance(got, np.ndarray)
            and got.shape == expected.shape
            and all(same(g, e) for g, e in zip(got.tolist(), expected.tolist(), strict=True))
        )
    if isinstance(expected, Mapping):
        return (
            isinstance(got, Mapping)
            and set(got) == set(expected)
            and all(same(got[k], expected[k]) for k in expected)
        )
    if isinstance(expected, (list, tuple)):
        return (
            type(got) is type(expected)
            and len(got) == len(expected)
            and all(same(g, e) for g, e in zip(got, expected, strict=True))
        )
    return type(got) is type(expected) and bool(got == expected)


def expect(what: str, got: Any, expected: Any) -> None:
    """Raise `CheckFailed("what: expected ..., got ...")` unless `got` matches `expected`."""
    if not same(got, expected):
        raise CheckFailed(f"{what}: expected {show(expected)}, got {show(got)}")


def expect_true(what: str, condition: bool, got: Any) -> None:
    """Raise `CheckFailed("expected what, got ...")` unless `condition`."""
    if not condition:
        raise CheckFailed(f"expected {what}, got {show(got)}")


def expect_raises(what: str, fn: Callable[[], Any], exc_type: type[BaseException]) -> Any:
    """The exception `fn()` raises, which must be exactly `exc_type` (not a stand-in)."""
    try:
        value = fn()
    except Exception as exc:
        if type(exc) is not exc_type:
            raise CheckFailed(
                f"{what}: expected {exc_type.__name__}, got {type(exc).__qualname__}: "
                f"{show(str(exc))}"
            ) from exc
        return exc
    raise CheckFailed(f"{what}: expected {exc_type.__name__} to be raised, got {show(value)}")


def notes_of(exc: BaseException) -> list[str]:
    return [n for n in getattr(exc, "__notes__", None) or [] if isinstance(n, str)]


# --------------------------------------------------------------------- running
class Session:
    """One run (`initialize` ... `shutdown`) in which consecutive checks execute.

    Checks build their remote objects themselves; objects that hold no state a check depends
    on are shared between the checks of a session through `shared()`, which saves starting
    worker processes again for every check. After a failed check the runner starts a new
    session, so a failure never spills into the next check.
    """

    def __init__(
        self, mode: str, groups: Mapping[str, int], options: Mapping[str, Any] | None = None
    ) -> None:
        self.mode = mode
        self.groups = dict(groups)
        self.options = dict(options or {})
        self.started = False
        self._shared: dict[tuple, Any] = {}

    def start(self) -> None:
        from twinkle_core import DeviceGroup, initialize

        initialize(
            self.mode,
            seed=SEED,
            groups=[DeviceGroup(name, n, "cpu") for name, n in sorted(self.groups.items())],
            name="twinkle-conformance",
            **self.options,
        )
        self.started = True

    def close(self) -> None:
        from twinkle_core import shutdown

        self._shared.clear()
        if self.started:
            self.started = False
            shutdown()

    def fits(self, check: Check) -> bool:
        return all(self.groups.get(name) == n for name, n in check.groups)

    def shared(self, cls: type, group: str, **kwargs: Any) -> Any:
        """`cls(remote_group=group, **kwargs)`, built once per session."""
        key = (cls, group, *sorted((k, repr(v)) for k, v in kwargs.items()))
        if key not in self._shared:
            self._shared[key] = cls(remote_group=group, **kwargs)
        return self._shared[key]


def not_applicable(check: Check, world_size: int | None) -> CheckResult | None:
    """The not-applicable result when `check` needs more processes than `world_size`."""
    if world_size is None or check.world_size <= world_size:
        return None
    return CheckResult(
        check.name,
        NOT_APPLICABLE,
        f"needs a world of {check.world_size} processes (its largest group has "
        f"{check.world_size} workers); this world has {world_size}",
    )


def _run_in(session: Session, check: Check) -> CheckResult:
    started = time.monotonic()
    outcome, detail = PASSED, ""
    try:
        if not session.started:
            try:
                session.start()
            except Exception as exc:
                outcome, detail = FAILED, f"initialize failed: {_describe(exc)}"
        if outcome == PASSED:
            check.body(session)
    except NotApplicable as exc:
        outcome, detail = NOT_APPLICABLE, " ".join(str(exc).split())
    except CheckFailed as exc:
        outcome, detail = FAILED, " ".join(str(exc).split())
    except Exception as exc:
        outcome, detail = FAILED, f"raised {_describe(exc)}"
    return CheckResult(check.name, outcome, detail, time.monotonic() - started)


def _close(session: Session, result: CheckResult) -> CheckResult:
    try:
        session.close()
    except Exception as exc:
        if result.outcome == PASSED:
            detail = f"shutdown failed: {_describe(exc)}"
            return CheckResult(result.name, FAILED, detail, result.seconds)
    return result


def run_check(
    check: Check,
    mode: str,
    *,
    options: Mapping[str, Any] | None = None,
    world_size: int | None = None,
) -> CheckResult:
    """Run `check` in a run of its own of backend `mode` and return its outcome.

    `options` go to `initialize` as backend options. With `world_size` (the number of
    processes of an SPMD job), a check whose largest group is larger is not applicable.
    """
    skipped = not_applicable(check, world_size)
    if skipped is not None:
        return skipped
    session = Session(mode, dict(check.groups), options)
    return _close(session, _run_in(session, check))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__qualname__}: {show(str(exc))}"


def select_checks(checks: Sequence[Check], select: Iterable[str] | None) -> list[Check]:
    """The checks whose name contains any of the `select` substrings (all when None)."""
    if not select:
        return list(checks)
    wanted = [s for s in select if s]
    return [c for c in checks if any(s in c.name for s in wanted)]


def run_checks(
    mode: str,
    *,
    options: Mapping[str, Any] | None = None,
    world_size: int | None = None,
    select: Iterable[str] | None = None,
    on_result: Callable[[CheckResult], None] | None = None,
) -> ConformanceReport:
    """Run every conformance check (or those whose name contains a `select` substring).

    Checks of the same world size share sessions (runs) whose groups are the union of theirs;
    a failed check ends its session, and the next check starts a new one.
    """
    from .checks import conformance_checks

    checks = select_checks(conformance_checks(), select)
    results: dict[str, CheckResult] = {}
    errors: list[str] = []

    def record(result: CheckResult) -> None:
        results[result.name] = result
        if on_result is not None:
            on_result(result)

    runnable: dict[int, list[Check]] = {}
    for check in checks:
        skipped = not_applicable(check, world_size)
        if skipped is not None:
            record(skipped)
        else:
            runnable.setdefault(check.world_size, []).append(check)
    for batch in runnable.values():
        groups: dict[str, int] = {}
        for check in batch:
            for name, n in check.groups:
                groups[name] = max(n, groups.get(name, 0))
        session = Session(mode, groups, options)
        for check in batch:
            if not session.fits(check):  # the same group name with another size: run alone
                record(run_check(check, mode, options=options))
                continue
            result = _run_in(session, check)
            if result.outcome == FAILED:
                result = _close(session, result)
                session = Session(mode, groups, options)
            record(result)
        try:
            session.close()
        except Exception as exc:
            errors.append(f"shutdown after the last check failed: {_describe(exc)}")
    return ConformanceReport([results[c.name] for c in checks], errors)

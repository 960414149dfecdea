"""Fixtures whose value is a slow, independent job, made in the background from the session's
start so that several run at once.

Most of a distributed suite's time is whole jobs (torchrun launches, driver subprocesses):
process start-ups that import torch, then timeouts the test expects to expire. One job at a
time leaves a core idle much of the time (a launcher imports torch alone; a job that waits for
a 5 s timeout uses no CPU at all). A fixture declared with `prestart.fixture` is made by a
thread pool of a few workers from the first test of the session on, in the order the
collected tests need them (waiting jobs first, see `first`), and the test that needs it only
waits for its value. Exceptions (an assertion, `pytest.fail` on a job's timeout) reach that
test as raised. Nothing changes for the test: the fixture's value is the same object the plain
fixture would have made.

    @prestart.fixture(scope="module")
    def job(tmp_path_factory):
        return run_job("reliability_job.py", tmp_path_factory.mktemp("reliability"))

    @prestart.fixture(params=[0, 2], ids=["one-launcher", "two-launchers"])
    def fail_job(tmp_path_factory, param): ...  # one job per parameter; `request.param` is it

The function's arguments are session-scoped fixtures (`tmp_path_factory`, a suite's `cluster`),
made in the main thread before the job is handed to the pool, and `param`.

Only fixtures that the session's selected tests use are made (`-k` starts no other job). A
suite's conftest turns the pool on with `prestart.session_fixture()` (an autouse session
fixture); where it is off (or for a fixture not pre-started) the function runs in the test's
own setup, as a plain fixture would. At the session's end (also when it stops early, `-x` or
Ctrl-C), jobs not started are cancelled, the processes of running `jobs.run_job` jobs are
killed, and other running ones are waited for (each bounds its own run with a timeout).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from _support import jobs

#: Set to a number to override how many jobs a suite runs at once (`session_fixture(slots)`).
SLOTS_ENV = "TWINKLE_TEST_JOBS"

_NO_PARAM = object()


class _Spec:
    def __init__(self, func: Callable[..., Any], first: bool) -> None:
        self.func = func
        self.first = first
        names = list(inspect.signature(func).parameters)
        self.takes_param = "param" in names
        self.fixtures = [n for n in names if n != "param"]  # session-scoped ones


#: (module name, fixture name) -> what makes its value
_SPECS: dict[tuple[str, str], _Spec] = {}


class _Pool:
    def __init__(self, request: pytest.FixtureRequest, slots: int) -> None:
        self.request = request  # the pool's session fixture's: gives session-scoped fixtures
        self.executor = ThreadPoolExecutor(max_workers=max(1, slots), thread_name_prefix="job")
        self.futures: dict[tuple[str, str, Any], Future] = {}

    def start(self, key: tuple[str, str, Any]) -> None:
        """Hand the fixture's job to the pool (called while the session fixture is set up)."""
        spec = _SPECS[key[:2]]
        values = {name: self.request.getfixturevalue(name) for name in spec.fixtures}
        self.futures[key] = self.executor.submit(_make, spec, values, key[2])

    def close(self) -> None:
        """Cancel the jobs not started; end the running ones (a session stopped early, by
        `-x` or Ctrl-C, must not wait for them)."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        jobs.kill_running()
        self.executor.shutdown(wait=True)


_POOL: _Pool | None = None


def _make(spec: _Spec, values: dict[str, Any], param: Any) -> Any:
    if spec.takes_param:
        return spec.func(**values, param=param)
    return spec.func(**values)


def fixture(
    func: Callable[..., Any] | None = None,
    *,
    scope: str = "module",
    params: list[Any] | None = None,
    ids: list[str] | None = None,
    first: bool = False,
):
    """A pytest fixture made by the session's pool (see the module's docstring). `first`:
    start it before the others (a job that mostly waits, so it overlaps the most work)."""

    def wrap(func: Callable[..., Any]):
        name = func.__name__
        key = (func.__module__, name)
        _SPECS[key] = _Spec(func, first)

        def value(request):
            param = getattr(request, "param", _NO_PARAM)
            spec = _SPECS[key]
            future = _POOL.futures.get((*key, param)) if _POOL is not None else None
            if future is None:  # no pool in this suite (or not pre-started): made here
                values = {name: request.getfixturevalue(name) for name in spec.fixtures}
                return _make(spec, values, param)
            return future.result()

        value.__name__ = name
        value.__doc__ = func.__doc__
        return pytest.fixture(scope=scope, params=params, ids=ids, name=name)(value)

    return wrap(func) if func is not None else wrap


def _wanted(items: list[pytest.Item]) -> list[tuple[str, str, Any]]:
    """The pre-started fixtures the tests use, in the order they are first needed
    (`first` ones before the rest)."""
    order: list[tuple[str, str, Any]] = []
    for item in items:
        module = getattr(getattr(item, "module", None), "__name__", None)
        params = getattr(getattr(item, "callspec", None), "params", {})
        for name in getattr(item, "fixturenames", ()):
            if (module, name) in _SPECS:
                key = (module, name, params.get(name, _NO_PARAM))
                if key not in order:
                    order.append(key)
    return sorted(order, key=lambda key: not _SPECS[key[:2]].first)  # stable: keeps the rest


def session_fixture(slots: int = 2):
    """An autouse session fixture that runs the pool, `slots` jobs at once: assign it in a
    suite's conftest.py, `_prestart = prestart.session_fixture()`. Two suit a 2-core machine
    when the tests themselves mostly wait for jobs: a job's processes spend much of their time
    waiting (on a launcher, a rendezvous, a timeout)."""
    slots = int(os.environ.get(SLOTS_ENV, slots))

    @pytest.fixture(scope="session", autouse=True)
    def _prestart(request):
        global _POOL
        # Its own pool, closed by itself: two suites' conftests run together (`pytest
        # tests/local tests/ray`) each make one, and the global names the latest.
        pool = _POOL = _Pool(request, slots)
        # The session's temp folder is made on first use, unguarded: two jobs calling
        # `tmp_path_factory.mktemp` at once from the pool would each make one (pytest then
        # refuses the path of one of them). Made here, in the main thread, before any job.
        request.getfixturevalue("tmp_path_factory").getbasetemp()
        try:
            for key in _wanted(request.session.items):
                pool.start(key)
            yield pool
        finally:
            if _POOL is pool:
                _POOL = None
            pool.close()

    return _prestart

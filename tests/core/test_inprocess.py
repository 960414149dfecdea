"""The user API on the in-process reference backend: the semantics every backend reproduces."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest

from twinkle_core import (
    CallTimeoutError,
    ConfigurationError,
    DeviceGroup,
    DeviceMesh,
    LazyCollect,
    NotInitializedError,
    PluginNotFoundError,
    get_device_placement,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)


@remote_class()
class Counter:
    instances = 0

    def __init__(self, start: int = 0) -> None:
        Counter.instances += 1
        self.value = start
        self.seen_ctx = get_worker_context()
        self.weight = random.random()

    @remote_function(dispatch="all", collect="none")
    def whoami(self):
        ctx = get_worker_context()
        return (ctx.rank, ctx.world_size, ctx.group_name, ctx.data_rank)

    @remote_function(dispatch="slice", collect="flatten")
    def add(self, xs):
        self.value += len(xs)
        return [x + 1 for x in xs]

    @remote_function(dispatch="all", collect="none")
    def get(self):
        return self.value

    @remote_function(dispatch="all", collect="mean")
    def weights(self):
        return self.weight

    @remote_function(dispatch="all", collect="none")
    def draw(self):
        return random.random()

    @remote_function(dispatch="all", collect="none")
    def mutate(self, data):
        data.append("worker")
        return data

    @remote_function(dispatch="all", collect="none")
    def fail(self, message):
        raise KeyError(message)

    @remote_function(dispatch="all", collect="none")
    def fail_on(self, bad_rank):
        rank = get_worker_context().rank
        if rank == bad_rank:
            raise ValueError("rank-specific failure")
        if rank > bad_rank:
            raise RuntimeError(f"other failure on {rank}")
        return rank

    @remote_function(dispatch="all", execute="first", collect="first")
    def only_first(self):
        return get_worker_context().rank

    @remote_function(dispatch="all", collect="first", lazy_collect=False)
    def eager(self):
        return "now"

    @remote_function(dispatch="all", collect="first", sync=True)
    def synced(self):
        return "synced"


@pytest.fixture
def run():
    initialize(
        "inprocess",
        seed=7,
        groups=[DeviceGroup("g", 3, "cpu"), DeviceGroup("h", 2, "cpu")],
        name="test-run",
    )
    yield
    shutdown()


def test_workers_have_their_own_context(run):
    c = Counter(remote_group="g")
    assert c.whoami()() == [(0, 3, "g", 0), (1, 3, "g", 1), (2, 3, "g", 2)]
    assert get_worker_context() is None  # the driver is no worker


def test_init_never_sees_twinkle_arguments(run):
    Counter.instances = 0
    c = Counter(5, remote_group="g")
    assert Counter.instances == 3
    assert c.get()() == [5, 5, 5]
    assert "value" not in c.__dict__  # the driver object holds no worker state


def test_plain_construction_is_a_local_object():
    c = Counter(2)
    assert c.add([1, 2]) == [2, 3]
    assert c.value == 4


def test_reading_a_workers_attribute_on_the_driver_says_where_the_state_is(run):
    c = Counter(3, remote_group="g")
    with pytest.raises(AttributeError) as info:
        c.value  # noqa: B018 - set by Counter.__init__, which ran in the workers
    message = str(info.value)
    assert message.startswith("'Counter' object has no attribute 'value' on the driver: ")
    assert "@remote_function(execute='first', collect='first') def get_value(self)" in message
    assert info.value.name == "value" and info.value.obj is c
    assert not hasattr(c, "value") and getattr(c, "missing", 7) == 7
    # A local object, and a worker's own instance, keep Python's own words.
    with pytest.raises(AttributeError, match=r"^'Counter' object has no attribute 'nope'$"):
        Counter(1).nope  # noqa: B018


class _OwnGetattr:
    def __getattr__(self, name):
        return f"own {name}"


def test_a_class_with_its_own_getattr_keeps_it():
    cls = remote_class()(type("Lookup", (_OwnGetattr,), {}))
    assert cls.__getattr__ is _OwnGetattr.__getattr__ and cls().anything == "own anything"


def test_slice_and_state(run):
    c = Counter(remote_group="g")
    assert c.add([1, 2, 3, 4])() == [2, 3, 4, 5]
    assert c.get()() == [2, 1, 1]


def test_lazy_collect_api(run):
    c = Counter(remote_group="g")
    lazy = c.whoami()
    assert isinstance(lazy, LazyCollect)
    assert lazy.done()
    assert len(lazy) == 3
    assert [r[0] for r in lazy] == [0, 1, 2]
    assert lazy() is lazy()  # cached
    assert "Counter.whoami" in repr(lazy)
    assert f"from {__file__}:" in repr(lazy)  # the user's call site, formatted when shown


def test_lazy_collect_off_returns_values():
    initialize("inprocess", groups=[DeviceGroup("g", 2)], lazy_collect=False)
    c = Counter(remote_group="g")
    assert c.get() == [0, 0]
    shutdown()


def test_per_function_lazy_and_sync(run):
    c = Counter(remote_group="g")
    assert c.eager() == "now"
    synced = c.synced()
    assert isinstance(synced, LazyCollect) and synced.resolved
    assert synced() == "synced"


def test_execute_first_runs_once(run):
    c = Counter(remote_group="g")
    assert c.only_first()() == 0


def test_remote_class_execute_first_creates_one_worker(run):
    @remote_class(execute="first")
    class Single:
        def __init__(self):
            pass

        @remote_function(dispatch="all", collect="none")
        def rank(self):
            return get_worker_context().rank

    assert Single(remote_group="g").rank()() == [0]


def test_workers_start_from_the_run_seed_with_their_own_generators(run):
    c = Counter(remote_group="g")
    # every worker seeded like a fresh process: same first draw everywhere
    w = c.weights()()
    random.seed(7)
    assert w == pytest.approx(random.random())
    draws1 = c.draw()()
    assert len(set(draws1)) == 1  # same sequence in each worker
    driver_before = random.random()
    random.seed(7)
    random.random()
    assert driver_before == random.random()  # worker draws did not touch the driver's stream


def test_arguments_and_results_are_isolated(run):
    c = Counter(remote_group="h")
    data = ["driver"]
    assert c.mutate(data)() == [["driver", "worker"], ["driver", "worker"]]
    assert data == ["driver"]


def test_failure_keeps_type_adds_call_site_and_notes(run):
    c = Counter(remote_group="g")
    lazy = c.fail("boom")  # the call site is this line
    with pytest.raises(KeyError) as info:
        lazy()
    line = test_failure_keeps_type_adds_call_site_and_notes.__code__.co_firstlineno + 2
    # A KeyError's argument is its key, so the call site goes in a note, the key untouched.
    assert info.value.args == ("boom",)
    notes = "\n".join(info.value.__notes__)
    assert f"[twinkle driver caller: {__file__}:{line}]" in notes
    assert "Counter.fail failed in group 'g' on rank 0" in notes
    assert "rank 0,1,2" in notes
    with pytest.raises(KeyError):  # the failure is cached, not re-run
        lazy()


def test_distinct_failures_are_grouped_by_error(run):
    c = Counter(remote_group="g")
    with pytest.raises(ValueError, match="rank-specific failure") as info:
        c.fail_on(1)()
    notes = "\n".join(info.value.__notes__)
    assert "on rank 1" in notes
    assert "ValueError: rank-specific failure (group 'g', rank 1" in notes
    assert "RuntimeError: other failure on 2 (group 'g', rank 2" in notes


def test_notifier_told_once_per_distinct_failure():
    sent: list[str] = []
    initialize("inprocess", groups=[DeviceGroup("g", 2)], notifier=sent.append, name="alerts")
    c = Counter(remote_group="g")
    for _ in range(3):
        with pytest.raises(KeyError):
            c.fail("same")()
    with pytest.raises(KeyError):
        c.fail("different")()
    shutdown()
    assert len(sent) == 2
    assert "twinkle run alerts: Counter.fail failed" in sent[0]
    assert "group / rank**: g / 0, 1" in sent[0]
    assert "KeyError: 'same'" in sent[0]
    assert __file__ in sent[0]


def test_a_broken_notifier_never_breaks_the_caller(caplog):
    def broken(_text):
        raise OSError("notification endpoint down")

    initialize("inprocess", groups=[DeviceGroup("g", 1)], notifier=broken)
    c = Counter(remote_group="g")
    with caplog.at_level(logging.WARNING, logger="twinkle"):
        with pytest.raises(KeyError):
            c.fail("x")()
        shutdown()
    assert "notification endpoint down" in caplog.text


def test_unresolved_failure_is_reported_at_shutdown(caplog):
    sent: list[str] = []
    initialize("inprocess", groups=[DeviceGroup("g", 1)], notifier=sent.append)
    c = Counter(remote_group="g")
    c.fail("never looked at")
    with caplog.at_level(logging.ERROR, logger="twinkle"):
        shutdown()
    assert "never collected" in caplog.text
    assert len(sent) == 1 and "never looked at" in sent[0]


def test_lazy_collect_arguments_are_resolved(run):
    producer = Counter(remote_group="g")
    consumer = Counter(remote_group="h")
    assert consumer.add(producer.add([10, 20, 30]))() == [12, 22, 32]


def test_peer_calls_from_inside_a_worker(run):
    @remote_class()
    class Caller:
        def __init__(self):
            pass

        @remote_function(dispatch="all", collect="none")
        def ask(self, other):
            return other.peer_rank()()

    @remote_class()
    class Callee:
        def __init__(self):
            pass

        @remote_function(dispatch="all", execute="peer", collect="first")
        def peer_rank(self):
            return get_worker_context().rank

    callee = Callee(remote_group="h")
    assert Caller(remote_group="g").ask(callee)() == [0, 1, 0]
    assert callee.peer_rank()() == 0  # from the driver: all workers, first result


def test_iteration_is_forwarded_to_the_first_worker(run):
    @remote_class()
    class Loader:
        def __init__(self, n):
            self.n, self.i = n, 0

        def __iter__(self):
            self.i = 0
            return self

        def __next__(self):
            if self.i >= self.n:
                raise StopIteration
            self.i += 1
            return self.i

    loader = Loader(3, remote_group="h")
    assert list(loader) == [1, 2, 3]
    assert list(loader) == [1, 2, 3]
    assert list(Loader(2)) == [1, 2]  # plain local object still iterates


def test_inline_dispatch_and_collect_functions(run):
    def reversed_shares(args, kwargs, n_workers, device_mesh):
        return [((args[0][::-1],), {}) for _ in range(n_workers)]

    @remote_class()
    class Echo:
        def __init__(self):
            pass

        @remote_function(dispatch=reversed_shares, collect=lambda results, mesh: len(results))
        def echo(self, xs):
            return xs

    assert Echo(remote_group="g").echo([1, 2])() == 3


def test_device_mesh_arranges_workers(run):
    c = Counter(remote_group="h", device_mesh=DeviceMesh.from_sizes(tp_size=2))
    assert [r[3] for r in c.whoami()()] == [0, 0]
    with pytest.raises(ConfigurationError, match="does not fit group 'g'"):
        Counter(remote_group="g", device_mesh=DeviceMesh.from_sizes(dp_size=2))


def test_global_device_mesh_is_the_default_when_it_fits():
    initialize(
        "inprocess",
        groups=[DeviceGroup("g", 4), DeviceGroup("h", 2)],
        global_device_mesh=DeviceMesh.from_sizes(dp_size=2, tp_size=2),
    )
    assert [r[3] for r in Counter(remote_group="g").whoami()()] == [0, 0, 1, 1]
    assert [r[3] for r in Counter(remote_group="h").whoami()()] == [0, 1]


def test_placement_shows_groups_classes_and_meshes(run):
    Counter(remote_group="h", device_mesh=DeviceMesh.from_sizes(tp_size=2))
    text = get_device_placement(detail=True)
    assert text.startswith("┌") and text.endswith("┘")
    assert "twinkle run test-run" in text and "mode inprocess" in text
    assert "group g  cpu  ranks 0-2  workers 3" in text
    assert "(no remote class placed yet)" in text
    assert "class Counter  mesh tp=2" in text
    assert text.count("group rank 1 ") == 1
    assert "group rank 1   global rank 1   node " in text


def test_timeout_must_be_positive():
    with pytest.raises(ConfigurationError, match=r"timeout=\.\.\.\) must be a positive"):
        remote_function(timeout=0)


def test_call_timeout_error_is_a_timeout_error():
    assert issubclass(CallTimeoutError, TimeoutError)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (dict(mode="inprocess", seed="1"), "seed"),
        (dict(mode="inprocess", groups=[1]), "DeviceGroup"),
        (dict(mode="inprocess", groups=DeviceGroup("g", 1)), "list of DeviceGroup"),
        (dict(mode="inprocess", groups=[DeviceGroup("g", 1), DeviceGroup("g", 2)]), "repeats"),
        (dict(mode="inprocess", nproc_per_node=0), "nproc_per_node"),
        (dict(mode="inprocess", lazy_collect="yes"), "lazy_collect"),
        (dict(mode="inprocess", global_device_mesh=4), "global_device_mesh"),
        (dict(mode="inprocess", name=""), "name"),
        (dict(mode="inprocess", notifier=42), "notifier"),
        (dict(mode="inprocess", bogus_option=1), "unknown options"),
        (dict(mode=""), "mode"),
    ],
)
def test_initialize_rejects_bad_arguments(kwargs, needle):
    with pytest.raises(ConfigurationError, match=needle):
        initialize(**kwargs)


def test_missing_backend_names_the_pip_command():
    with pytest.raises(PluginNotFoundError) as info:
        initialize("definitely-not-installed")
    assert "installed: inprocess" in str(info.value) or "inprocess" in str(info.value)


def test_mode_falls_back_to_environment(monkeypatch):
    monkeypatch.setenv("TWINKLE_MODE", "inprocess")
    assert initialize(groups=[DeviceGroup("g", 1)]).mode == "inprocess"


def test_double_initialize_is_an_error_and_shutdown_is_idempotent(run):
    with pytest.raises(ConfigurationError, match="already initialized"):
        initialize("inprocess")
    shutdown()
    shutdown()


def test_remote_object_needs_initialize():
    with pytest.raises(NotInitializedError, match="initialize"):
        Counter(remote_group="g")


def test_unknown_group_lists_the_groups(run):
    with pytest.raises(ConfigurationError, match="groups: 'g', 'h'"):
        Counter(remote_group="nope")


def test_unknown_dispatcher_fails_when_the_object_is_created(run):
    @remote_class()
    class Bad:
        def __init__(self):
            pass

        @remote_function(dispatch="no_such_dispatcher")
        def f(self):
            return 1

    with pytest.raises(PluginNotFoundError, match="dispatcher named 'no_such_dispatcher'"):
        Bad(remote_group="g")


def test_bad_decorator_arguments():
    with pytest.raises(ConfigurationError, match="execute"):
        remote_function(execute="some")
    with pytest.raises(ConfigurationError, match="dispatch"):
        remote_function(dispatch=3)
    with pytest.raises(ConfigurationError, match="execute"):
        remote_class(execute="peer")


def test_seed_makes_runs_reproducible():
    results = []
    for _ in range(2):
        initialize("inprocess", seed=3, groups=[DeviceGroup("g", 2)])
        results.append((Counter(remote_group="g").weights()(), np.random.rand()))
        shutdown()
    assert results[0] == results[1]


def test_removed_ncpu_proc_per_node_is_a_clear_error():
    from twinkle_core import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"ncpu_proc_per_node=\.\.\.\) was removed"):
        initialize("inprocess", ncpu_proc_per_node=4)


def test_a_timeout_error_raised_by_user_code_gets_the_call_site_in_its_message(run):
    """TimeoutError is an OSError; with one string argument its message is that argument."""

    @remote_class()
    class Slow:
        @remote_function(dispatch="all", collect="first")
        def wait(self):
            raise TimeoutError("the server did not answer")

    with pytest.raises(TimeoutError) as info:
        Slow(remote_group="g").wait()()
    assert str(info.value).startswith("[twinkle driver caller: ")
    assert str(info.value).endswith("the server did not answer")


def test_an_argument_that_cannot_be_copied_is_a_configuration_error_naming_it():
    """Issue 30, item 8: the same error type and shape as Ray's (`Class.method: argument N
    (type) cannot be ...`), not copy's bare TypeError."""
    import threading

    from twinkle_core import ConfigurationError, DeviceGroup, initialize, shutdown

    initialize("inprocess", groups=[DeviceGroup("g", 2)])
    try:
        echo = _CopyProbe(remote_group="g")
        with pytest.raises(ConfigurationError, match=r"_CopyProbe\.take: argument 1 \(lock\)"):
            echo.take(1, threading.Lock())
        assert echo.take(1, 2)() == [2, 2]  # the group is still usable
    finally:
        shutdown()


@remote_class()
class _CopyProbe:
    @remote_function(dispatch="all", collect="none")
    def take(self, a, b):
        return b

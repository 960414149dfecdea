"""The call path's shortcuts keep their meaning: cached lookups follow plugin changes, and the
fast skip over long argument lists never misses a LazyCollect; the call site, name and
per-worker calls the issue path makes cheaply still say what they said."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown
from twinkle_core.calls import MethodSpec, replace_lazy
from twinkle_core.lazy import LazyCollect
from twinkle_core.plugin import hookimpl
from twinkle_core.plugins import plugin_system


class _Marker(LazyCollect):
    """A LazyCollect subclass: the skip must treat subclasses as LazyCollects too."""


def _naive_replace(value: Any, resolve) -> Any:
    """The obvious walk, without shortcuts: the meaning `replace_lazy` must keep."""
    if isinstance(value, LazyCollect):
        return resolve(value)
    if isinstance(value, dict):
        return {k: _naive_replace(v, resolve) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_naive_replace(v, resolve) for v in value)
    return value


def _lazy(value: int) -> LazyCollect:
    return LazyCollect.of_value(("resolved", value))


_leaves = st.one_of(
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=3),
    st.none(),
    st.booleans(),
    st.integers(0, 9).map(_lazy),
    st.integers(0, 9).map(lambda v: _Marker.of_value(("marker", v))),
)
_values = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.lists(inner, max_size=6).map(tuple),
        st.dictionaries(st.text(max_size=2), inner, max_size=4),
    ),
    max_leaves=30,
)


@given(_values)
def test_replace_lazy_finds_every_lazycollect_wherever_it_is(value):
    expected = _naive_replace(value, lambda lazy: lazy())
    assert replace_lazy(value, lambda lazy: lazy()) == expected


@given(st.lists(st.one_of(st.integers(), st.floats(allow_nan=False), st.none()), max_size=50))
def test_lists_without_lazycollects_are_passed_on_as_they_are(items):
    holder = {"batch": items, "t": tuple(items)}
    out = replace_lazy(holder, lambda lazy: pytest.fail("no LazyCollect here"))
    assert out is holder


def test_a_lazycollect_after_a_long_run_of_numbers_is_replaced():
    batch = [*range(10_000), _lazy(7)]
    out = replace_lazy(batch, lambda lazy: lazy())
    assert out[-1] == ("resolved", 7) and out[:-1] == list(range(10_000))


def test_resolved_strategies_follow_a_plugin_added_at_run_time(fresh_plugins):
    spec = MethodSpec(name="f", qualname="C.f", dispatch="all", collect="picked")
    from twinkle_core.errors import PluginNotFoundError

    with pytest.raises(PluginNotFoundError):
        spec.resolved()

    def first_collect(results, device_mesh):
        return ("first", results[0])

    class Picked:
        @hookimpl
        def register_collectors(self, register):
            register("picked", first_collect)

    plugin_system().add(Picked(), "picked-plugin")
    _, collector = spec.resolved()
    assert collector.collect([1, 2], None) == ("first", 1)
    assert spec.resolved()[1] is collector  # cached while nothing changes


def test_resolved_strategies_are_looked_up_again_after_a_reset(fresh_plugins):
    spec = MethodSpec(name="f", qualname="C.f", dispatch="slice_dp", collect="mean")
    before = spec.resolved()
    assert spec.resolved() == before
    from twinkle_core.plugins import reset_plugins

    reset_plugins()
    after = spec.resolved()
    assert type(after[0]) is type(before[0]) and type(after[1]) is type(before[1])


def test_calls_with_long_batches_and_lazy_arguments_still_chain():
    initialize(mode="inprocess", groups=[DeviceGroup("g", 2, "cpu")])
    try:

        @remote_class
        class Doubler:
            @remote_function(dispatch="slice_dp", collect="flatten")
            def double(self, xs):
                return [2 * x for x in xs]

            @remote_function(dispatch="all", collect="first")
            def count(self, batch, extra):
                return (len(batch), extra)

        d = Doubler(remote_group="g")
        doubled = d.double(list(range(1000)))
        assert d.count([*range(500), doubled], "x")() == (501, "x")
        assert d.count(list(range(500)), doubled)()[1] == [2 * x for x in range(1000)]
    finally:
        shutdown()


def _call_from_a_helper(obj):
    return obj.hello(), _call_from_a_helper.__code__.co_firstlineno + 1


def test_shortcuts_of_the_issue_path_keep_what_users_and_backends_read():
    """The call site (found through a per-code-object cache), the `Class.method` name (made
    when read) and the per-worker `WorkerCall` (a named tuple) mean what they meant."""
    from twinkle_core.plugin import WorkerCall

    initialize(mode="inprocess", groups=[DeviceGroup("g", 2, "cpu")])
    try:

        @remote_class
        class Greeter:
            @remote_function(dispatch="all", collect="first")
            def hello(self):
                return "hi"

        g = Greeter(remote_group="g")
        for _ in range(3):  # the second and third calls go through the caches
            lazy, line = _call_from_a_helper(g)
            assert lazy.source.call_site.lineno == line
            assert lazy.source.call_site.function == "_call_from_a_helper"
            assert lazy.source.method == "Greeter.hello"
            assert "Greeter.hello from" in repr(lazy)
            assert lazy() == "hi"
        direct = g.hello()
        assert direct.source.call_site.function == (
            "test_shortcuts_of_the_issue_path_keep_what_users_and_backends_read"
        )
    finally:
        shutdown()
    call = WorkerCall(1, (2,), {"k": 3})
    assert (call.rank, call.args, call.kwargs) == (1, (2,), {"k": 3})
    assert call == WorkerCall(rank=1, args=(2,), kwargs={"k": 3})
    with pytest.raises(AttributeError):
        call.rank = 0  # type: ignore[misc]

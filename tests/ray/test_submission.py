"""`twinkle_ray.submission`: an actor task submitted without Ray's per-call Python is the very
task `.remote()` submits. Plain Ray actors on the session's cluster, each call checked against
Ray's own `ActorMethod.remote` made beside it."""

from __future__ import annotations

import os
import sys

import pytest
import ray
import ray.cloudpickle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twinkle_ray import submission
from twinkle_ray.submission import DirectMethod, actor_method

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Log:
    def __init__(self) -> None:
        self.seen: list = []

    def add(self, *args, **kwargs):
        self.seen.append((args, kwargs))
        return (args, kwargs)

    def one(self, value, scale=1):
        return value * scale

    def log(self):
        return list(self.seen)

    @ray.method(num_returns=2)
    def pair(self):
        return 1, 2

    def count(self, n):
        for i in range(n):  # noqa: UP028 (Ray's generator tasks call .send: no `yield from`)
            yield i

    @ray.method(retry_exceptions=[ValueError])
    def picky(self):
        return "picky"


class DiesOnce:
    """Exits its process on the first `step` of its first life; `max_task_retries` lets Ray
    run the call again on the restarted actor."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def step(self, value):
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(1)
        return value + 1


@pytest.fixture(scope="module")
def log_actor(cluster):
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield ray.remote(num_cpus=0)(Log).remote()
    finally:
        ray.shutdown()


def test_the_installed_ray_takes_the_direct_path(log_actor):
    """Ray's core worker takes the task this module builds: were a Ray upgrade to change it,
    every call would quietly go back to Ray's slower Python path; this test says so first."""
    assert submission.SUPPORTED
    assert type(actor_method(log_actor, "add")) is DirectMethod
    assert type(actor_method(log_actor, "one")) is DirectMethod


def test_methods_ray_submits_differently_stay_with_ray(log_actor):
    """Two returns, a generator, retried exceptions: Ray's own `ActorMethod`, which works."""
    for name in ("pair", "count", "picky"):
        assert type(actor_method(log_actor, name)) is ray.actor.ActorMethod, name
    assert ray.get(actor_method(log_actor, "pair").remote(), timeout=60) == [1, 2]
    assert list(ray.get(list(actor_method(log_actor, "count").remote(3)), timeout=60)) == [0, 1, 2]
    assert ray.get(actor_method(log_actor, "picky").remote(), timeout=60) == "picky"


def test_direct_and_ray_submissions_keep_one_order_and_the_same_arguments(log_actor):
    """Direct submissions and Ray's own (`.remote()`, and the direct method's fallback for an
    ObjectRef argument) interleaved: the actor runs them in the order made, each with the
    arguments Ray's path gives it (a top-level ObjectRef arrives as its value)."""
    direct = actor_method(log_actor, "add")
    own = log_actor.add
    before = len(ray.get(log_actor.log.remote(), timeout=60))
    stored = ray.put({"from": "store"})
    made = [
        direct.remote(1, "two", b"3", None),
        own.remote(1, "two", b"3", None),
        direct.remote({"step": 3, "tags": ["a"]}, scale=2.5),
        own.remote({"step": 3, "tags": ["a"]}, scale=2.5),
        direct.remote(stored),
        own.remote(stored),
        direct.remote(),
        direct.remote(x=[stored]),
        own.remote(x=[stored]),
    ]
    replies = ray.get(made, timeout=60)
    assert replies[0] == replies[1] == ((1, "two", b"3", None), {})
    assert replies[2] == replies[3] == (({"step": 3, "tags": ["a"]},), {"scale": 2.5})
    assert replies[4] == replies[5] == (({"from": "store"},), {})
    assert replies[6] == ((), {})
    assert type(replies[7][1]["x"][0]) is ray.ObjectRef  # nested refs stay refs, as Ray's do
    assert ray.get(replies[7][1]["x"][0]) == ray.get(replies[8][1]["x"][0])
    log = ray.get(log_actor.log.remote(), timeout=60)[before:]
    assert [entry[0][:1] for entry in log[:7]] == [r[0][:1] for r in replies[:7]]
    assert [entry[1].keys() for entry in log] == [r[1].keys() for r in replies]


def test_arguments_that_do_not_fit_raise_rays_own_error_every_time(log_actor):
    """A shape the method cannot take raises Ray's TypeError at submission, the first time
    and every time after (only shapes that fit are remembered); a fitting shape after it
    runs."""
    direct = actor_method(log_actor, "one")
    for args, kwargs in [((), {}), ((1, 2, 3), {}), ((1,), {"nope": 2}), ((), {"scale": 2})]:
        with pytest.raises(TypeError) as ray_error:
            log_actor.one.remote(*args, **kwargs)
        for _ in range(2):
            with pytest.raises(TypeError) as ours:
                direct.remote(*args, **kwargs)
            assert str(ours.value) == str(ray_error.value)
    assert ray.get([direct.remote(4), direct.remote(4, scale=3), direct.remote(4, 2)]) == [4, 12, 8]


_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=8),
)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(_VALUES, max_size=4),
    st.dictionaries(st.sampled_from(["a", "b", "value", "scale"]), _VALUES, max_size=3),
)
def test_any_arguments_reach_the_worker_as_rays_own_path_delivers_them(log_actor, args, kwargs):
    direct = actor_method(log_actor, "add")
    mine, theirs = ray.get(
        [direct.remote(*args, **kwargs), log_actor.add.remote(*args, **kwargs)], timeout=60
    )
    assert mine == theirs == (tuple(args), kwargs)


def test_a_method_retried_by_ray_is_retried_when_submitted_directly(log_actor, tmp_path):
    """The method's own options travel with the direct task: with `max_task_retries=1`, a call
    whose worker dies runs again on the restarted actor and returns, as with `.remote()`."""
    actor = ray.remote(num_cpus=0, max_restarts=1, max_task_retries=1)(DiesOnce).remote(
        str(tmp_path / "died")
    )
    direct = actor_method(actor, "step")
    assert type(direct) is DirectMethod
    assert ray.get(direct.remote(41), timeout=120) == 42
    assert (tmp_path / "died").exists()

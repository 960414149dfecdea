"""Tasks submitted without Ray's per-call option handling (`twinkle_ray/task_submit.py`): used
for the calls it fits, with the same results, and `.remote()` wherever Ray must decide per call
(arguments holding object refs, Ray's tracing on, methods with options of their own)."""

from __future__ import annotations

import sys

import pytest
import ray
import ray.cloudpickle
from ray.actor import ActorMethod

from twinkle_core import DeviceGroup, initialize, remote_class, remote_function, shutdown
from twinkle_ray import task_submit

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@remote_class()
class Echo:
    @remote_function(dispatch="all", collect="none")
    def back(self, value, *, key="default"):
        return [value if not isinstance(value, bytes) else len(value), key]


@pytest.fixture(scope="module")
def echo(cluster):
    initialize(
        "ray",
        address=cluster.address,
        groups=[DeviceGroup("pair", 2, "cpu")],
        cpus_per_worker=0.5,
        name="task-submit-test",
    )
    try:
        yield Echo(remote_group="pair")
    finally:
        shutdown()


def _workers(obj):
    return obj.__dict__["_twinkle_binding"].workers


def _is_public(submit) -> bool:
    return getattr(submit, "__name__", "") == "public"


@pytest.fixture
def public_calls(monkeypatch) -> list[str]:
    """The names of the methods submitted through Ray's `ActorMethod.remote` from now on."""
    names: list[str] = []
    real = ActorMethod.remote

    def counted(self, *args, **kwargs):
        names.append(self._method_name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ActorMethod, "remote", counted)
    return names


def test_the_installed_ray_fits_and_a_workers_method_is_submitted_bare(echo):
    """With the Ray this project pins, a worker method's tasks skip `.remote()`: if a Ray
    upgrade stops fitting (`_actor_method_call` changed), this fails instead of twinkle
    quietly taking the slower path."""
    assert task_submit.SUPPORTED
    submit = _workers(echo).submitter(0, "back")
    assert submit.func.__name__ == "_actor_method_call" and submit.args == ("back",)


def test_bare_tasks_give_what_remote_gives(echo, public_calls):
    """Positional and keyword arguments reach the method; each worker's result comes back."""
    assert (
        echo.back({"lr": 1e-4, "tags": ["a"]}, key="k")(60)
        == [[{"lr": 1e-4, "tags": ["a"]}, "k"]] * 2
    )
    assert echo.back(3)(60) == [[3, "default"]] * 2
    assert public_calls == []  # both went bare


def test_arguments_holding_object_refs_go_through_remote(echo, public_calls):
    """An argument put in the object store once for both workers (large and shared), or an
    object ref of the user's own, is looked at by Ray's `.remote()` (Ray Direct Transport
    triggers transfers for the refs it manages)."""
    big = b"x" * (2 * 1024 * 1024)
    assert echo.back(big)(60) == [[len(big), "default"]] * 2
    assert public_calls == ["back", "back"]
    public_calls.clear()
    ref = ray.put(7)
    assert echo.back(ref)(60) == [[7, "default"]] * 2  # Ray resolves a top-level ref
    assert public_calls == ["back", "back"]


def test_with_rays_tracing_on_the_public_path_is_taken(echo, monkeypatch):
    """Ray's tracing wrapper adds the trace context to each task: with tracing on, a method's
    submitter is `.remote()` itself."""
    from ray.util.tracing import tracing_helper

    method = _workers(echo).actor_method(0, "back")
    assert not _is_public(task_submit.task_submitter(method))
    monkeypatch.setattr(tracing_helper, "_global_is_tracing_enabled", True)
    assert _is_public(task_submit.task_submitter(method))


@pytest.mark.parametrize(
    "option, value",
    [("_tensor_transport", "nixl"), ("_num_returns", 2), ("_decorator", lambda f: f)],
)
def test_methods_with_options_of_their_own_take_the_public_path(echo, option, value):
    """A tensor transport, several returns or a decorator are decided by `.remote()`."""
    method = _workers(echo).actor_method(0, "back")
    copy = object.__new__(ActorMethod)
    copy.__dict__.update(method.__dict__)
    setattr(copy, option, value)
    assert _is_public(task_submit.task_submitter(copy))
    assert not _is_public(task_submit.task_submitter(method))

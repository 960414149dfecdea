"""A LazyCollect handed to another group's call on Ray: every built-in collector and every
result structure (dicts, lists, tuples of arrays and tensors) reaches the consumer workers
straight from the producer's object store, with the same values as `inprocess`.

Each case runs once in `inprocess` and once on the session's Ray cluster; the consumer
describes what it received (types, dtypes, shapes, exact sums), so any difference in value,
structure, slicing or type shows. On Ray, each case also checks that the driver never opened
the producer's results (`pending._values is None`): the value went worker to worker.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import ray.cloudpickle
import torch

from twinkle_core import (
    DeviceGroup,
    DeviceMesh,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_core.dispatch import FunctionDispatcher, SliceDPDispatcher
from twinkle_core.plugin import PreparedCall
from twinkle_ray.transfer import (
    STORE_BYTES,
    RemoteArray,
    RemoteCollected,
    RemoteValue,
    Stored,
    materialize,
)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

# The module's fixture drives the whole hand-off pipeline in two modes (actor start-ups with
# torch imports included) before the first test: about a minute on a quiet 2-core machine, and
# over 300 s (the suite's per-test bound) with both cores busy with another job.
pytestmark = pytest.mark.timeout(900)

#: Rows per result: small ones come back inline, large ones (4 columns of 4-byte numbers: above
#: `STORE_BYTES`) stay in the object store behind an envelope.
SMALL = 6
LARGE = STORE_BYTES // 16 + 64


def _rank() -> int:
    return get_worker_context().rank


@remote_class()
class Maker:
    """Results of every shape, different on every rank."""

    @remote_function(dispatch="all", collect="none")
    def arrays(self, n):
        return np.arange(n * 4, dtype=np.float64).reshape(n, 4) + 1000 * _rank()

    @remote_function(dispatch="all", collect="first")
    def weights(self, n):
        r = _rank()
        return {
            "w": torch.arange(n * 4, dtype=torch.float32).reshape(n, 4) + r,
            "b": torch.linspace(0, 1, n, dtype=torch.bfloat16) + r,
            "step": 3 + r,
        }

    @remote_function(dispatch="all", collect="last_pp")
    def stage(self, n):
        return (torch.full((n, 4), float(_rank()), dtype=torch.float64), f"stage{_rank()}")

    @remote_function(dispatch="all", collect="flatten")
    def samples(self, n):
        r = _rank()
        return [
            {"ids": np.arange(n * 4, dtype=np.int64) + 100 * r + i, "text": f"r{r}s{i}"}
            for i in range(2)
        ]

    @remote_function(dispatch="all", collect="concat")
    def batch(self, n):
        r = _rank()
        return {
            "x": torch.arange(n * 4, dtype=torch.float64).reshape(n, 4) * (r + 1),
            "y": np.full((n, 4), r, dtype=np.int32),
            "tags": [f"t{r}"] * n,
        }

    @remote_function(dispatch="all", collect="concat")
    def pair(self, n):
        r = _rank()
        return (torch.arange(n * 4, dtype=torch.int64).reshape(n, 4) + r, np.ones((n, 4)) * r)

    @remote_function(dispatch="all", collect="mean")
    def grads(self, n):
        r = _rank()
        return {
            "g": torch.arange(n * 4, dtype=torch.float32).reshape(n, 4) * (r + 1),
            "loss": 0.5 + r,
        }

    @remote_function(dispatch="all", collect="sum")
    def counts(self, n):
        return np.arange(n * 4, dtype=np.int64).reshape(n, 4) + _rank()

    @remote_function(dispatch="all", collect="mean")
    def scalar(self, n):
        return float(n + _rank())


def describe(value):
    """What a consumer received, exactly and in a form that compares across modes."""
    if isinstance(value, dict):
        return {"dict": {k: describe(v) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [describe(v) for v in value]]
    if isinstance(value, torch.Tensor):
        return ["tensor", str(value.dtype), list(value.shape), float(value.double().sum())]
    if isinstance(value, np.ndarray):
        return ["ndarray", str(value.dtype), list(value.shape), float(value.astype("f8").sum())]
    return [type(value).__name__, value]


@remote_class()
class Taker:
    @remote_function(dispatch="all", collect="none")
    def see_all(self, value):
        return [_rank(), describe(value)]

    @remote_function(dispatch="slice_dp", collect="none")
    def see_dp(self, value):
        return [_rank(), describe(value)]

    @remote_function(dispatch="slice", collect="none")
    def see_slice(self, value):
        return [_rank(), describe(value)]

    @remote_function(dispatch="all", collect="none")
    def see_nested(self, value, extra=None):
        return [_rank(), describe(value), describe(extra)]


#: (producer method, whether it runs on the pipeline-parallel producer).
CASES = [
    ("arrays", False),
    ("weights", False),
    ("stage", True),
    ("samples", False),
    ("batch", False),
    ("pair", False),
    ("grads", False),
    ("counts", False),
    ("scalar", False),
]


#: The cases whose collected value is a list (none, last_pp, flatten).
LISTS = ("arrays", "stage", "samples")


def drive(mode: str, **options) -> dict:
    """Every case through every consumer dispatch; on Ray, also where the values went."""
    initialize(
        mode,
        groups=[DeviceGroup("prod", 2, "cpu"), DeviceGroup("cons", 2, "cpu")],
        name=f"handoff-{mode}",
        **options,
    )
    out: dict = {}
    try:
        makers = {
            False: Maker(remote_group="prod", device_mesh=DeviceMesh.from_sizes(dp_size=2)),
            True: Maker(remote_group="prod", device_mesh=DeviceMesh.from_sizes(pp_size=2)),
        }
        taker = Taker(remote_group="cons", device_mesh=DeviceMesh.from_sizes(dp_size=2))
        for method, pp in CASES:
            for n in (SMALL, LARGE):
                # 'slice' splits lists only: the cases collected as lists also go through it.
                sees = ("see_all", "see_dp") + (("see_slice",) if method in LISTS else ())
                for see in sees:
                    lazy = getattr(makers[pp], method)(n)
                    try:
                        got = getattr(taker, see)(lazy)(120)
                    except Exception as exc:  # must fail alike in both modes
                        got = ["raised", type(exc).__name__]
                    key = f"{method}/{n}/{see}"
                    out[key] = got
                    if mode == "ray":
                        out[f"{key}/driver-opened"] = lazy.source.pending._values is not None
        # A LazyCollect nested in a dict and given as a keyword, next to plain values.
        lazy = makers[False].weights(LARGE)
        out["nested"] = taker.see_nested({"params": lazy, "lr": 0.1}, extra=[lazy, 2])(120)
        if mode == "ray":
            out["nested/driver-opened"] = lazy.source.pending._values is not None
        # Collected by user code afterwards: the driver fetches it then, and only then.
        lazy = makers[False].batch(LARGE)
        taker.see_dp(lazy)(120)
        out["collected-later"] = describe(lazy(120))
    finally:
        shutdown()
    return out


@pytest.fixture(scope="module")
def results(cluster):
    inprocess = drive("inprocess")
    on_ray = drive("ray", address=cluster.address)
    return inprocess, on_ray


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", [m for m, _ in CASES])
def test_every_collector_and_structure_gives_the_inprocess_values(results, method):
    inprocess, on_ray = results
    keys = [k for k in inprocess if k.startswith(f"{method}/")]
    assert len(keys) == (6 if method in LISTS else 4)
    for key in keys:
        assert on_ray[key] == inprocess[key], key


@pytest.mark.timeout(300)
def test_the_driver_never_opens_a_handed_off_result(results):
    _, on_ray = results
    opened = [k for k, v in on_ray.items() if k.endswith("/driver-opened") and v]
    assert opened == []
    assert on_ray["nested"] == results[0]["nested"]
    assert on_ray["collected-later"] == results[0]["collected-later"]


def test_placeholders_mirror_the_structure_and_fetch_each_result_once(cluster):
    """The placeholder for `collect='first'` of a dict of tensors is a real dict whose arrays
    are sliceable stand-ins over the producer's one stored result; the consumer side fetches
    that result once however many placeholders point into it."""
    initialize(
        "ray",
        address=cluster.address,
        groups=[DeviceGroup("prod", 2, "cpu"), DeviceGroup("cons", 2, "cpu")],
        name="handoff-placeholders",
    )
    try:
        maker = Maker(remote_group="prod")
        taker = Taker(remote_group="cons")
        workers = taker.__dict__["_twinkle_binding"].workers
        lazy = maker.weights(LARGE)
        placeholder = workers.resolve_argument(lazy, PreparedCall("m"))
        replies = lazy.source.pending._replies
        assert all(isinstance(r, Stored) for r in replies)
        assert set(placeholder) == {"w", "b", "step"}
        w, b, step = placeholder["w"], placeholder["b"], placeholder["step"]
        assert isinstance(w, RemoteArray) and w.shape == (LARGE, 4) and w.kind == "tensor"
        assert isinstance(b, RemoteArray) and len(b) == LARGE
        assert isinstance(step, RemoteValue)
        # Every placeholder points at rank 0's stored result itself (not the driver's reply).
        assert {ref for ref, _, _ in w.parts} == {replies[0].ref} == {step.ref}
        # Sliced like the real value, fetched once.
        fetched = materialize({"w": w[2:5], "b": b, "step": step})
        assert fetched["w"].tolist() == (
            torch.arange(8, 20, dtype=torch.float32).reshape(3, 4).tolist()
        )
        assert fetched["step"] == 3 and fetched["b"].dtype == torch.bfloat16
        # A mean of numbers is computed on the consumer.
        total = workers.resolve_argument(maker.scalar(4), PreparedCall("m"))
        assert isinstance(total, RemoteCollected) and materialize(total) == 4.5
        # A custom dispatcher (when core names it) gets the collected value, not stand-ins.
        custom = FunctionDispatcher(lambda args, kwargs, n, mesh: [(args, kwargs)] * n)
        whole = workers.resolve_argument(maker.weights(SMALL), PreparedCall("m", custom))
        assert isinstance(whole["w"], torch.Tensor) and whole["step"] == 3
        builtin = workers.resolve_argument(
            maker.weights(SMALL), PreparedCall("m", SliceDPDispatcher())
        )
        assert isinstance(builtin["w"], RemoteArray)
        # User code collecting it afterwards still gets the whole value.
        assert lazy()["step"] == 3
    finally:
        shutdown()


@remote_class()
class Writer:
    """Keeps the warnings its worker shows, to report them on the next call."""

    def __init__(self) -> None:
        import warnings

        self.shown: list[str] = []
        warnings.showwarning = lambda message, *args, **kwargs: self.shown.append(str(message))

    @remote_function(dispatch="all", collect="none")
    def scale(self, weights):
        w = weights["w"]
        w.mul_(2)  # against the rule: w is a view of the object store
        return float(w[1, 1])

    @remote_function(dispatch="all", collect="none")
    def shown_warnings(self):
        return [m for m in self.shown if "wrote in place" in m]


def test_a_method_writing_into_a_received_view_is_warned_about(cluster):
    """A tensor of 1 MiB or more handed over from another group is a zero-copy view of the
    stored result; writing into it in place is reported in the worker once per method."""
    initialize(
        "ray",
        address=cluster.address,
        groups=[DeviceGroup("prod", 1, "cpu"), DeviceGroup("cons", 2, "cpu")],
        name="handoff-write-guard",
    )
    try:
        maker = Maker(remote_group="prod")
        writer = Writer(remote_group="cons")
        rows = (1 << 20) // 16 + 16  # w is (rows, 4) float32: just over 1 MiB
        for _ in range(2):
            # Both workers read the one stored result: on one node, each may see the other's
            # write too (10 -> 20): the hazard the warning is about.
            assert set(writer.scale(maker.weights(rows))(120)) <= {10.0, 20.0}
        shown = writer.shown_warnings()(60)
        assert [len(s) for s in shown] == [1, 1], shown  # once per method and worker
        assert "Writer.scale wrote in place into 1 tensor argument(s) (1.0 MiB)" in shown[0][0]
    finally:
        shutdown()


@remote_class()
class CopyingWriter(Writer):
    """The same write, declared: `writable_args=True` gives the method private copies."""

    @remote_function(dispatch="all", collect="none", writable_args=True)
    def scale(self, weights):
        w = weights["w"]
        w.mul_(2)
        return float(w[1, 1])


def test_writable_args_gives_the_method_private_copies(cluster):
    initialize(
        "ray",
        address=cluster.address,
        groups=[DeviceGroup("prod", 1, "cpu"), DeviceGroup("cons", 2, "cpu")],
        name="handoff-writable-args",
    )
    try:
        maker = Maker(remote_group="prod")
        writer = CopyingWriter(remote_group="cons")
        rows = (1 << 20) // 16 + 16
        weights = maker.weights(rows)
        for _ in range(3):  # the stored result is never changed: every worker sees 5 -> 10
            assert writer.scale(weights)(120) == [10.0, 10.0]
        assert writer.shown_warnings()(60) == [[], []]  # nothing written into a shared view
        assert float(weights()["w"][1, 1]) == 5.0
    finally:
        shutdown()

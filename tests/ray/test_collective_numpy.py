"""Collective groups on Ray: numpy arrays mean the same as in-process, the same values and
the same types (issue 30, item 3: torch.distributed takes only tensors, so Ray's members hand
it tensors sharing the arrays' memory); a member killed mid-broadcast is a clear error on the
others (issue 30, item 4)."""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import pytest
import ray.cloudpickle

from twinkle_core import (
    CollectiveBrokenError,
    ConfigurationError,
    DeviceGroup,
    collective,
    collective_group,
    get_worker_context,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@remote_class()
class NumpyRole:
    def __init__(self):
        self.w = np.arange(4, dtype=np.float32) + 100 * get_worker_context().rank

    @remote_function(dispatch="all", collect="flatten")
    def sync(self, name):
        c = collective(name)
        c.broadcast([self.w], src=0)
        (r,) = c.all_reduce([np.full(2, float(c.rank + 1))], op="sum")
        g = c.all_gather(np.array([float(c.rank)]))
        return [
            [
                type(self.w).__name__,
                self.w.tolist(),
                type(r).__name__,
                r.tolist(),
                [type(x).__name__ for x in g],
                [x.tolist() for x in g],
            ]
        ]

    @remote_function(dispatch="all", collect="flatten")
    def push(self, name):
        collective(name).broadcast([self.w], src=0)
        return [[type(self.w).__name__, self.w.tolist()]]

    @remote_function(dispatch="all", collect="flatten")
    def into_read_only(self, name):
        frozen = np.zeros(2)
        frozen.flags.writeable = False
        try:
            collective(name).broadcast([frozen], src=0)
        except ConfigurationError as exc:
            return [str(exc)]
        return ["no error"]


#: Written down: member 0's weights everywhere, 1+2+3 summed, every rank gathered, all numpy.
EXPECTED = [
    ["ndarray", [0.0, 1.0, 2.0, 3.0], "ndarray", [6.0, 6.0], ["ndarray"] * 3, [[0.0], [1.0], [2.0]]]
] * 3


@pytest.mark.parametrize("mode", ["inprocess", "ray"])
def test_numpy_collectives_give_the_same_values_and_types(mode, cluster):
    options = {"address": cluster.address} if mode == "ray" else {}
    initialize(mode, groups=[DeviceGroup("a", 2, "cpu"), DeviceGroup("b", 1, "cpu")], **options)
    try:
        a, b = NumpyRole(remote_group="a"), NumpyRole(remote_group="b")
        collective_group("np", [a, b], timeout=60)
        # In-process members run one after another: a broadcast whose source runs first is
        # what they can do (docs/data.md); every collective on Ray.
        pa, pb = a.push("np"), b.push("np")  # both issued before either is waited for
        pushed = pa() + pb()
        assert pushed == [[row[0], row[1]] for row in EXPECTED]
        if mode == "ray":
            got_a, got_b = a.sync("np"), b.sync("np")
            assert got_a() + got_b() == EXPECTED
            ra, rb = a.into_read_only("np"), b.into_read_only("np")
            messages = ra() + rb()
            assert all("read-only numpy array" in m for m in messages), messages
    finally:
        shutdown()


@remote_class()
class Broadcaster:
    """Waits in a broadcast from member 0 until its source arrives, or the group breaks."""

    def __init__(self):
        self.w = np.zeros(4, dtype=np.float32)

    @remote_function(dispatch="all", collect="flatten")
    def pid(self):
        return [os.getpid()]

    @remote_function(dispatch="all", collect="flatten")
    def receive(self, name):
        collective(name).broadcast([self.w], src=0)
        return [self.w.tolist()]


def test_a_member_killed_mid_broadcast_fails_the_others_clearly_and_breaks_the_group(cluster):
    """Issue 30, item 4: the surviving member gets a CollectiveBrokenError naming the collective
    group, its members and the call site (not gloo's raw 'Connection closed by peer'), and a
    later collective fails at once saying the group is broken, not the same raw error again."""
    initialize(
        "ray",
        address=cluster.address,
        groups=[DeviceGroup("src", 1, "cpu"), DeviceGroup("dst", 1, "cpu")],
    )
    try:
        source, receiver = Broadcaster(remote_group="src"), Broadcaster(remote_group="dst")
        collective_group("weights", [source, receiver], timeout=60)
        waiting = receiver.receive("weights")  # member 1 waits for member 0's broadcast
        time.sleep(1.0)
        os.kill(source.pid()()[0], signal.SIGKILL)  # the source dies before it sends
        start = time.monotonic()
        with pytest.raises(CollectiveBrokenError) as info:
            waiting(timeout=60)
        took = time.monotonic() - start
        text = str(info.value)
        assert took < 30, took
        assert "collective group 'weights': broadcast on member rank 1 failed" in text, text
        assert "Broadcaster on 'src': ranks 0-0" in text and "broken" in text
        assert os.path.basename(__file__) in text  # the driver's call site
        start = time.monotonic()
        with pytest.raises(CollectiveBrokenError, match="broken until it is formed again"):
            receiver.receive("weights")(timeout=60)
        assert time.monotonic() - start < 10  # at once, not another transport timeout
    finally:
        shutdown()

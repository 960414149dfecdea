"""Transports on Ray, in runs of their own: an unknown transport name is refused clearly, and
the transport groups a run made are left at its shutdown (`twinkle_ray.transports`)."""

from __future__ import annotations

import logging
import sys

import pytest
import ray.cloudpickle
import torch
from test_transport import ROWS, Consumer, Producer

from twinkle_core import (
    ConfigurationError,
    DeviceGroup,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_ray.transports import GROUPS

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.mark.timeout(300)
def test_an_unknown_transport_name_is_a_configuration_error(cluster):
    @remote_class()
    class Odd:
        @remote_function(transport="carrier-pigeon")
        def f(self):
            return 1

    initialize("ray", address=cluster.address, groups=[DeviceGroup("g", 1, "cpu")], name="odd")
    try:
        with pytest.raises(ConfigurationError, match=r"carrier-pigeon.*(known|registered)"):
            Odd(remote_group="g").f()
    finally:
        shutdown()


@pytest.mark.timeout(300)
def test_transport_groups_are_left_at_shutdown(cluster):
    initialize(
        "ray",
        address=cluster.address,
        groups=[DeviceGroup("p", 1, "cpu"), DeviceGroup("c", 1, "cpu")],
        name="transport-shutdown",
    )
    try:
        producer, consumer = Producer(remote_group="p"), Consumer(remote_group="c")
        (got,) = consumer.take(producer.weights_gloo(ROWS))(120)
        assert len(got[1]) == 1
        assert GROUPS.names() == got[1]
    finally:
        shutdown()
    assert GROUPS.names() == []


@pytest.mark.timeout(300)
def test_a_consumer_on_another_device_type_gets_held_results_from_their_holder(cluster, caplog):
    """A consumer group on (fake) GPUs cannot receive over gloo: no transport group is made,
    its workers fetch the held result from the producer through the object store, and the
    driver says so once."""
    initialize(
        "ray",
        address=cluster.address,
        groups=[DeviceGroup("p", 1, "cpu"), DeviceGroup("gpu", [0], "cuda")],
        name="transport-devices",
    )
    try:
        producer, consumer = Producer(remote_group="p"), Consumer(remote_group="gpu")
        with caplog.at_level(logging.INFO, logger="twinkle"):
            for _ in range(2):
                lazy = producer.weights_gloo(ROWS)
                ((described, groups),) = consumer.take(lazy)(120)
                assert type(lazy.source.pending.wait_replies(60)[0]).__name__ == "Held"
                assert groups == [] and GROUPS.names() == []
                assert described["step"] == 7
                assert described["w"][3] == float(torch.arange(ROWS * 256.0).double().sum())
        lines = [r.getMessage() for r in caplog.records if "cannot receive over" in r.getMessage()]
        assert len(lines) == 1, lines
        assert "Consumer (group 'gpu'): its cuda workers cannot receive over 'gloo'" in lines[0]
    finally:
        shutdown()

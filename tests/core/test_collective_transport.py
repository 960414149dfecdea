"""`@remote_function(transport=...)` and the `auto` rule of `twinkle_core.transport`."""

from __future__ import annotations

import logging

import pytest

from twinkle_core import (
    ConfigurationError,
    DeviceGroup,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_core.remote import SPEC_ATTR
from twinkle_core.transport import (
    AUTO_MIN_BYTES,
    Transport,
    check_known,
    choose_transport,
)


class Nccl(Transport):
    device_types = ("cuda",)


class Gloo(Transport):
    device_types = ("cpu",)
    min_bytes = 4 * AUTO_MIN_BYTES


class Missing(Transport):
    device_types = ("cuda",)

    @classmethod
    def is_available(cls) -> bool:
        return False


REGISTERED = {"missing": Missing, "nccl": Nccl, "gloo": Gloo}
BIG = 64 * AUTO_MIN_BYTES


def test_the_method_spec_carries_the_transport():
    @remote_class()
    class Model:
        @remote_function(collect="first", transport="nccl")
        def weights(self):
            return 1

        @remote_function
        def plain(self):
            return 2

    assert getattr(Model.weights, SPEC_ATTR).transport == "nccl"
    assert getattr(Model.plain, SPEC_ATTR).transport == "auto"


@pytest.mark.parametrize("bad", [None, "", "  ", 3])
def test_a_transport_must_be_a_name(bad):
    with pytest.raises(ConfigurationError, match=r"transport=\.\.\.\) must be 'auto'"):
        remote_function(transport=bad)


def test_unknown_names_list_the_known_ones():
    assert check_known("gloo", REGISTERED, "x") == "gloo"
    assert check_known("object_store", (), "x") == "object_store"
    with pytest.raises(ConfigurationError, match="known: 'auto', 'object_store', 'gloo'"):
        check_known("hccl", ["gloo"], "Model.weights: transport")


def test_auto_keeps_small_payloads_on_the_object_store():
    assert choose_transport("auto", AUTO_MIN_BYTES - 1, "cuda", "ray", REGISTERED) == "object_store"
    assert choose_transport("auto", BIG, "cuda", "ray", REGISTERED) == "nccl"  # skips missing


def test_auto_uses_a_transport_only_where_it_serves_and_pays():
    not_nccl = lambda cls: cls is not Nccl  # noqa: E731  # a backend that cannot carry it
    assert choose_transport("auto", BIG, "cuda", "x", REGISTERED, carries=not_nccl) == (
        "object_store"
    )
    assert choose_transport("auto", BIG, "cpu", "ray", REGISTERED) == "gloo"
    assert choose_transport("auto", 2 * AUTO_MIN_BYTES, "cpu", "ray", REGISTERED) == "object_store"
    assert choose_transport("object_store", BIG, "cuda", "ray", REGISTERED) == "object_store"


def test_a_named_transport_that_cannot_carry_falls_back_with_one_log_line(caplog):
    caplog.set_level(logging.INFO, logger="twinkle")
    for _ in range(3):
        got = choose_transport("nccl", BIG, "cpu", "ray", REGISTERED, method="Model.weights")
        assert got == "object_store"
    assert choose_transport("missing", BIG, "cuda", "ray", REGISTERED) == "object_store"
    lines = [r.getMessage() for r in caplog.records if "Model.weights" in r.getMessage()]
    assert lines == [
        "twinkle: Model.weights: transport 'nccl' cannot move cpu tensors in mode 'ray'; "
        "using the object store"
    ]


def test_an_unregistered_transport_fails_when_the_object_is_created():
    @remote_class()
    class Model:
        @remote_function(collect="first", transport="object_store")
        def fine(self):
            return 1

        @remote_function(collect="first", transport="carrier-pigeon")
        def weights(self):
            return 1

    initialize("inprocess", groups=[DeviceGroup("g", 1)])
    try:
        with pytest.raises(ConfigurationError, match=r"Model.weights: transport: no transport"):
            Model(remote_group="g")
    finally:
        shutdown()


def test_a_transport_registered_through_the_hook_is_accepted_by_name(fresh_plugins):
    from twinkle_core import hookimpl
    from twinkle_core.plugins import plugin_system, registered_names

    class Plugin:
        @hookimpl
        def register_transports(self, register):
            register("fastlane", Gloo)

    @remote_class()
    class Uses:
        @remote_function(dispatch="all", transport="fastlane")
        def weights(self):
            return 1

    initialize("inprocess", groups=[DeviceGroup("g", 1)])
    try:
        with pytest.raises(ConfigurationError, match="no transport named 'fastlane'"):
            Uses(remote_group="g")
        plugin_system().add(Plugin(), "fastlane-plugin")
        assert "fastlane" in registered_names("transports")
        assert Uses(remote_group="g").weights()() == [1]
    finally:
        shutdown()


def test_one_name_registered_by_two_plugins_is_a_conflict(fresh_plugins):
    """Each transport has one definition: a second registration of a name is refused when
    the name is looked up, and both plugins show the conflict (`twinkle plugins`)."""
    from twinkle_core import DuplicatePluginError, hookimpl
    from twinkle_core.plugin import registered_transports
    from twinkle_core.plugins import plugin_system

    class Lane(Transport):
        device_types = ("cpu",)

    def plugin(cls):
        class P:
            @hookimpl
            def register_transports(self, register):
                register("lane", cls)

        return P()

    system = plugin_system()
    system.add(plugin(Lane), "first-plugin")
    assert registered_transports()["lane"] is Lane
    system.add(plugin(Gloo), "second-plugin")
    with pytest.raises(DuplicatePluginError, match="'lane' is registered twice"):
        system.get("transports", "lane")
    assert "lane" not in registered_transports()  # refused, never one of the two at random


def test_a_backend_rule_keeps_auto_from_picking_a_transport_it_still_carries_when_named():
    """The Ray backend's rule: CPU tensors never go over a torch.distributed transport under
    `auto` (the object store hands them over zero-copy), but `gloo` named still works."""

    def auto_picks(cls, device_type):
        return not (device_type == "cpu" and cls is Gloo)

    assert choose_transport("auto", BIG, "cpu", "ray", REGISTERED, auto_picks=auto_picks) == (
        "object_store"
    )
    assert choose_transport("gloo", BIG, "cpu", "ray", REGISTERED, auto_picks=auto_picks) == "gloo"
    assert choose_transport("auto", BIG, "cuda", "ray", REGISTERED, auto_picks=auto_picks) == "nccl"


def test_auto_device_types_limit_what_auto_picks_but_not_what_is_named():
    """Ray's `nixl` moves CPU tensors when named, but `auto` keeps them on the object store."""

    class Nixl(Transport):
        device_types = ("cpu", "cuda")
        auto_device_types = ("cuda",)

    registered = {"nixl": Nixl}
    assert choose_transport("auto", BIG, "cuda", "ray", registered) == "nixl"
    assert choose_transport("auto", BIG, "cpu", "ray", registered) == "object_store"
    assert choose_transport("nixl", BIG, "cpu", "ray", registered) == "nixl"

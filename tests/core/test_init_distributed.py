"""`twinkle_core.init_distributed()`: one function for every mode, answered by the backend
that runs the worker through the `twinkle_init_distributed` hook (torch is never imported
here: the hook implementations below stand for a backend's)."""

from __future__ import annotations

import datetime

import pytest

from twinkle_core import (
    ConfigurationError,
    DeviceGroup,
    DeviceMesh,
    hookimpl,
    init_distributed,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_core.plugin import WorkerContext, worker_context
from twinkle_core.plugins import plugin_system


class _FakeBackendPlugin:
    """A backend's implementation: answers for its own workers only."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    @hookimpl
    def twinkle_init_distributed(self, context, platform, backend, timeout):
        if context is None or context.mode != "fake":
            return None
        self.seen.append((context.rank, platform.device_type, backend, timeout))
        return len(self.seen) == 1  # created the first time, already there afterwards


def _context(mode: str, rank: int = 1) -> WorkerContext:
    return WorkerContext(
        rank=rank,
        world_size=2,
        local_rank=rank,
        local_world_size=2,
        group_name="g",
        device_mesh=DeviceMesh.from_sizes(dp_size=2),
        mode=mode,
    )


@pytest.fixture
def only_core(monkeypatch, fresh_plugins):
    monkeypatch.setenv("TWINKLE_DISABLE_PLUGIN_AUTOLOAD", "1")


def test_the_backend_of_the_worker_answers_with_the_resolved_settings(only_core):
    plugin = _FakeBackendPlugin()
    plugin_system().add(plugin, name="fake-backend")
    with worker_context(_context("fake")):
        assert init_distributed(timeout=30) is True
        assert init_distributed("cpu", backend="gloo") is False
    assert plugin.seen == [
        (1, "cpu", "gloo", datetime.timedelta(seconds=30)),  # cpu platform -> gloo
        (1, "cpu", "gloo", datetime.timedelta(seconds=1800)),
    ]


def test_a_worker_no_plugin_answers_for_gets_a_clear_error(only_core):
    plugin_system().add(_FakeBackendPlugin(), name="fake-backend")
    with worker_context(_context("elsewhere")):
        with pytest.raises(ConfigurationError, match="no installed plugin sets up") as info:
            init_distributed()
    assert "mode 'elsewhere'" in str(info.value) and "mode='ray'" in str(info.value)
    with pytest.raises(ConfigurationError, match="outside any twinkle worker"):
        init_distributed()


@pytest.mark.parametrize("bad", [0, -1.0, "30", True])
def test_a_bad_timeout_is_refused_naming_the_argument(only_core, bad):
    with pytest.raises(ConfigurationError, match=r"init_distributed\(timeout=\.\.\.\)"):
        init_distributed(timeout=bad)


@remote_class()
class _Worker:
    @remote_function(dispatch="all", collect="none")
    def setup(self):
        try:
            init_distributed()
        except ConfigurationError as exc:
            return str(exc)
        return "created"


def test_inprocess_workers_get_a_clear_error_naming_the_modes_that_work():
    initialize(mode="inprocess", groups=[DeviceGroup("g", ranks=2, device_type="cpu")])
    try:
        messages = _Worker(remote_group="g").setup()()
    finally:
        shutdown()
    assert len(messages) == 2
    for text in messages:
        assert "group 'g' runs in mode 'inprocess'" in text
        assert "mode='local'" in text and "mode='ray'" in text

"""Plugin discovery through the `twinkle` entry-point group."""

from __future__ import annotations

import json

import pytest

from twinkle_core import (
    DeviceGroup,
    DuplicatePluginError,
    PluginLoadError,
    PluginNotFoundError,
    initialize,
    remote_class,
    remote_function,
    shutdown,
)
from twinkle_core.plugins import get_plugin, plugin_system
from twinkle_core.tools.cli import main as cli_main

from .plugin_factory import make_plugin

GOOD = """
    from twinkle_core import hookimpl

    def reverse(args, kwargs, n_workers, device_mesh):
        return [((list(reversed(args[0])),), {}) for _ in range(n_workers)]

    def total(results, device_mesh):
        return sum(sum(r) for r in results)

    @hookimpl
    def register_dispatchers(register):
        register("reverse", reverse)

    @hookimpl
    def register_collectors(register):
        register("total", "{module}:total")
"""


@pytest.fixture
def site(tmp_path, monkeypatch, fresh_plugins):
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_third_party_plugin_is_listed_and_used_by_name(site, capsys):
    make_plugin(site, "twinkle-demo", "twinkle_demo", GOOD.replace("{module}", "twinkle_demo"))
    info = {p.name: p for p in plugin_system().plugins()}
    assert info["twinkle_demo"].registers["dispatchers"] == ["reverse"]
    assert info["twinkle_demo"].distribution == "twinkle-demo"
    assert info["twinkle_demo"].error is None

    @remote_class()
    class W:
        def __init__(self):
            pass

        @remote_function(dispatch="reverse", collect="total")
        def f(self, xs):
            assert xs == [3, 2, 1]
            return xs

    initialize("inprocess", groups=[DeviceGroup("g", 2)])
    assert W(remote_group="g").f([1, 2, 3])() == 12
    shutdown()
    assert cli_main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "twinkle_demo  [twinkle-demo 1.0]" in out
    assert "dispatchers: reverse" in out


def test_plugins_json_shape(site, capsys):
    make_plugin(site, "twinkle-demo", "twinkle_demo", GOOD.replace("{module}", "twinkle_demo"))
    assert cli_main(["plugins", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["name"] == "core"
    for item in data:
        assert set(item) == {"name", "distribution", "version", "registers", "error"}
        assert set(item["registers"]) == {
            "backends",
            "dispatchers",
            "collectors",
            "platforms",
            "notifiers",
            "transports",
        }
    core = data[0]
    assert core["registers"]["backends"] == ["inprocess"]
    assert "slice_dp" in core["registers"]["dispatchers"]
    assert "cpu" in core["registers"]["platforms"]


def test_broken_plugin_is_reported_without_breaking_core(site, capsys):
    make_plugin(site, "twinkle-broken", "twinkle_broken", "raise ImportError('needs libfoo')\n")
    info = {p.name: p for p in plugin_system().plugins()}
    assert "needs libfoo" in info["twinkle_broken"].error
    assert get_plugin("dispatchers", "slice") is not None
    assert cli_main(["plugins"]) == 0
    assert "ERROR: ImportError: needs libfoo" in capsys.readouterr().out


def test_asking_for_the_broken_plugin_chains_its_error(site):
    make_plugin(
        site,
        "twinkle-broken",
        "twinkle_broken",
        "raise ImportError('needs libfoo')\n",
        entry_point="fancy",
    )
    with pytest.raises(PluginNotFoundError, match="failed to load") as info:
        get_plugin("backends", "fancy")
    assert isinstance(info.value.__cause__, ImportError)
    assert "needs libfoo" in str(info.value.__cause__)


def test_lazy_target_that_fails_to_import_chains_the_error(site):
    make_plugin(
        site,
        "twinkle-lazy",
        "twinkle_lazy",
        """
        from twinkle_core import hookimpl

        @hookimpl
        def register_backends(register):
            register("lazy", "twinkle_lazy_missing_module:Backend")
        """,
    )
    assert "lazy" in plugin_system().names("backends")  # listing imported nothing
    with pytest.raises(PluginLoadError, match="could not be imported") as info:
        initialize("lazy")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_two_plugins_with_one_name_is_an_error_naming_both(site):
    code = """
        from twinkle_core import hookimpl

        @hookimpl
        def register_collectors(register):
            register("clash", lambda results, mesh: results)
    """
    make_plugin(site, "twinkle-a", "twinkle_a", code)
    make_plugin(site, "twinkle-b", "twinkle_b", code)
    with pytest.raises(DuplicatePluginError) as info:
        get_plugin("collectors", "clash")
    assert "twinkle_a" in str(info.value) and "twinkle_b" in str(info.value)
    infos = {p.name: p for p in plugin_system().plugins()}
    assert "registered twice" in (infos["twinkle_b"].error or "")


def test_override_replaces_a_builtin(site, monkeypatch):
    # Only this plugin: an installed twinkle-local overrides `cpu` too (a clash by design).
    monkeypatch.setenv("TWINKLE_PLUGINS", "twinkle_cpu")
    make_plugin(
        site,
        "twinkle-cpu",
        "twinkle_cpu",
        """
        from twinkle_core import hookimpl
        from twinkle_core.platform import CpuPlatform

        class FancyCpu(CpuPlatform):
            pass

        @hookimpl
        def register_platforms(register):
            register("cpu", FancyCpu, override=True)
        """,
    )
    assert get_plugin("platforms", "cpu").__name__ == "FancyCpu"


def test_incompatible_plugin_is_not_loaded(site):
    make_plugin(
        site,
        "twinkle-future",
        "twinkle_future",
        GOOD.replace("{module}", "twinkle_future"),
        requires=("twinkle-core>=99",),
    )
    info = {p.name: p for p in plugin_system().plugins()}["twinkle_future"]
    assert "requires twinkle-core>=99" in info.error
    assert "pip install" in info.error
    assert "reverse" not in plugin_system().names("dispatchers")


def test_disable_autoload_keeps_only_core(site, monkeypatch):
    make_plugin(site, "twinkle-demo", "twinkle_demo", GOOD.replace("{module}", "twinkle_demo"))
    monkeypatch.setenv("TWINKLE_DISABLE_PLUGIN_AUTOLOAD", "1")
    names = [p.name for p in plugin_system().plugins()]
    assert names == ["core"]
    assert "slice_dp" in plugin_system().names("dispatchers")


def test_plugin_allow_list(site, monkeypatch):
    make_plugin(site, "twinkle-demo", "twinkle_demo", GOOD.replace("{module}", "twinkle_demo"))
    make_plugin(site, "twinkle-other", "twinkle_other", "x = 1\n")
    monkeypatch.setenv("TWINKLE_PLUGINS", "twinkle_other")
    names = {p.name for p in plugin_system().plugins()}
    assert "twinkle_demo" not in names and {"core", "twinkle_other"} <= names


@pytest.mark.parametrize(
    ("kind", "name", "extra", "package"),
    [
        ("backends", "ray", "ray", "twinkle-ray"),
        ("backends", "local", "local", "twinkle-local"),
        ("notifiers", "dingtalk", "dingtalk", "twinkle-notify-dingtalk"),
        ("platforms", "cuda", "local", "twinkle-local"),
    ],
)
def test_missing_known_plugin_gives_the_install_command(
    fresh_plugins, monkeypatch, kind, name, extra, package
):
    """The extra comes from core's own metadata (the `twinkle.install_hints` entry points
    beside its extras), wherever the process runs; the command is the one that works from a
    clone today (issue 31: the packages are not published), and the message says what will do
    once they are."""
    monkeypatch.setenv("TWINKLE_DISABLE_PLUGIN_AUTOLOAD", "1")
    with pytest.raises(PluginNotFoundError) as info:
        get_plugin(kind, name)
    message = str(info.value)
    assert (
        f'Install {package} with: python scripts/install.py "twinkle-core[{extra}]" in a clone '
        f'of twinkle (once the packages are published: pip install "twinkle-core[{extra}]")'
    ) in message
    assert "installed:" in message


def test_initialize_ray_without_the_backend(fresh_plugins, monkeypatch):
    monkeypatch.setenv("TWINKLE_DISABLE_PLUGIN_AUTOLOAD", "1")
    pattern = r"named 'ray'.*installed: inprocess.*twinkle-core\[ray\]"
    with pytest.raises(PluginNotFoundError, match=pattern):
        initialize(mode="ray")


def test_register_hook_that_raises_is_blamed_alone(site):
    make_plugin(
        site,
        "twinkle-raises",
        "twinkle_raises",
        """
        from twinkle_core import hookimpl

        @hookimpl
        def register_dispatchers(register):
            raise RuntimeError("bad hook")
        """,
    )
    info = {p.name: p for p in plugin_system().plugins()}["twinkle_raises"]
    assert "register_dispatchers failed: RuntimeError: bad hook" in info.error
    assert "slice" in plugin_system().names("dispatchers")


def test_a_misspelled_hook_is_reported_and_fails_loudly_when_used(site, capsys):
    """pluggy's check_pending for every plugin: `register_collector` (no s) is no hook."""
    make_plugin(
        site,
        "twinkle-typo",
        "twinkle_typo",
        """
        from twinkle_core import hookimpl

        @hookimpl
        def register_collector(register):
            register("never_registered", lambda results, mesh: results)

        @hookimpl
        def register_collectors(register):
            register("typo_total", lambda results, mesh: sum(results))
        """,
        requires=("twinkle-core>=0.2",),
    )
    assert cli_main(["plugins", "--json"]) == 0
    listed = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert "register_collector" in listed["twinkle_typo"]["error"]
    assert "a typo?" in listed["twinkle_typo"]["error"]
    with pytest.raises(PluginLoadError, match="register_collector"):
        get_plugin("collectors", "typo_total")
    assert "never_registered" not in plugin_system().names("collectors")

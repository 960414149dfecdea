"""Which driver variables travel to workers: the pass-through list, never credentials."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from twinkle_ray.envvars import (
    DEFAULT_PASSTHROUGH,
    NODE_ESSENTIALS,
    passthrough_patterns,
    scrubbed_environ,
    select,
)

NAME = st.from_regex(r"[A-Z][A-Z0-9_]{0,20}", fullmatch=True)
SECRETISH = st.builds(
    lambda pre, word, post, case: case(f"{pre}{word}{post}"),
    st.sampled_from(["TWINKLE_", "NCCL_", "TORCH_", "TWINKLE_DB_"]),
    st.sampled_from(
        ["SECRET", "Secret", "TOKEN", "PASSWORD", "PASS", "WEBHOOK", "API_KEY", "AUTH", "Auth"]
    ),
    st.sampled_from(["", "_X", "_2"]),
    st.sampled_from([str, str.title]),
)


@given(env=st.dictionaries(NAME, st.text(max_size=5), max_size=20))
def test_only_listed_variables_travel(env):
    forwarded = select(env, passthrough_patterns(["MYAPP_*", "EXACT_ONE"]))
    assert set(forwarded) <= set(env)
    for name in forwarded:
        assert (
            name == "EXACT_ONE"
            or name.startswith(("MYAPP_", "TWINKLE_"))
            or any(
                name == p or (p.endswith("*") and name.startswith(p[:-1]))
                for p in DEFAULT_PASSTHROUGH
            )
        )
    if "TWINKLE_MODE" in env:
        assert "TWINKLE_MODE" in forwarded


@given(secret=SECRETISH)
def test_credentials_never_travel_through_a_wildcard(secret):
    env = {secret: "credential", "TWINKLE_MODE": "ray"}
    assert select(env, passthrough_patterns()) == {"TWINKLE_MODE": "ray"}
    # Named exactly by the user, it is sent: the user asked for it.
    assert secret in select(env, passthrough_patterns([secret]))


def test_variables_a_plugin_declares_secret_never_travel():
    """The filter asks the plugins (hook `twinkle_secret_env_vars`); no plugin is named here."""
    from twinkle_core import hookimpl
    from twinkle_core.plugins import plugin_system, reset_plugins

    class Chat:
        @hookimpl
        def twinkle_secret_env_vars(self):
            return ["TWINKLE_MYCHAT_*"]

    reset_plugins()
    plugin_system().add(Chat(), name="mychat")
    try:
        env = {"TWINKLE_MYCHAT_ROBOT": "kw", "twinkle_mychat_at": "1", "TWINKLE_SEED": "1"}
        assert select(env, passthrough_patterns()) == {"TWINKLE_SEED": "1"}
        # Not even when the user names it exactly, nor through the node essentials.
        assert select(env, passthrough_patterns(["TWINKLE_MYCHAT_ROBOT"])) == {"TWINKLE_SEED": "1"}
        assert select(env, (*NODE_ESSENTIALS, "TWINKLE_*"), guard_secrets=False) == {
            "TWINKLE_SEED": "1"
        }
    finally:
        reset_plugins()


def test_scrubbed_environ_keeps_node_essentials_and_restores(monkeypatch):
    monkeypatch.setenv("TW_SOME_SECRET_VALUE", "x")
    monkeypatch.setenv("TWINKLE_FLAG", "1")
    monkeypatch.setenv("RAY_SOMETHING_TOKEN", "ray-needs-it")
    before = dict(os.environ)
    with scrubbed_environ(passthrough_patterns(), NODE_ESSENTIALS):
        assert "TW_SOME_SECRET_VALUE" not in os.environ
        assert os.environ["TWINKLE_FLAG"] == "1" and "PATH" in os.environ
        assert os.environ["RAY_SOMETHING_TOKEN"] == "ray-needs-it"  # Ray's own settings stay
    assert dict(os.environ) == before

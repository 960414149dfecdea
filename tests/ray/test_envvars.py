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
    lambda pre, word, post: f"{pre}{word}{post}",
    st.sampled_from(["TWINKLE_", "NCCL_", "TORCH_", "TWINKLE_DINGTALK_"]),
    st.sampled_from(["SECRET", "TOKEN", "PASSWORD", "WEBHOOK", "API_KEY"]),
    st.sampled_from(["", "_X", "_2"]),
)


@given(env=st.dictionaries(NAME, st.text(max_size=5), max_size=20))
def test_only_listed_variables_travel(env):
    forwarded = select(env, passthrough_patterns(["MYAPP_*", "EXACT_ONE"]))
    assert set(forwarded) <= set(env)
    for name in forwarded:
        assert name == "EXACT_ONE" or name.startswith(("MYAPP_", "TWINKLE_")) or any(
            name == p or (p.endswith("*") and name.startswith(p[:-1])) for p in DEFAULT_PASSTHROUGH
        )
    if "TWINKLE_MODE" in env:
        assert "TWINKLE_MODE" in forwarded


@given(secret=SECRETISH)
def test_credentials_never_travel_through_a_wildcard(secret):
    env = {secret: "credential", "TWINKLE_MODE": "ray"}
    assert select(env, passthrough_patterns()) == {"TWINKLE_MODE": "ray"}
    # Named exactly by the user, it is sent: the user asked for it.
    assert secret in select(env, passthrough_patterns([secret]))


def test_dingtalk_settings_stay_on_the_driver():
    env = {"TWINKLE_DINGTALK_KEYWORD": "kw", "TWINKLE_DINGTALK_AT_ALL": "1", "TWINKLE_SEED": "1"}
    assert select(env, passthrough_patterns()) == {"TWINKLE_SEED": "1"}


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

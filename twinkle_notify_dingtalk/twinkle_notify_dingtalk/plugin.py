"""twinkle plugin entry point: registers the `dingtalk` notifier (imported on first use)."""

from __future__ import annotations

from twinkle_core import hookimpl


@hookimpl
def register_notifiers(register) -> None:
    register("dingtalk", "twinkle_notify_dingtalk.notifier:DingTalkNotifier")


@hookimpl
def twinkle_secret_env_vars() -> list[str]:
    """The robot's token, secret and settings are read on the driver only (it notifies)."""
    return ["TWINKLE_DINGTALK_*"]

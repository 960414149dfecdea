"""twinkle plugin entry point: registers the `dingtalk` notifier (imported on first use)."""

from __future__ import annotations

from twinkle_core import hookimpl


@hookimpl
def register_notifiers(register) -> None:
    register("dingtalk", "twinkle_notify_dingtalk.notifier:DingTalkNotifier")

"""twinkle-notify-dingtalk: twinkle failure alerts posted to a DingTalk group robot.

Use ``initialize(..., notifier=DingTalkNotifier(webhook=..., secret=...))``, or
``notifier='dingtalk'`` with TWINKLE_DINGTALK_WEBHOOK / TWINKLE_DINGTALK_SECRET set.
"""

from __future__ import annotations

from importlib.metadata import version as _dist_version

__version__ = _dist_version("twinkle-notify-dingtalk")  # written once: in pyproject.toml

from .notifier import (
    DINGTALK_MAX_BODY_BYTES,
    ENV_PREFIX,
    MAX_BODY_BYTES,
    SECRET_ENV_VARS,
    DeliveryStats,
    DetachedDingTalkNotifier,
    DingTalkNotifier,
)
from .signing import signature, signed_url

__all__ = [
    "DINGTALK_MAX_BODY_BYTES",
    "ENV_PREFIX",
    "MAX_BODY_BYTES",
    "SECRET_ENV_VARS",
    "DeliveryStats",
    "DetachedDingTalkNotifier",
    "DingTalkNotifier",
    "__version__",
    "signature",
    "signed_url",
]

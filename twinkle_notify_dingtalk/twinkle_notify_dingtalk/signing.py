"""DingTalk's signed ("加签") security mode for custom robots.

The robot checks two query parameters appended to the webhook URL: `timestamp`, the current
time in milliseconds (rejected when more than one hour away from DingTalk's clock), and `sign`,
the URL-encoded base64 of HMAC-SHA256 keyed with the secret over ``f"{timestamp}\\n{secret}"``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import urllib.parse


def signature(timestamp_ms: int, secret: str) -> str:
    """The base64 HMAC-SHA256 signature of ``"{timestamp_ms}\\n{secret}"`` (not URL-encoded)."""
    message = f"{timestamp_ms}\n{secret}".encode()
    digest = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def now_ms() -> int:
    """The current time in milliseconds, as DingTalk expects it."""
    return round(time.time() * 1000)


def signed_url(webhook: str, secret: str | None, timestamp_ms: int | None = None) -> str:
    """`webhook` with `timestamp` and `sign` appended when `secret` is set, else unchanged."""
    if not secret:
        return webhook
    ts = now_ms() if timestamp_ms is None else timestamp_ms
    sign = urllib.parse.quote_plus(signature(ts, secret))
    separator = "&" if urllib.parse.urlsplit(webhook).query else "?"
    return f"{webhook}{separator}timestamp={ts}&sign={sign}"

"""One HTTP POST to the robot, and what its answer means.

Standard-library `urllib` is enough for a few small JSON POSTs and keeps the notifier free of
HTTP-client dependencies that could clash with a training environment's pins. It honours the
usual proxy variables (`https_proxy`, `no_proxy`).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass

#: DingTalk error codes worth retrying: -1 "system busy", 130101 "send too fast".
TRANSIENT_ERRCODES = {-1, 130101}
THROTTLED = 130101

#: What to check when DingTalk refuses a message, by errcode.
HINTS = {
    310000: (
        "the robot's security settings refused it: set keyword=... to the robot's custom "
        "keyword, secret=... to its signing secret (SEC...), or allow this machine's IP"
    ),
    300001: "check the access_token of the webhook URL",
    300005: "check the access_token of the webhook URL",
    400102: "the robot is disabled; re-enable it in the group settings",
    460101: "the message is too long",
    130101: "the robot sent more than 20 messages a minute and is throttled for a while",
}

_MAX_RESPONSE_BYTES = 65536


@dataclass(frozen=True)
class Outcome:
    """The result of one attempt: delivered, or why not and whether retrying may help."""

    ok: bool
    transient: bool = False
    errcode: int | None = None
    detail: str = ""

    @property
    def throttled(self) -> bool:
        return self.errcode == THROTTLED


def _errmsg(raw: bytes) -> tuple[int | None, str]:
    try:
        data = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return None, raw[:200].decode("utf-8", "replace")
    if not isinstance(data, dict):
        return None, str(data)[:200]
    code = data.get("errcode")
    return (code if isinstance(code, int) else None), str(data.get("errmsg", ""))


def post(url: str, body: bytes, timeout: float) -> Outcome:
    """POST `body` (JSON) to `url` within `timeout` seconds; never raises for network errors."""
    request = urllib.request.Request(
        url,
        data=body,
        headers={"Content-Type": "application/json; charset=utf-8"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read(_MAX_RESPONSE_BYTES)
    except urllib.error.HTTPError as exc:
        try:
            raw = exc.read(_MAX_RESPONSE_BYTES) if exc.fp else b""
        except OSError:
            raw = b""
        finally:
            exc.close()  # the error holds the connection open until closed
        code, message = _errmsg(raw)
        transient = exc.code >= 500 or exc.code == 429
        detail = f"HTTP {exc.code} {exc.reason}" + (f": {message}" if message else "")
        return Outcome(False, transient, code, detail)
    except (TimeoutError, urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        return Outcome(False, True, None, f"connection failed: {type(exc).__name__}: {reason}")
    code, message = _errmsg(raw)
    if code == 0:
        return Outcome(True, errcode=0)
    if code is None:
        return Outcome(False, False, None, f"unexpected answer (not DingTalk JSON): {message!r}")
    detail = f"errcode {code}: {message}"
    if code in HINTS:
        detail += f" ({HINTS[code]})"
    return Outcome(False, code in TRANSIENT_ERRCODES, code, detail)

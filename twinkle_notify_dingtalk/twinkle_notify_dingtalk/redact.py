"""Keeping the robot's credentials out of logs, warnings, exception messages and reprs.

The webhook's `access_token` query parameter, the signing secret and the per-request `sign`
are credentials: anyone holding the token (and secret) can post into the group.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable

MASK = "***"

_PARAM_RE = re.compile(r"(?i)\b(access_token|sign)=([^&\s'\"<>]+)")


def redact_url(url: str) -> str:
    """The URL with `access_token` and `sign` values replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return _PARAM_RE.sub(lambda m: f"{m.group(1)}={MASK}", url)
    if not parts.query:
        return url
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    cleaned = [(k, MASK if k.lower() in ("access_token", "sign") else v) for k, v in query]
    # safe="*" keeps the mask readable instead of %2A%2A%2A.
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(cleaned, safe="*")))


class Redactor:
    """Replaces every known secret value (and URL credentials) in a piece of text."""

    def __init__(self, secrets: Iterable[str | None]) -> None:
        # Longest first, so a secret containing another is masked whole.
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def __call__(self, text: object) -> str:
        out = str(text)
        for secret in self._secrets:
            out = out.replace(secret, MASK)
            quoted = urllib.parse.quote_plus(secret)
            if quoted != secret:
                out = out.replace(quoted, MASK)
        return _PARAM_RE.sub(lambda m: f"{m.group(1)}={MASK}", out)

"""`DingTalkNotifier`: twinkle failure alerts posted to a DingTalk group robot.

Sending never hurts the job. twinkle-core owns the queueing: its alert thread calls `send()`,
which delivers synchronously on that thread, each alert (retries included) bounded by
`timeout`. Throttling and the per-minute limit hold alerts back; they are folded into one
summary message, sent when a slot frees (`send_held()`, called back by core's thread) or at
`close()`, which waits a bounded time. Failures are logged as warnings on the
`twinkle.dingtalk` logger, with the robot's credentials masked.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import random
import re
import threading
import time
import urllib.parse
import weakref
from collections.abc import Iterable
from typing import Any

from twinkle_core import ConfigurationError, Notifier

from . import transport
from .ratelimit import RateLimiter, limiter_for
from .redact import Redactor, redact_url
from .signing import signed_url
from .truncate import fit_text, json_cost, sanitize

log = logging.getLogger("twinkle.dingtalk")

ENV_WEBHOOK = "TWINKLE_DINGTALK_WEBHOOK"
ENV_SECRET = "TWINKLE_DINGTALK_SECRET"
ENV_KEYWORD = "TWINKLE_DINGTALK_KEYWORD"
ENV_AT_MOBILES = "TWINKLE_DINGTALK_AT_MOBILES"
ENV_AT_ALL = "TWINKLE_DINGTALK_AT_ALL"
ENV_TIMEOUT = "TWINKLE_DINGTALK_TIMEOUT"
ENV_MAX_PER_MINUTE = "TWINKLE_DINGTALK_MAX_PER_MINUTE"
ENV_KEEP = "TWINKLE_DINGTALK_KEEP_ENV"
#: Variables holding credentials: removed from `os.environ` by `from_env()` (unless
#: TWINKLE_DINGTALK_KEEP_ENV=1) and never to be forwarded to worker processes.
SECRET_ENV_VARS = (ENV_WEBHOOK, ENV_SECRET)
#: Every variable name with this prefix is notifier configuration, not for workers.
ENV_PREFIX = "TWINKLE_DINGTALK_"

#: DingTalk rejects bodies over 20000 bytes (errcode 460101); keep a margin below it.
DINGTALK_MAX_BODY_BYTES = 20000
MAX_BODY_BYTES = 19000
#: The title is what the chat list previews; longer titles are cut.
MAX_TITLE_CHARS = 120
#: How long to hold messages after DingTalk answered 130101 (it throttles for minutes).
THROTTLE_PAUSE = 60.0
#: Retry back-off: first wait, growth factor, cap (seconds); jittered by +-20 %.
BACKOFF_FIRST, BACKOFF_FACTOR, BACKOFF_MAX = 0.2, 2.0, 2.0
#: The retry jitter's own generator: never the global one a seeded user run relies on.
_JITTER = random.Random()
#: Titles listed in one summary message.
SUMMARY_MAX_TITLES = 20
#: Shorter than this left of a deadline, a post is not even tried (it could not succeed).
MIN_ATTEMPT = 0.01
#: Shortest delay `send_held()` asks for: never a busy loop, even when racing for a slot.
MIN_RECHECK = 0.01

_MOBILE_RE = re.compile(r"^\+?[0-9][0-9-]{2,30}$")


@dataclasses.dataclass
class _Alert:
    title: str
    text: str
    created: float  # time.time(), for the summary


@dataclasses.dataclass
class DeliveryStats:
    """Counters of what happened to the alerts given to one notifier.

    `dropped` counts alerts held back by the rate limit that could not be sent before
    `close()`; alerts twinkle-core's queue had no room for are counted there
    (`AlertQueue.dropped`).
    """

    sent: int = 0
    failed: int = 0
    dropped: int = 0
    summarized: int = 0
    summaries: int = 0


class DingTalkNotifier(Notifier):
    """Posts twinkle failure alerts as markdown messages to a DingTalk custom robot.

    `webhook` is the robot's URL (``https://oapi.dingtalk.com/robot/send?access_token=...``);
    `secret` its signing secret ("加签", starts with SEC) when the robot uses signatures;
    `keyword` one of its custom keywords when it uses keywords (added to every message);
    `at_mobiles` / `at_all` whom to mention; `timeout` the seconds one alert may take to
    deliver, retries included; `max_per_minute` the messages per minute this process sends to
    the robot (DingTalk throttles above 20), the overflow folded into one summary message.

    `send()` delivers synchronously. Through `initialize(notifier=...)` it runs on
    twinkle-core's alert thread, so no user call ever waits for the robot. Used on its own it
    blocks its caller for at most `timeout` seconds; to send in the background, feed it through
    `twinkle_core.notify.AlertQueue` (see docs/notifiers.md).
    """

    def __init__(
        self,
        webhook: str,
        secret: str | None = None,
        *,
        at_mobiles: Iterable[str] = (),
        at_all: bool = False,
        keyword: str | None = None,
        timeout: float = 5.0,
        max_per_minute: int = 20,
    ) -> None:
        self._webhook = _check_webhook(webhook)
        self._secret = _check_optional_str("secret", secret, "the robot's signing secret (SEC...)")
        token = _access_token(self._webhook)
        self._redact = Redactor([token, self._secret])
        self.keyword = _check_optional_str("keyword", keyword, "one of the robot's keywords")
        self.at_mobiles = _check_mobiles(at_mobiles)
        if not isinstance(at_all, bool):
            raise ConfigurationError(
                f"DingTalkNotifier(at_all=...) must be True or False, got {at_all!r}"
            )
        self.at_all = at_all
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigurationError(
                f"DingTalkNotifier(timeout=...) must be a positive number of seconds, got "
                f"{timeout!r}"
            )
        self.timeout = float(timeout)
        if (
            isinstance(max_per_minute, bool)
            or not isinstance(max_per_minute, int)
            or (max_per_minute < 1)
        ):
            raise ConfigurationError(
                f"DingTalkNotifier(max_per_minute=...) must be a positive integer (DingTalk "
                f"allows 20), got {max_per_minute!r}"
            )
        self.max_per_minute = max_per_minute
        parts = urllib.parse.urlsplit(self._webhook)
        self._limiter: RateLimiter = limiter_for(
            f"{parts.scheme}://{parts.netloc}{parts.path}?{token}"
        )
        self.stats = DeliveryStats()
        # One delivery at a time: twinkle calls from its one alert thread, but a direct user
        # (or the exit hook) may call from others. Held while posting, so never taken without
        # a bound by anything that has one (`flush`, `close`).
        self._lock = threading.Lock()
        self._held: list[_Alert] = []  # alerts folded into the next summary message
        _live.add(self)

    # ------------------------------------------------------------------ public API
    @classmethod
    def from_env(cls) -> DingTalkNotifier:
        """Build from TWINKLE_DINGTALK_* variables (used for ``initialize(notifier='dingtalk')``).

        Required: TWINKLE_DINGTALK_WEBHOOK. Optional: TWINKLE_DINGTALK_SECRET, _KEYWORD,
        _AT_MOBILES (comma-separated), _AT_ALL (1/0), _TIMEOUT (seconds), _MAX_PER_MINUTE.
        The webhook and secret are then removed from `os.environ` so that processes started
        later (Ray's raylet and workers, subprocesses) do not inherit them; set
        TWINKLE_DINGTALK_KEEP_ENV=1 to keep them.
        """
        env = _read_env()
        webhook = env.get(ENV_WEBHOOK, "").strip()
        if not webhook:
            raise ConfigurationError(
                f"notifier='dingtalk' reads the robot's webhook URL from ${ENV_WEBHOOK}, which "
                f"is not set; export {ENV_WEBHOOK}=https://oapi.dingtalk.com/robot/send?"
                f"access_token=... (and {ENV_SECRET}=SEC... if the robot signs), or pass "
                f"notifier=DingTalkNotifier(webhook=..., secret=...)"
            )
        kwargs: dict[str, Any] = {}
        if env.get(ENV_KEYWORD, "").strip():
            kwargs["keyword"] = env[ENV_KEYWORD].strip()
        if env.get(ENV_AT_MOBILES, "").strip():
            kwargs["at_mobiles"] = [m.strip() for m in env[ENV_AT_MOBILES].split(",") if m.strip()]
        if env.get(ENV_AT_ALL, "").strip():
            kwargs["at_all"] = _env_bool(ENV_AT_ALL, env[ENV_AT_ALL])
        if env.get(ENV_TIMEOUT, "").strip():
            kwargs["timeout"] = _env_number(ENV_TIMEOUT, env[ENV_TIMEOUT], float)
        if env.get(ENV_MAX_PER_MINUTE, "").strip():
            kwargs["max_per_minute"] = _env_number(ENV_MAX_PER_MINUTE, env[ENV_MAX_PER_MINUTE], int)
        try:
            notifier = cls(webhook, env.get(ENV_SECRET, "").strip() or None, **kwargs)
        except ConfigurationError as exc:
            raise ConfigurationError(f"from the {ENV_PREFIX}* environment: {exc}") from None
        _scrub_env()
        return notifier

    def send(self, title: str, text: str) -> None:
        """Deliver one alert now; never raises. Blocks at most `timeout` seconds.

        Over the per-minute limit, or while DingTalk throttles the robot, the alert is held
        back and listed in one summary message instead, sent as soon as a slot frees (by
        `send_held()`, a later `send()`, `flush()` or `close()`). Calls from several threads
        are delivered one after another.
        """
        try:
            alert = _Alert(sanitize(title), sanitize(text), time.time())
            with self._lock:
                self._handle(alert)
                # At most one post per call: a held summary only while nothing was posted.
                self._summarize_if_free(time.monotonic() + self.timeout)
        except Exception as exc:  # never into the caller
            log.warning("twinkle: could not send DingTalk alert: %s", self._redact(exc))

    def send_held(self) -> float | None:
        """Send the summary of held-back alerts if a slot is free now.

        Returns the seconds until it should be called again, or None when nothing is held;
        twinkle-core's alert thread calls back accordingly, so the summary goes out as soon as
        the rate limit allows, without a thread of the notifier's own.
        """
        try:
            with self._lock:
                self._summarize_if_free(time.monotonic() + self.timeout)
                if not self._held:
                    return None
                return max(MIN_RECHECK, self._limiter.wait_time(self.max_per_minute))
        except Exception as exc:  # pragma: no cover - defensive: never into core's thread
            log.warning("twinkle: DingTalk summary failed: %s", self._redact(exc))
            return None

    def flush(self, timeout: float | None = None) -> bool:
        """Send the held-back summary if a slot frees within `timeout` seconds (default:
        the notifier's `timeout`); True when nothing is held afterwards. Never waits longer."""
        limit = self.timeout if timeout is None else max(0.0, timeout)
        deadline = time.monotonic() + limit
        if not self._held:
            return True
        if not self._lock.acquire(timeout=limit):
            return False
        try:
            self._flush_locked(deadline)
            return not self._held
        finally:
            self._lock.release()

    def close(self, timeout: float | None = None) -> None:
        """Send the held-back summary if a slot frees within `timeout` seconds (default:
        2 x `timeout`); otherwise log the held alerts' titles as not delivered.

        twinkle-core calls it from its alert thread at `shutdown()`, with what is left of
        shutdown's deadline. Afterwards the notifier still works.
        """
        limit = 2 * self.timeout if timeout is None else max(0.0, timeout)
        started = time.monotonic()
        if not self._held:
            return
        if not self._lock.acquire(timeout=limit):
            log.warning(
                "twinkle: gave up waiting for DingTalk alerts after %.1fs: another thread is "
                "still posting (the robot is unreachable, slow or throttling)",
                time.monotonic() - started,
            )
            return
        try:
            self._flush_locked(started + limit)
            self._drop_held("no slot freed before close")
        finally:
            self._lock.release()

    def __repr__(self) -> str:
        return (
            f"DingTalkNotifier(webhook={redact_url(self._webhook)!r}, "
            f"signed={self._secret is not None}, keyword={self.keyword!r}, "
            f"at_mobiles=<{len(self.at_mobiles)} number(s)>, at_all={self.at_all}, "
            f"timeout={self.timeout}, max_per_minute={self.max_per_minute})"
        )

    # Copies within the process are the same notifier; a pickled copy (another process)
    # carries no credentials and sends nothing.
    def __copy__(self) -> DingTalkNotifier:
        return self

    def __deepcopy__(self, memo: dict) -> DingTalkNotifier:
        return self

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (DetachedDingTalkNotifier, (repr(self),))

    # ------------------------------------------------------------------ internals
    # Everything below runs with `self._lock` held.
    def _handle(self, alert: _Alert) -> None:
        if self._held or not self._limiter.try_acquire(self.max_per_minute):
            self._fold(alert, f"the rate limit of {self.max_per_minute} messages a minute")
            return
        outcome = self._deliver(alert.title, alert.text)
        if outcome.ok:
            self.stats.sent += 1
        elif outcome.throttled:
            self._limiter.pause(THROTTLE_PAUSE)
            self._fold(alert, "DingTalk throttling (errcode 130101)")
        else:
            self.stats.failed += 1

    def _fold(self, alert: _Alert, why: str) -> None:
        self._held.append(alert)
        log.warning(
            "twinkle: DingTalk alert %r held back by %s; it will be listed in a summary message",
            self._redact(alert.title),
            why,
        )

    def _summarize_if_free(self, deadline: float) -> None:
        if self._held and self._limiter.try_acquire(self.max_per_minute):
            self._summarize(deadline)

    def _summarize(self, deadline: float) -> None:
        """Post the summary of the held alerts (a send slot is already taken)."""
        folded, self._held = self._held, []
        title, text = self._summary(folded)
        outcome = self._deliver(title, text, deadline)
        if outcome.ok:
            self.stats.summaries += 1
            self.stats.summarized += len(folded)
        elif outcome.throttled:
            self._limiter.pause(THROTTLE_PAUSE)
            self._held = folded + self._held
        else:
            self.stats.failed += len(folded)

    def _flush_locked(self, deadline: float) -> None:
        """Send the summary while slots free before `deadline` (waiting on the limiter)."""
        while self._held:
            remaining = deadline - time.monotonic()
            if remaining < MIN_ATTEMPT or not self._limiter.acquire(
                self.max_per_minute, remaining - MIN_ATTEMPT
            ):
                return  # no slot frees in time to post: do not wait for nothing
            self._summarize(deadline)

    def _drop_held(self, why: str) -> None:
        if not self._held:
            return
        log.warning(
            "twinkle: %d DingTalk alert(s) were not delivered: the robot may send only %d "
            "messages a minute and %s; their titles: %s",
            len(self._held),
            self.max_per_minute,
            why,
            "; ".join(self._redact(a.title) for a in self._held[:SUMMARY_MAX_TITLES]),
        )
        self.stats.dropped += len(self._held)
        self._held = []

    def _payload(self, title: str, text: str) -> bytes:
        """The JSON body of one markdown message, within DingTalk's size limit."""
        title = title.strip() or "twinkle alert"
        if self.keyword and self.keyword not in title:
            title = f"[{self.keyword}] {title}"
        if len(title) > MAX_TITLE_CHARS:
            title = title[: MAX_TITLE_CHARS - 1] + "…"
        prefix = f"{self.keyword}\n\n" if self.keyword and self.keyword not in text else ""
        # DingTalk shows a mention only if "@<mobile>" appears in the markdown text.
        suffix = ""
        if self.at_mobiles:
            suffix = "\n\n" + " ".join(f"@{m}" for m in self.at_mobiles)
        message: dict[str, Any] = {
            "msgtype": "markdown",
            "markdown": {"title": title, "text": ""},
            "at": {"atMobiles": list(self.at_mobiles), "isAtAll": self.at_all},
        }
        overhead = len(_dumps(message)) + json_cost(prefix) + json_cost(suffix)
        budget = max(0, MAX_BODY_BYTES - overhead)
        body = fit_text(text, budget)
        if self.keyword and self.keyword not in prefix + body:
            # The keyword was in the part that was cut: add it after all.
            prefix = f"{self.keyword}\n\n"
            body = fit_text(text, max(0, budget - json_cost(prefix)))
        message["markdown"]["text"] = prefix + body + suffix
        return _dumps(message)

    def _deliver(self, title: str, text: str, deadline: float | None = None) -> transport.Outcome:
        """Post one message, retrying transient failures with back-off, within `timeout`
        (and before `deadline`, a `time.monotonic()` value, when given)."""
        body = self._payload(title, text)
        started = time.monotonic()
        budget_end = started + self.timeout
        deadline = budget_end if deadline is None else min(deadline, budget_end)
        delay = BACKOFF_FIRST
        attempt = 0
        if deadline - started < MIN_ATTEMPT:
            outcome = transport.Outcome(False, True, None, "no time left before the deadline")
            log.warning(
                "twinkle: DingTalk alert %r not delivered: %s",
                self._redact(title),
                outcome.detail,
            )
            return outcome
        while True:
            attempt += 1
            remaining = deadline - time.monotonic()
            outcome = transport.post(signed_url(self._webhook, self._secret), body, remaining)
            if outcome.ok:
                return outcome
            remaining = deadline - time.monotonic()
            wait = min(delay, BACKOFF_MAX) * _JITTER.uniform(0.8, 1.2)
            if not outcome.transient or remaining <= wait + 0.05:
                break
            time.sleep(wait)
            delay *= BACKOFF_FACTOR
        verdict = "gave up after" if outcome.transient else "refused by DingTalk after"
        log.warning(
            "twinkle: DingTalk alert %r not delivered (%s %d attempt(s) within %.1fs): %s",
            self._redact(title),
            verdict,
            attempt,
            deadline - started,
            self._redact(outcome.detail),
        )
        return outcome

    def _summary(self, folded: list[_Alert]) -> tuple[str, str]:
        n = len(folded)
        title = f"twinkle: {n} more alert(s) held back by the robot's rate limit"
        lines = [
            f"### {title}",
            f"DingTalk robots may post {self.max_per_minute} messages a minute; these alerts "
            "were folded into this summary (details are in the job's logs):",
            "",
        ]
        for alert in folded[:SUMMARY_MAX_TITLES]:
            when = time.strftime("%H:%M:%S", time.localtime(alert.created))
            lines.append(f"- {when} {alert.title}")
        if n > SUMMARY_MAX_TITLES:
            lines.append(f"- ... and {n - SUMMARY_MAX_TITLES} more")
        return title, "\n".join(lines)


class DetachedDingTalkNotifier(Notifier):
    """What a pickled `DingTalkNotifier` becomes in another process: no credentials, no sends."""

    def __init__(self, description: str) -> None:
        self.description = description

    def send(self, title: str, text: str) -> None:
        log.warning(
            "twinkle: %s was copied into another process without its credentials and does "
            "not send; alert %r dropped (alerts are sent by the driver)",
            self.description,
            title,
        )

    def __repr__(self) -> str:
        return f"Detached{self.description}"


def _dumps(message: dict) -> bytes:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _check_webhook(webhook: Any) -> str:
    if not isinstance(webhook, str) or not webhook.strip():
        raise ConfigurationError(
            f"DingTalkNotifier(webhook=...) must be the robot's webhook URL "
            f"(https://oapi.dingtalk.com/robot/send?access_token=...), got {type(webhook).__name__}"
        )
    webhook = webhook.strip()
    try:
        parts = urllib.parse.urlsplit(webhook)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigurationError(
            f"DingTalkNotifier(webhook=...) must be an http(s) URL like "
            f"https://oapi.dingtalk.com/robot/send?access_token=..., got {redact_url(webhook)!r}; "
            f"copy it from the robot's settings in the DingTalk group"
        )
    if not _access_token(webhook):
        raise ConfigurationError(
            f"DingTalkNotifier(webhook=...) has no access_token query parameter "
            f"({redact_url(webhook)!r}); copy the complete webhook URL from the robot's settings"
        )
    return webhook


def _access_token(webhook: str) -> str:
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(webhook).query)
    return (query.get("access_token") or [""])[0]


def _check_optional_str(name: str, value: Any, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"DingTalkNotifier({name}=...) must be None or a non-empty string ({what}), got "
            f"{type(value).__name__}"
        )
    return value.strip()


def _check_mobiles(value: Any) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)):
        raise ConfigurationError(
            f"DingTalkNotifier(at_mobiles=...) must be a list of phone numbers, got the single "
            f"string {value!r}; write at_mobiles=[{value!r}]"
        )
    try:
        mobiles = tuple(value)
    except TypeError:
        raise ConfigurationError(
            f"DingTalkNotifier(at_mobiles=...) must be a list of phone numbers, got {value!r}"
        ) from None
    for m in mobiles:
        if not isinstance(m, str) or not _MOBILE_RE.match(m.strip()):
            raise ConfigurationError(
                f"DingTalkNotifier(at_mobiles=...) entries must be phone numbers as strings "
                f"(digits, optional leading + and dashes), got {m!r}"
            )
    return tuple(m.strip() for m in mobiles)


def _env_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"${name} must be 1/0 (or true/false), got {raw!r}")


def _env_number(name: str, raw: str, kind: type) -> Any:
    try:
        return kind(raw.strip())
    except ValueError:
        raise ConfigurationError(
            f"${name} must be {'an integer' if kind is int else 'a number'}, got {raw!r}"
        ) from None


# Values taken out of os.environ by from_env(), so a second initialize() in the same process
# can still build the notifier from the "environment".
_scrubbed: dict[str, str] = {}


def _read_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    for name, value in _scrubbed.items():
        env.setdefault(name, value)
    return env


def _scrub_env() -> None:
    if os.environ.get(ENV_KEEP, "").strip() not in ("", "0"):
        return
    for name in SECRET_ENV_VARS:
        value = os.environ.pop(name, None)
        if value is not None:
            _scrubbed[name] = value


# Notifiers alive in this process. At interpreter exit, those still holding alerts back (a
# notifier used on its own, over the rate limit) get one bounded chance to send the summary.
# Core's shutdown(), registered later by initialize(), runs before this hook (atexit is
# last-in, first-out) and has already closed the notifier it used.
_live: weakref.WeakSet[DingTalkNotifier] = weakref.WeakSet()


def _close_all_at_exit() -> None:
    for notifier in list(_live):
        try:
            if not notifier._held:
                continue
            if not notifier._lock.acquire(blocking=False):
                # A post is still running on another thread (core's alert thread, past its
                # shutdown deadline): waiting for it would only lengthen the exit.
                log.warning(
                    "twinkle: %d DingTalk alert(s) held back by the rate limit were not "
                    "delivered: the process exits while a post is still in progress",
                    len(notifier._held),
                )
                continue
            notifier._lock.release()
            notifier.close()
        except Exception as exc:  # pragma: no cover - never fail interpreter exit
            log.warning("twinkle: closing %r at exit failed: %s", notifier, exc)


atexit.register(_close_all_at_exit)

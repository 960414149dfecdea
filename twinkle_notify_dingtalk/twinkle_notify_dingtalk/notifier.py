"""`DingTalkNotifier`: twinkle failure alerts posted to a DingTalk group robot.

Sending never hurts the job: `send()` only puts the alert on a bounded queue that a daemon
thread drains, each alert's delivery (retries included) is bounded by `timeout`, throttling and
the per-minute limit fold the overflow into one summary message, and `close()` / interpreter
exit wait a bounded time for pending alerts. Failures are logged as warnings on the
`twinkle.dingtalk` logger, with the robot's credentials masked.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import queue
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
#: Alerts waiting for the sender thread; more are dropped with a warning.
QUEUE_SIZE = 100
#: How long to hold messages after DingTalk answered 130101 (it throttles for minutes).
THROTTLE_PAUSE = 60.0
#: Retry back-off: first wait, growth factor, cap (seconds); jittered by +-20 %.
BACKOFF_FIRST, BACKOFF_FACTOR, BACKOFF_MAX = 0.2, 2.0, 2.0
#: Titles listed in one summary message.
SUMMARY_MAX_TITLES = 20

_MOBILE_RE = re.compile(r"^\+?[0-9][0-9-]{2,30}$")
_STOP = object()


#: The name of twinkle-core's alert thread (twinkle_core.notify.AlertQueue).
@dataclasses.dataclass
class _Alert:
    title: str
    text: str
    created: float  # time.time(), for the summary
    handled: threading.Event = dataclasses.field(default_factory=threading.Event)


@dataclasses.dataclass
class DeliveryStats:
    """Counters of what happened to the alerts given to one notifier."""

    sent: int = 0
    failed: int = 0
    dropped: int = 0
    summarized: int = 0
    summaries: int = 0


class _Sender:
    """One generation of the background sender: its queue, its thread and its overflow.

    `close()` retires a generation; a later `send()` starts a new one, so a notifier can be
    reused by a second `initialize()` while a stuck old thread finishes on its own queue.
    """

    def __init__(self, owner: DingTalkNotifier) -> None:
        self.owner = owner
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=QUEUE_SIZE)
        self.overflow: list[_Alert] = []
        self.close_deadline: float | None = None
        self.thread = threading.Thread(target=self.run, name="twinkle-dingtalk", daemon=True)

    def run(self) -> None:
        owner = self.owner
        while True:
            wait = None
            if self.overflow:
                wait = max(0.01, owner._limiter.wait_time(owner.max_per_minute))
            try:
                item = self.queue.get(timeout=wait)
            except queue.Empty:
                item = None
            try:
                if item is _STOP:
                    self.final_flush()
                    return
                if item is not None:
                    self.handle(item)
                self.maybe_summarize()
            except Exception as exc:  # pragma: no cover - defensive: the thread must survive
                log.warning("twinkle: DingTalk sender error: %s", owner._redact(exc))
            finally:
                if item is not None:
                    if isinstance(item, _Alert):
                        item.handled.set()
                    self.queue.task_done()

    def handle(self, alert: _Alert) -> None:
        owner = self.owner
        if self.overflow or not owner._limiter.try_acquire(owner.max_per_minute):
            self.fold(alert, f"the rate limit of {owner.max_per_minute} messages a minute")
            return
        outcome = owner._deliver(alert.title, alert.text)
        if outcome.ok:
            owner.stats.sent += 1
        elif outcome.throttled:
            owner._limiter.pause(THROTTLE_PAUSE)
            self.fold(alert, "DingTalk throttling (errcode 130101)")
        else:
            owner.stats.failed += 1

    def fold(self, alert: _Alert, why: str) -> None:
        self.overflow.append(alert)
        log.warning(
            "twinkle: DingTalk alert %r held back by %s; it will be listed in a summary message",
            self.owner._redact(alert.title),
            why,
        )

    def maybe_summarize(self) -> None:
        owner = self.owner
        if not self.overflow or not owner._limiter.try_acquire(owner.max_per_minute):
            return
        folded, self.overflow = self.overflow, []
        title, text = owner._summary(folded)
        outcome = owner._deliver(title, text)
        if outcome.ok:
            owner.stats.summaries += 1
            owner.stats.summarized += len(folded)
        elif outcome.throttled:
            owner._limiter.pause(THROTTLE_PAUSE)
            self.overflow = folded + self.overflow
        else:
            owner.stats.failed += len(folded)

    def final_flush(self) -> None:
        """On close: send the pending summary if a slot frees before the close deadline."""
        if not self.overflow:
            return
        owner = self.owner
        deadline = self.close_deadline if self.close_deadline is not None else time.monotonic()
        wait = owner._limiter.wait_time(owner.max_per_minute)
        if time.monotonic() + wait < deadline:
            time.sleep(wait)
            self.maybe_summarize()
        if self.overflow:
            log.warning(
                "twinkle: %d DingTalk alert(s) were not delivered: the robot may send only %d "
                "messages a minute and no slot freed before close; their titles: %s",
                len(self.overflow),
                owner.max_per_minute,
                "; ".join(owner._redact(a.title) for a in self.overflow[:SUMMARY_MAX_TITLES]),
            )
            owner.stats.dropped += len(self.overflow)
            self.overflow = []


class DingTalkNotifier(Notifier):
    """Posts twinkle failure alerts as markdown messages to a DingTalk custom robot.

    `webhook` is the robot's URL (``https://oapi.dingtalk.com/robot/send?access_token=...``);
    `secret` its signing secret ("加签", starts with SEC) when the robot uses signatures;
    `keyword` one of its custom keywords when it uses keywords (added to every message);
    `at_mobiles` / `at_all` whom to mention; `timeout` the seconds one alert may take to
    deliver, retries included; `max_per_minute` the messages per minute this process sends to
    the robot (DingTalk throttles above 20), the overflow folded into one summary message.
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
        self._lock = threading.Lock()
        self._sender: _Sender | None = None
        self._dropping = False
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
        """Queue one alert for the sender thread; returns at once and never raises.

        twinkle-core's alert queue calls `flush` after its own queue drains, so a flush of
        core's queue (at shutdown, or before torchrun ends a process) covers the delivery.
        """
        try:
            alert = _Alert(sanitize(title), sanitize(text), time.time())
            sender = self._current_sender()
            if sender is None:
                # No thread can be started (interpreter shutting down): deliver here, bounded.
                self._deliver_now(alert)
                return
            sender.queue.put_nowait(alert)
            if sender.queue.qsize() < QUEUE_SIZE // 2:
                self._dropping = False
        except queue.Full:
            self.stats.dropped += 1
            if not self._dropping:  # one warning per burst, not one per alert
                self._dropping = True
                log.warning(
                    "twinkle: %d DingTalk alerts are already waiting; dropping alert %r and "
                    "further ones until the queue drains",
                    QUEUE_SIZE,
                    self._redact(title),
                )
        except Exception as exc:  # never into user code
            log.warning("twinkle: could not queue DingTalk alert: %s", self._redact(exc))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds (default: 2 x `timeout`) until queued alerts are handled."""
        limit = 2 * self.timeout if timeout is None else max(0.0, timeout)
        sender = self._sender
        if sender is None:
            return True
        deadline = time.monotonic() + limit
        while sender.queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self, timeout: float | None = None) -> None:
        """Deliver pending alerts, waiting at most `timeout` seconds (default: 2 x `timeout`).

        Afterwards the notifier still works: the next `send()` starts a new sender thread.
        """
        limit = 2 * self.timeout if timeout is None else max(0.0, timeout)
        deadline = time.monotonic() + limit
        with self._lock:
            sender, self._sender = self._sender, None
        if sender is None:
            return
        sender.close_deadline = deadline
        try:
            sender.queue.put(_STOP, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            pass
        sender.thread.join(max(0.0, deadline - time.monotonic()))
        if sender.thread.is_alive():
            pending = sender.queue.unfinished_tasks
            log.warning(
                "twinkle: gave up waiting for DingTalk alerts after %.1fs (%d still pending); "
                "the robot is unreachable, slow or throttling",
                limit,
                max(0, pending - 1),
            )

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
    def _current_sender(self) -> _Sender | None:
        with self._lock:
            # A sender whose thread is gone (this is a forked child) is replaced.
            if self._sender is None or not self._sender.thread.is_alive():
                sender = _Sender(self)
                try:
                    sender.thread.start()
                except RuntimeError:  # "can't create new thread at interpreter shutdown"
                    return None
                self._sender = sender
            return self._sender

    def _deliver_now(self, alert: _Alert) -> None:
        if not self._limiter.try_acquire(self.max_per_minute):
            self.stats.dropped += 1
            log.warning(
                "twinkle: DingTalk rate limit reached at shutdown; alert %r not delivered",
                self._redact(alert.title),
            )
            return
        outcome = self._deliver(alert.title, alert.text)
        if outcome.ok:
            self.stats.sent += 1
        else:
            self.stats.failed += 1

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
        message = {
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

    def _deliver(self, title: str, text: str) -> transport.Outcome:
        """Post one message, retrying transient failures with back-off, within `timeout`."""
        body = self._payload(title, text)
        deadline = time.monotonic() + self.timeout
        delay = BACKOFF_FIRST
        attempt = 0
        while True:
            attempt += 1
            remaining = deadline - time.monotonic()
            outcome = transport.post(signed_url(self._webhook, self._secret), body, remaining)
            if outcome.ok:
                return outcome
            remaining = deadline - time.monotonic()
            wait = min(delay, BACKOFF_MAX) * random.uniform(0.8, 1.2)
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
            self.timeout,
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


# Notifiers alive in this process, flushed (bounded) at interpreter exit. Core's shutdown(),
# registered later by initialize(), runs before this hook (atexit is last-in, first-out).
_live: weakref.WeakSet[DingTalkNotifier] = weakref.WeakSet()


def _close_all_at_exit() -> None:
    for notifier in list(_live):
        try:
            notifier.close()
        except Exception as exc:  # pragma: no cover - never fail interpreter exit
            log.warning("twinkle: closing %r at exit failed: %s", notifier, exc)


atexit.register(_close_all_at_exit)

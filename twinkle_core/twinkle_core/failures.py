"""Turning a failure on remote workers into the exception the caller sees.

The caller gets the original exception type, its message prefixed with the driver call site
(`[twinkle driver caller: FILE:LINE]`), and notes naming the method, group, ranks and nodes.
Several ranks failing are grouped: one line per distinct error with its ranks.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass, field

from .callsite import CallSite
from .errors import TwinkleError

CALLER_TAG = "[twinkle driver caller: {site}]"
#: Hex addresses and numbers: they differ between ranks and runs for the same error.
_VARYING = re.compile(r"0x[0-9a-fA-F]+|\d+")


@dataclass
class WorkerFailure:
    """Record of one worker's failure: the exception it raised (or a WorkerDiedError for it)."""

    rank: int
    exception: BaseException
    node: str | None = None
    traceback: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (type(self.exception).__name__, _plain_message(self.exception))


class WorkersFailedError(TwinkleError):
    """Raised by a backend's pending call when workers failed; carries every failure known.

    Core turns it into the user's own exception (tagged with the call site) before it reaches
    user code; only backends raise and catch it.
    """

    def __init__(self, failures: list[WorkerFailure]) -> None:
        super().__init__(f"{len(failures)} worker(s) failed")
        self.failures = failures


@dataclass
class CallFailure:
    """Record of one failed remote call, as given to notifiers and the
    `twinkle_remote_failure` hook: the method, group, driver call site and each worker's
    failure."""

    run_name: str
    method: str
    group: str
    call_site: CallSite
    failures: list[WorkerFailure]
    mode: str = ""
    _distinct: list[tuple[tuple[str, str], list[WorkerFailure]]] = field(
        default_factory=list, repr=False
    )

    def __post_init__(self) -> None:
        groups: dict[tuple[str, str], list[WorkerFailure]] = {}
        for f in sorted(self.failures, key=lambda f: f.rank):
            groups.setdefault(f.key, []).append(f)
        self._distinct = list(groups.items())

    @property
    def exception(self) -> BaseException:
        """The exception of the lowest failing rank; the one raised to the caller."""
        return self._distinct[0][1][0].exception

    def distinct(self) -> list[tuple[tuple[str, str], list[WorkerFailure]]]:
        """Failures grouped by (exception type, message), lowest rank first."""
        return self._distinct

    def dedupe_key(self, error_key: tuple[str, str]) -> str:
        """One alert per distinct error: type, method, call site and the message with what
        varies between processes and runs (numbers, addresses, pids) folded away."""
        message = _VARYING.sub("#", error_key[1])
        return f"{self.method}|{self.call_site}|{error_key[0]}|{message}"

    def summary_lines(self) -> list[str]:
        lines = []
        for (etype, message), fails in self._distinct:
            ranks = ",".join(str(f.rank) for f in fails)
            nodes = sorted({f.node for f in fails if f.node})
            where = f" on node {','.join(nodes)}" if nodes else ""
            lines.append(f"{etype}: {message} (group {self.group!r}, rank {ranks}{where})")
        return lines

    def alert(self, error_key: tuple[str, str]) -> tuple[str, str]:
        """A (title, markdown text) pair describing one distinct error of this failure."""
        fails = dict(self._distinct)[error_key]
        ranks = ", ".join(str(f.rank) for f in fails)
        nodes = ", ".join(sorted({f.node for f in fails if f.node})) or "-"
        title = f"twinkle run {self.run_name}: {self.method} failed"
        tb = fails[0].traceback.strip()
        text = "\n".join(
            [
                f"### {title}",
                f"- **run**: {self.run_name}" + (f" (mode {self.mode})" if self.mode else ""),
                f"- **what failed**: `{self.method}`",
                f"- **driver call site**: `{self.call_site}`",
                f"- **group / rank**: {self.group} / {ranks}",
                f"- **node**: {nodes}",
                f"- **error**: `{error_key[0]}: {error_key[1]}`",
                "",
                "```",
                tb or f"{error_key[0]}: {error_key[1]}",
                "```",
            ]
        )
        return title, text


def safe_str(exc: BaseException) -> str:
    """`str(exc)`, or a stand-in when the exception's own `__str__` raises: reporting a failure
    must never replace it with an error of its own."""
    try:
        return str(exc)
    except Exception as err:
        return f"<str() failed: {type(err).__name__}>"


def _plain_message(exc: BaseException) -> str:
    """The exception's message without any twinkle caller tags."""
    text = safe_str(exc)
    while text.startswith("[twinkle driver caller: "):
        end = text.find("] ")
        if end < 0:
            break
        text = text[end + 2 :]
    return text


def format_remote_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def unsendable_result(label: str, rank: int, value: object, why: str) -> TypeError:
    """The failure of a rank whose result cannot travel back to the caller (a generator, an
    open file, a lock, an object that does not pickle): the same words in every backend,
    naming the method (`label`, "Class.method"), the rank and the result's type, never its
    value. Backends make it that rank's `WorkerFailure` instead of sending something else (Ray
    would send an open file as a `StringIO` copy) or failing outside the call."""
    kind, name = type(value), type(value).__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    return TypeError(
        f"the result of {label} on rank {rank} ({name}) cannot be sent back from its worker: "
        f"{why}. Return plain data (numbers, strings, lists, dicts, arrays, tensors) and keep "
        "what is tied to the worker's process (files, locks, generators) there"
    )


def add_note(exc: BaseException, note: str) -> None:
    """`exc.add_note(note)`: shown under the traceback (PEP 678)."""
    exc.add_note(note)


def _message_is_args0(exc: BaseException) -> bool:
    """Whether the exception's text is exactly its single string argument, so prefixing that
    argument changes the message and nothing else (not KeyError, OSError, multi-argument or
    custom `__str__` exceptions)."""
    args = exc.args
    if len(args) != 1 or not isinstance(args[0], str):
        return False
    try:
        return str(exc) == args[0]  # e.g. a TimeoutError("...") is an OSError without errno
    except Exception:
        return False


def tag_call_site(exc: BaseException, site: object) -> BaseException:
    """Put the driver call site on `exc`, keeping its type and its arguments' meaning.

    The message is prefixed (`[twinkle driver caller: FILE:LINE] ...`) where the message is
    just the exception's single string argument; every other shape (a `KeyError`'s key, an
    `OSError`'s errno, several arguments, a custom `__str__`) gets the call site as a note.
    """
    tag = CALLER_TAG.format(site=site)
    if _message_is_args0(exc):
        if not exc.args[0].startswith(tag):
            original = exc.args
            exc.args = (f"{tag} {exc.args[0]}",)
            if not safe_str(exc).startswith(tag):  # a __str__ that does not show args[0]
                exc.args = original
                add_note(exc, tag)
        return exc
    if not exc.args and type(exc).__str__ is BaseException.__str__:
        exc.args = (tag,)
        return exc
    notes = getattr(exc, "__notes__", None) or []
    if tag not in notes:
        add_note(exc, tag)
    return exc


def tag_exception(failure: CallFailure) -> BaseException:
    """Tag the raised exception with the call site and note what failed where."""
    exc = tag_call_site(failure.exception, failure.call_site)
    first = failure.distinct()[0][1][0]
    node = f" node {first.node}" if first.node else ""
    add_note(
        exc,
        f"twinkle: {failure.method} failed in group {failure.group!r} on rank {first.rank}{node}",
    )
    lines = failure.summary_lines()
    if len(failure.failures) > 1:
        add_note(exc, "twinkle: failures by distinct error:\n  " + "\n  ".join(lines))
    return exc

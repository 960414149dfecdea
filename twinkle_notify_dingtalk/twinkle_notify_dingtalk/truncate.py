"""Fitting a markdown alert into DingTalk's message size limit.

DingTalk rejects robot messages whose body exceeds 20000 bytes (errcode 460101, "message too
long, exceed 20000 bytes"). Failure alerts end with a traceback whose useful part is its end
(the innermost frames and the exception line), while the head says what failed where. So an
over-size text keeps its head and its end: over-long lines are first cut in their middle, then
whole lines are removed from the middle, replaced by one marker line. Code fences are kept
balanced so the traceback still renders as a code block.
"""

from __future__ import annotations

import json
import re

#: Share of the byte budget given to the head of the text; the rest keeps the end.
HEAD_SHARE = 0.35
ELLIPSIS = "…"
_FENCE = "```"


def json_cost(text: str) -> int:
    """Bytes `text` takes inside a UTF-8 JSON string (escapes included, quotes excluded)."""
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8")) - 2


def _char_cost(ch: str) -> int:
    if ch in '"\\':
        return 2
    code = ord(ch)
    if code < 0x20:
        return 2 if ch in "\b\f\n\r\t" else 6
    return len(ch.encode("utf-8", "replace"))


def _prefix_within(text: str, budget: int) -> str:
    used = 0
    for i, ch in enumerate(text):
        used += _char_cost(ch)
        if used > budget:
            return text[:i]
    return text


def _suffix_within(text: str, budget: int) -> str:
    used = 0
    for i in range(len(text) - 1, -1, -1):
        used += _char_cost(text[i])
        if used > budget:
            return text[i + 1 :]
    return text


# Terminal colour and cursor sequences (Ray colours its task tracebacks): a chat shows them raw.
_ANSI_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


def sanitize(text: object) -> str:
    """`text` as a string without terminal escape sequences that encodes to UTF-8.

    Lone surrogates (undecodable file names) become '?'.
    """
    return _ANSI_RE.sub("", str(text)).encode("utf-8", "replace").decode("utf-8")


def cut_middle(text: str, budget: int, head_share: float = HEAD_SHARE) -> str:
    """`text` cut in its middle to at most `budget` JSON bytes, marking the cut."""
    if json_cost(text) <= budget:
        return text
    marker = f" {ELLIPSIS}[cut] "
    room = budget - json_cost(marker)
    if room <= 0:
        return _prefix_within(text, budget)
    head = _prefix_within(text, int(room * head_share))
    tail = _suffix_within(text[len(head) :], room - json_cost(head))
    return f"{head}{marker}{tail}"


def _is_fence(line: str) -> bool:
    return line.lstrip().startswith(_FENCE)


def _fences(lines: list[str]) -> int:
    return sum(1 for line in lines if _is_fence(line))


def fit_text(text: str, budget: int, head_share: float = HEAD_SHARE) -> str:
    """`text` unchanged if it fits in `budget` JSON bytes, else cut keeping its head and end."""
    if budget < 0:
        raise ValueError(f"fit_text(budget=...) must be >= 0, got {budget}")
    if json_cost(text) <= budget:
        return text
    lines = text.split("\n")
    line_cap = max(80, min(2000, budget // 4))
    lines = [cut_middle(line, line_cap) for line in lines]
    capped = "\n".join(lines)
    if json_cost(capped) <= budget:
        return capped

    sep = json_cost("\n")
    # Reserve room for the marker and a fence line, then fill head and tail line by line.
    total = len(text.encode("utf-8", "replace"))
    reserve = json_cost(f"{ELLIPSIS} [{len(lines)} lines, {total} bytes cut] {ELLIPSIS}")
    reserve += json_cost(_FENCE) + 3 * sep
    room = budget - reserve
    if room <= 0:
        return cut_middle(text, budget, head_share)
    head: list[str] = []
    used = 0
    for line in lines:
        cost = json_cost(line) + sep
        if used + cost > room * head_share:
            break
        head.append(line)
        used += cost
    tail: list[str] = []
    for line in reversed(lines[len(head) :]):
        cost = json_cost(line) + sep
        if used + cost > room:
            break
        tail.append(line)
        used += cost
    tail.reverse()
    cut = lines[len(head) : len(lines) - len(tail)]
    cut_bytes = sum(len(line.encode("utf-8", "replace")) + 1 for line in cut)
    marker = [f"{ELLIPSIS} [{len(cut)} lines, {cut_bytes} bytes cut] {ELLIPSIS}"]
    head_in_code = _fences(head) % 2 == 1
    tail_in_code = _fences(head + cut) % 2 == 1
    if head_in_code != tail_in_code:
        # Close the block the head left open, or open the block the tail is inside of.
        marker.append(_FENCE)
    result = "\n".join(head + marker + tail)
    if json_cost(result) > budget:  # pragma: no cover - the reserve above makes this unreachable
        result = cut_middle(result, budget, head_share)
    return result

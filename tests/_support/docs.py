"""Run the Python blocks of README.md and docs/*.md as printed, with Sybil.

Every ```python block is one of:
- runnable with twinkle-core alone (no marker): run by tests/core;
- preceded by `<!-- requires: NAME -->` (NAME in REQUIREMENTS): run by the suite whose
  environment holds what it needs (`ray` in tests/ray, `local` in tests/local, `dingtalk` in
  tests/notify_dingtalk);
- preceded by `<!-- illustrative: reason -->`: not run (a fragment, or it needs hardware or
  software CI does not have). The reason is required.

The blocks of a page that run in the same suite share one namespace, in page order, as a reader
running them one after another would. New pages are found by the glob in `pages()`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sybil import Sybil
from sybil.document import Document
from sybil.example import Example
from sybil.parsers.markdown import PythonCodeBlockParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = {
    "core": "twinkle-core only (tests/core)",
    "local": "twinkle-local and torch (tests/local)",
    "ray": "twinkle-ray, ray and torch (tests/ray)",
    "dingtalk": "twinkle-notify-dingtalk (tests/notify_dingtalk)",
}
MARKERS = ("illustrative", "requires")
# What a Python fence may be written as; each must be found by Sybil's parser.
_ONLY_COMMENT_END = re.compile(r"\s*-*>?\s*")
PYTHON_FENCE = re.compile(r"^```(?:python|py|python3)\s*$", re.MULTILINE)


def pages() -> list[Path]:
    """Every documentation page: README.md and docs/*.md (new pages are picked up as added)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


class _MarkerParser:
    """`<!-- illustrative: reason -->` and `<!-- requires: name -->` as Sybil regions."""

    def __init__(self) -> None:
        self.lexer = DirectiveInHTMLCommentLexer(directive="|".join(MARKERS))

    def __call__(self, document: Document):
        for region in self.lexer(document):
            region.parsed = (region.lexemes["directive"], region.lexemes["arguments"].strip())
            region.evaluator = None  # a marker is read, never evaluated
            yield region


_SYBIL = Sybil(parsers=[PythonCodeBlockParser(), _MarkerParser()], pattern="*.md")


@dataclass
class Block:
    """One Python block of a page and what its marker says about running it."""

    example: Example
    kind: str  # "run" or "illustrative"
    requires: str  # a key of REQUIREMENTS ("core" when no marker says otherwise)
    reason: str  # the illustrative reason, or ""
    problem: str = ""  # a marker that cannot be honoured

    @property
    def where(self) -> str:
        return f"{page_id(Path(self.example.path))}:{self.example.line}"


def blocks(page: Path) -> Iterator[Block]:
    """The page's Python blocks with their markers (a fresh document, so a fresh namespace)."""
    document = _SYBIL.parse(page)
    marker = None
    for example in document:
        if example.region.evaluator is None:  # a marker: applies to the next block only
            marker = example
            continue
        # Sybil's marker region stops before the closing "-->".
        between = document.text[marker.end : example.start] if marker else ""
        if marker is None or not _ONLY_COMMENT_END.fullmatch(between):
            yield Block(example, "run", "core", "")
        else:
            directive, argument = marker.parsed
            if directive == "illustrative":
                problem = "" if argument else "<!-- illustrative: --> needs a reason"
                yield Block(example, "illustrative", "", argument, problem)
            else:
                problem = (
                    ""
                    if argument in REQUIREMENTS
                    else (
                        f"<!-- requires: {argument} --> names no environment; "
                        f"expected one of {', '.join(REQUIREMENTS)}"
                    )
                )
                yield Block(example, "run", argument, "", problem)
        marker = None


def stray_markers(page: Path) -> list[str]:
    """Markers that are not directly followed by a Python block (so they mark nothing)."""
    document = _SYBIL.parse(page)
    examples = list(document)
    stray = []
    for example, following in zip(examples, [*examples[1:], None], strict=False):
        if example.region.evaluator is not None:
            continue
        between = document.text[example.end : following.start] if following else "x"
        if (
            following is None
            or following.region.evaluator is None
            or not (_ONLY_COMMENT_END.fullmatch(between))
        ):
            stray.append(f"{page_id(page)}:{example.line}")
    return stray


def pages_requiring(requires: str) -> list[str]:
    """The ids of the pages holding at least one block to run in the given environment."""
    return [
        page_id(page)
        for page in pages()
        if any(b.kind == "run" and b.requires == requires for b in blocks(page))
    ]


def run_page(page_name: str, requires: str, workdir: Path) -> int:
    """Run the page's blocks that need `requires`, in order, in one namespace; return how many.

    Runs in `workdir` (blocks may write files) and shuts twinkle down afterwards, whatever the
    blocks left running.
    """
    import twinkle_core

    ran = 0
    previous = Path.cwd()
    os.chdir(workdir)
    try:
        for block in blocks(ROOT / page_name):
            if block.kind == "run" and block.requires == requires:
                block.example.namespace.setdefault("__name__", "__docs__")
                block.example.evaluate()
                ran += 1
    finally:
        os.chdir(previous)
        twinkle_core.shutdown()
    return ran

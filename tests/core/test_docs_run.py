"""The docs run as printed: every Python block of README.md and docs/*.md runs or says why not.

Blocks without a marker run here, with twinkle-core alone; blocks marked `<!-- requires: ray -->`
(or local, dingtalk) run in that suite (tests/ray/test_docs_ray.py, ...). See tests/_support/docs.py
and "How the docs are tested" in docs/index.md.
"""

from __future__ import annotations

import pytest
from _support import docs


def test_the_pages_are_found_by_glob():
    names = {docs.page_id(p) for p in docs.pages()}
    assert {"README.md", "docs/quickstart.md", "docs/plugins.md"} <= names


def test_every_python_fence_is_seen_by_the_runner():
    """A ```py fence (or a typo the parser misses) would otherwise never run and never fail."""
    missed = []
    for page in docs.pages():
        fences = len(docs.PYTHON_FENCE.findall(page.read_text()))
        found = sum(1 for _ in docs.blocks(page))
        if fences != found:
            missed.append(f"{docs.page_id(page)}: {fences} python fences, {found} parsed")
    assert missed == [], "write Python blocks as ```python: " + "; ".join(missed)


def test_every_marker_is_honoured():
    problems = [
        f"{b.where}: {b.problem}" for p in docs.pages() for b in docs.blocks(p) if b.problem
    ]
    problems += [
        f"{where}: a marker must directly precede a ```python block"
        for p in docs.pages()
        for where in docs.stray_markers(p)
    ]
    assert problems == [], problems


def test_the_marker_convention_is_read():
    """A broken parser that ignores markers would run the illustrative blocks here (and fail)."""
    kinds = {b.kind for p in docs.pages() for b in docs.blocks(p)}
    assert kinds == {"run", "illustrative"}


@pytest.mark.parametrize("page", docs.pages_requiring("core"))
def test_page_runs_as_printed(page, tmp_path):
    assert docs.run_page(page, "core", tmp_path) > 0

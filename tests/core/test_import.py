"""Importing the core must stay cheap: no torch, no ray, no plugin loading."""

from __future__ import annotations

import subprocess
import sys


def test_import_twinkle_core_imports_neither_torch_nor_ray_nor_plugins():
    code = (
        "import sys, twinkle_core, twinkle_core.plugins as p\n"
        "heavy = sorted(m for m in ('torch', 'ray') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        "assert p._system is None, 'plugins were loaded at import'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_core_sources_have_no_torch_or_ray_imports():
    import pathlib
    import re

    import twinkle_core

    root = pathlib.Path(twinkle_core.__file__).parent
    pattern = re.compile(r"^\s*(import|from)\s+(torch|ray)\b", re.MULTILINE)
    offenders = [p.name for p in root.rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []

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


def test_public_submodules_import_in_a_fresh_process_and_old_names_are_gone():
    """`from twinkle_core import plugin, testing` works from a cold start; the 0.1 names and
    the backend names the top level held before 0.2 are gone (no version with them was
    published), so an old name is a plain AttributeError."""
    code = (
        "from twinkle_core import plugin, testing\n"
        "import twinkle_core\n"
        "assert plugin.WorkerState and testing.run_kit\n"
        "for old in ('RankFailure', 'ExecutionBackend', 'no_such_name'):\n"
        "    try:\n"
        "        getattr(twinkle_core, old)\n"
        "    except AttributeError:\n"
        "        continue\n"
        "    raise SystemExit(f'twinkle_core.{old} still exists')\n"
        "assert not hasattr(plugin, 'WorkerErrors')\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:] + out.stdout
    assert out.stdout.strip() == "ok"


def test_the_version_is_written_once_in_the_distribution_metadata():
    """`twinkle_core.__version__` is read from the installed metadata, not written twice."""
    from importlib.metadata import version

    import twinkle_core

    assert twinkle_core.__version__ == version("twinkle-core")
    assert twinkle_core.__version__.startswith("0.3.")

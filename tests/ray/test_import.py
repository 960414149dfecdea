"""Listing plugins must stay cheap: the ray plugin registers by name, importing neither ray nor
torch until the backend is used."""

from __future__ import annotations

import subprocess
import sys


def test_plugin_and_package_import_neither_ray_nor_torch():
    code = (
        "import sys, twinkle_ray, twinkle_ray.plugin\n"
        "from twinkle_core.plugins import plugin_system\n"
        "assert 'ray' in plugin_system().names('backends')\n"
        "heavy = [m for m in ('ray', 'torch') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "from twinkle_ray import RayBackend\n"
        "assert RayBackend.name == 'ray' and 'ray' in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]

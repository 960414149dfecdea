"""Running the `twinkle` command and installing throwaway packages, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def twinkle(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """Run the `twinkle` console script of the environment running the tests (or
    `python -m twinkle_core` where it has none); output captured as text, never checked."""
    script = Path(sys.executable).parent / "twinkle"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "twinkle_core"]
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env if env is not None else dict(os.environ),
        cwd=cwd,
    )


def pip_install_into(target: Path, source: Path) -> None:
    """`pip install` the project at `source` into the folder `target` (no dependencies, no
    build isolation: offline, with the setuptools of the test environment)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        timeout=300,
    )

"""Install any combination of the four twinkle packages from this checkout, as a user would.

    python scripts/install.py "twinkle-core[ray]"             # core + local + ray, torch, ray
    python scripts/install.py "twinkle-core[local,dingtalk]"  # extras: local, ray, dingtalk, all
    python scripts/install.py twinkle-notify-dingtalk -U       # more arguments go to pip install

The twinkle packages are not on PyPI: this builds wheels of all four from the working tree into
a temporary folder, then runs `pip install --find-links <that folder> ARGS...` with the Python
that runs this script, so they land in that interpreter's environment (activate your virtualenv
first, or run it with that environment's python). Dependencies (numpy, torch, ray, ...) come
from your usual package index. Not editable: run it again after changing the source.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("twinkle_core", "twinkle_local", "twinkle_ray", "twinkle_notify_dingtalk")


def main(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    pip = [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory(prefix="twinkle-wheels-") as wheels:
        print(f"building wheels of {', '.join(PACKAGES)} ...", flush=True)
        subprocess.run(
            [
                *pip,
                "wheel",
                "-q",
                "--no-deps",
                "--wheel-dir",
                wheels,
                *(str(ROOT / p) for p in PACKAGES),
            ],
            check=True,
        )
        print(f"pip install --find-links {wheels} {' '.join(args)}", flush=True)
        return subprocess.run([*pip, "install", "--find-links", wheels, *args]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

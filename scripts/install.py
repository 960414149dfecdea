"""Install any combination of the four twinkle packages from this checkout, as a user would.

    python scripts/install.py "twinkle-core[ray]"             # core + local + ray, torch, ray
    python scripts/install.py "twinkle-core[local,dingtalk]"  # extras: local, ray, dingtalk, all
    python scripts/install.py --cpu "twinkle-core[local]"     # torch from PyTorch's CPU wheels
    python scripts/install.py twinkle-notify-dingtalk -U       # more arguments go to pip install
    python scripts/install.py --dry-run "twinkle-core[ray]"   # print what it would run

The twinkle packages are not on PyPI: this builds wheels of all four from the working tree into
a temporary folder, then runs `pip install --find-links <that folder> ARGS...` with the Python
that runs this script, so they land in that interpreter's environment (activate your virtualenv
first, or run it with that environment's python). Dependencies (numpy, torch, ray, ...) come
from your usual package index. Not editable: run it again after changing the source.

torch: PyPI's default Linux wheel is a CUDA build of several GB. `--cpu` adds PyTorch's CPU
wheel index (CPU_INDEX_URL) so a machine without a GPU gets the CPU build (about 200 MB); on a
machine without an NVIDIA GPU that is about to install torch, the script says so first.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("twinkle_core", "twinkle_local", "twinkle_ray", "twinkle_notify_dingtalk")
CPU_INDEX_URL = "https://download.pytorch.org/whl/cpu"
#: Extras of twinkle-core that pull torch in.
TORCH_EXTRAS = ("local", "ray", "all")


def has_nvidia_gpu() -> bool:
    """Whether this machine shows an NVIDIA GPU (a device node, or nvidia-smi on PATH)."""
    return os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None


def wants_torch(args: list[str]) -> bool:
    """Whether the requested packages pull torch in (twinkle-local, or an extra that does)."""
    for arg in args:
        name = arg.lower().replace("_", "-")
        if name.startswith("twinkle-local") or name.startswith("twinkle-ray"):
            return True
        if name.startswith("twinkle-core[") and any(e in name for e in TORCH_EXTRAS):
            return True
    return False


def plan(args: list[str], *, gpu: bool, torch_installed: bool) -> tuple[list[str], list[str]]:
    """(the arguments for `pip install` after --find-links, notes to print first)."""
    notes = []
    cpu = "--cpu" in args
    rest = [a for a in args if a not in ("--cpu", "--dry-run")]
    if cpu:
        rest = ["--extra-index-url", CPU_INDEX_URL, *rest]
        notes.append(f"torch comes from PyTorch's CPU wheels ({CPU_INDEX_URL})")
    elif wants_torch(rest) and not gpu and not torch_installed:
        notes.append(
            "this machine shows no NVIDIA GPU, and pip is about to install torch from PyPI: "
            "a CUDA build of several GB. Run again with --cpu for PyTorch's CPU wheels "
            "(about 200 MB), or press Ctrl-C now and install torch yourself first"
        )
    return rest, notes


def main(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    pip = [sys.executable, "-m", "pip"]
    torch_installed = importlib.util.find_spec("torch") is not None
    rest, notes = plan(args, gpu=has_nvidia_gpu(), torch_installed=torch_installed)
    for note in notes:
        print(f"note: {note}", flush=True)
    if "--dry-run" in args:
        print(f"pip install --find-links <wheels of {', '.join(PACKAGES)}> {' '.join(rest)}")
        return 0
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
        print(f"pip install --find-links {wheels} {' '.join(rest)}", flush=True)
        return subprocess.run([*pip, "install", "--find-links", wheels, *rest]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`scripts/install.py` gives a machine without a GPU the CPU build of torch on request, and
says what it is about to download otherwise (issue 31, item 2)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install.py"
spec = importlib.util.spec_from_file_location("install_script", SCRIPT)
install = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install)


def test_cpu_adds_pytorchs_cpu_index_and_is_not_passed_to_pip():
    rest, notes = install.plan(["--cpu", "twinkle-core[local]"], gpu=False, torch_installed=False)
    assert rest == ["--extra-index-url", install.CPU_INDEX_URL, "twinkle-core[local]"]
    assert "CPU wheels" in notes[0]


@pytest.mark.parametrize(
    "args, gpu, installed, warned",
    [
        (["twinkle-core[ray]"], False, False, True),
        (["twinkle_local"], False, False, True),
        (["twinkle-core[ray]"], True, False, False),  # a GPU machine wants the CUDA build
        (["twinkle-core[ray]"], False, True, False),  # torch is there already
        (["twinkle-core[dingtalk]"], False, False, False),  # no torch asked for
    ],
)
def test_a_cpu_machine_about_to_pull_cuda_torch_is_told_first(args, gpu, installed, warned):
    _, notes = install.plan(args, gpu=gpu, torch_installed=installed)
    assert any("CUDA build of several GB" in n and "--cpu" in n for n in notes) == warned


def test_dry_run_prints_the_pip_command_as_a_user_runs_it():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--cpu", "twinkle-core[local]"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert f"--extra-index-url {install.CPU_INDEX_URL} twinkle-core[local]" in out
    assert "--dry-run" not in out.splitlines()[-1] and "--cpu" not in out.splitlines()[-1]

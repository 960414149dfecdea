"""`bash scripts/demo.sh` prints what a user needs (issue 31, item 6): what is being set up, one
line per mode, then the table; nox's commands (a 600-character `uv pip install`, the import
check), torchrun's OMP banner and Ray's token notice stay in the log files it names, and a fresh
clone's output fits on one screen. Its exit code is nox's, as before."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(SCRIPTS))
import demo  # noqa: E402

WHEELS = "/r/.nox/.twinkle-wheels"
INSTALL = (
    "nox > /r/.venvs/tools/bin/uv pip install 'pytest>=8' 'pytest-timeout>=2.3' "
    "'hypothesis>=6.100' 'sybil>=9' pip 'setuptools>=77' torch==2.13.0 "
    + " ".join(
        f"{WHEELS}/{p}-0123/{p}-0.3.0-py3-none-any.whl --reinstall-package {p.replace('_', '-')}"
        for p in ("twinkle_core", "twinkle_local", "twinkle_ray", "twinkle_notify_dingtalk")
    )
)
TABLE = ["step        local loss          ray loss    inprocess loss   reward"]
TABLE += [
    f"{s:4d}       -0.04473442       -0.04473442       -0.04473443    0.391" for s in range(12)
]
# What nox printed for `bash scripts/demo.sh` in a fresh clone (2026-12-04), scripts/demo.py's
# own lines as it prints them now.
FIRST_RUN = [
    "nox > Running session demo",
    "nox > Creating virtual environment (uv) using python in .nox/demo",
    *(
        line
        for p in ("twinkle_core", "twinkle_local", "twinkle_ray", "twinkle_notify_dingtalk")
        for line in (
            f"nox > building ./{p} (its sources changed)",
            f"nox > /r/.venvs/tools/bin/uv build --wheel --quiet --out-dir {WHEELS}/{p}.partial",
        )
    ),
    INSTALL,
    "nox > python -I -c 'import importlib.util as u, sys; found = [m for m in () if u.find_spec"
    "(m)]; import torch, ray, twinkle_core, twinkle_local, twinkle_ray, twinkle_notify_dingtalk'",
    "nox > python scripts/demo.py",
    "",
    "== mode local: torchrun --standalone --nproc_per_node=2 examples/rl_pipeline.py",
    "   12 steps in 6.8 s (its output: .demo/local.log)",
    "",
    "== mode ray: python examples/rl_pipeline.py --mode ray (embedded local cluster)",
    "   12 steps in 18.1 s (its output: .demo/ray.log)",
    "",
    "== mode inprocess (the reference semantics)",
    "   12 steps in 3.9 s (its output: .demo/inprocess.log)",
    "",
    "== per-step losses",
    *TABLE,
    "largest difference between modes: 5.96e-08 (same)",
    "",
    "logs and tables: .demo/{local,ray,inprocess}.{log,json}",
    "nox > Session demo was successful in a minute.",
]


def _filter(lines: list[str]) -> tuple[list[str], str]:
    out, log = io.StringIO(), io.StringIO()
    demo.filter_nox(io.StringIO("".join(f"{li}\n" for li in lines)), log, ".demo/setup.log", out)
    return out.getvalue().splitlines(), log.getvalue()


def test_a_fresh_clone_sees_what_is_set_up_then_the_table_on_one_screen():
    shown, log = _filter(FIRST_RUN)
    assert shown[:4] == [
        "",
        "== setting up .nox/demo: twinkle, torch and ray (first run: a few minutes;"
        " log: .demo/setup.log)",
        "   building the wheels of twinkle_core, twinkle_local, twinkle_ray,"
        " twinkle_notify_dingtalk",
        "   installing torch==2.13.0, twinkle-core, twinkle-local, twinkle-ray,"
        " twinkle-notify-dingtalk",
    ]
    assert shown[4:] == FIRST_RUN[13:-1]  # scripts/demo.py's lines, blank ones included
    assert not any(line.startswith("nox > ") for line in shown)
    assert max(len(line) for line in shown) <= 100
    # + 2 lines of scripts/tools.sh setting up .venvs/tools: one screen is about 40 lines
    assert len(shown) + 2 <= 40
    assert log == "".join(f"{li}\n" for li in FIRST_RUN)  # all of it in the log


def test_a_reused_environment_and_what_nox_says_when_something_fails():
    shown, _ = _filter(
        [
            "nox > Running session demo",
            "nox > Reusing existing virtual environment at .nox/demo.",
            "nox > python scripts/demo.py",
            "Traceback (most recent call last):",
            "nox > Command python scripts/demo.py failed with exit code 1",
            "nox > Session demo failed.",
        ]
    )
    assert shown == [
        "",
        "== using .nox/demo, set up before (log: .demo/setup.log)",
        "Traceback (most recent call last):",
        "nox > Command python scripts/demo.py failed with exit code 1",
        "nox > Session demo failed.",
    ]


NOISY = (
    "import sys; "
    "print('*' * 41); print('Setting OMP_NUM_THREADS environment variable for each process'); "
    "print('WARNING authentication_token_setup.py:85 -- Token authentication is enabled'); "
    "[print(f'step {s:2d}  loss -0.1  reward 0.5') for s in range(3)]; "
    "sys.exit(int(sys.argv[1]))"
)


def test_a_mode_prints_one_line_and_keeps_its_output_in_its_log(tmp_path, capsys):
    log = tmp_path / "local.log"
    demo.run("mode local: the title", [sys.executable, "-c", NOISY, "0"], log)
    shown = capsys.readouterr().out.splitlines()
    assert shown[:2] == ["", "== mode local: the title"]
    assert shown[2].startswith("   3 steps in ") and shown[2].endswith(f"(its output: {log})")
    assert len(shown) == 3
    assert "OMP_NUM_THREADS" in log.read_text() and "Token authentication" in log.read_text()


def test_a_failed_mode_prints_the_end_of_its_log(tmp_path, capsys):
    log = tmp_path / "ray.log"
    with pytest.raises(SystemExit) as info:
        demo.run("mode ray", [sys.executable, "-c", NOISY, "3"], log)
    assert str(info.value) == f"mode ray: exit code 3 (all of its output: {log})"
    assert "step  2  loss -0.1" in capsys.readouterr().out


FAKE_NOX = """\
#!{python}
import sys
print("nox > Running session demo")
print("nox > Reusing existing virtual environment at .nox/demo.")
print("nox > python scripts/demo.py")
print("the demo's own line")
print("nox > Session demo failed." if {code} else "nox > Session demo was successful.")
sys.exit({code})
"""


@pytest.mark.parametrize("code", [0, 3])
def test_demo_sh_filters_nox_and_exits_with_its_code(tmp_path, code):
    (tmp_path / "scripts").mkdir()
    for name in ("demo.sh", "tools.sh", "demo.py"):
        shutil.copy(SCRIPTS / name, tmp_path / "scripts" / name)
    tools = tmp_path / ".venvs" / "tools"
    (tools / "bin").mkdir(parents=True)
    (tools / "bin" / "python").symlink_to(sys.executable)
    (tools / "bin" / "nox").write_text(FAKE_NOX.format(python=sys.executable, code=code))
    (tools / "bin" / "nox").chmod(0o755)
    wanted = subprocess.run(
        ["bash", "-c", 'source scripts/tools.sh; echo "${TOOLS_REQUIREMENTS[*]}"'],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (tools / ".requirements").write_text(f"{wanted} {sys.executable}\n")
    env = {k: v for k, v in os.environ.items() if k != "TWINKLE_VENVS"}
    run = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "demo.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "PYTHON": sys.executable},
    )
    assert run.returncode == code, run.stderr
    assert run.stdout.splitlines()[:3] == [
        "",
        "== using .nox/demo, set up before (log: .demo/setup.log)",
        "the demo's own line",
    ]
    assert "nox > Running session demo" in (tmp_path / ".demo" / "setup.log").read_text()

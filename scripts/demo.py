"""Run examples/rl_pipeline.py unchanged under torchrun, on an embedded Ray cluster and in-process,
then print the per-step losses side by side (the `demo` nox session; `bash scripts/demo.sh`).

Each mode's output (the placement drawing, one line per step, torchrun's and Ray's own notices)
goes to .demo/{local,ray,inprocess}.log and its table to .demo/{mode}.json; the terminal gets
one line per mode, then the table. A mode that fails prints the end of its log.

`python scripts/demo.py --nox-output LOG` is the other half of scripts/demo.sh: it reads nox's
output on standard input, keeps all of it in LOG and prints what a user needs of it (what is
being set up, and everything that is not nox's own `nox > ` line, such as this script's output
and a failed command's).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "rl_pipeline.py"
OUT = ROOT / ".demo"
#: Lines of a failed mode's log printed with its error.
TAIL = 40


def shown(path: Path) -> str:
    """`path` relative to the repository when it is inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def run(title: str, command: list[str], log: Path) -> None:
    """Run *command* with its output in *log*; print one line when it ends, and the end of
    the log when it fails."""
    print(f"\n== {title}", flush=True)
    started = time.monotonic()
    tail: deque[str] = deque(maxlen=TAIL)
    steps = 0
    with (
        log.open("w") as sink,
        subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            sink.write(line)
            tail.append(line)
            steps += line.startswith("step ") and " loss " in line
    took = time.monotonic() - started
    if proc.returncode:
        sys.stdout.write("".join(tail))
        sys.exit(f"{title}: exit code {proc.returncode} (all of its output: {shown(log)})")
    print(f"   {steps} steps in {took:.1f} s (its output: {shown(log)})", flush=True)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    os.environ.pop("RAY_ADDRESS", None)
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    py = sys.executable
    extra = sys.argv[1:]
    torchrun = [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    run(
        "mode local: torchrun --standalone --nproc_per_node=2 examples/rl_pipeline.py",
        [*torchrun, str(EXAMPLE), "--mode", "local", "--out", str(OUT / "local.json"), *extra],
        OUT / "local.log",
    )
    run(
        "mode ray: python examples/rl_pipeline.py --mode ray (embedded local cluster)",
        [py, str(EXAMPLE), "--mode", "ray", "--out", str(OUT / "ray.json"), *extra],
        OUT / "ray.log",
    )
    run(
        "mode inprocess (the reference semantics)",
        [py, str(EXAMPLE), "--mode", "inprocess", "--out", str(OUT / "inprocess.json"), *extra],
        OUT / "inprocess.log",
    )
    print("\n== per-step losses", flush=True)
    tables = [str(OUT / f"{mode}.json") for mode in ("local", "ray", "inprocess")]
    subprocess.run([py, str(ROOT / "examples" / "compare_losses.py"), *tables], check=True)
    print(f"\nlogs and tables: {shown(OUT)}/{{local,ray,inprocess}}.{{log,json}}", flush=True)


# --- nox's output, for scripts/demo.sh ---------------------------------------------------------

VENV = re.compile(r"^Creating virtual environment \(\w+\) using \S+ in (\S+)$")
REUSED = re.compile(r"^Re-?using existing virtual environment at (\S+?)\.?$")
BUILD = re.compile(r"^building \./(\S+) \(its sources changed\)$")
INSTALL = re.compile(r"^\S*uv pip install (.*)$")
QUIET = re.compile(
    r"^(Running session \S+"
    r"|\S*uv build .*"
    r"|python -I -c .*"  # the environment's import check (noxfile.py, _check_env)
    r"|python scripts/demo\.py.*"
    r"|Session \S+ was successful.*"
    r"|Ran \d+ sessions? in .*|\* \S+: success.*)$"
)


#: uv options whose value is the next argument.
TAKES_VALUE = {"--reinstall-package", "--extra-index-url", "--index-url", "--index-strategy"}
TAKES_VALUE |= {"-c", "--constraint", "-f", "--find-links"}
MAIN = re.compile(r"^(torch|ray|nixl|twinkle)\b")


def installing(arguments: str) -> str:
    """The main things `uv pip install ARGS` installs: `torch==2.13.0, twinkle-core, ...` (the
    test tools are left to the log)."""
    names, skip = [], False
    for arg in shlex.split(arguments):
        if skip or arg.startswith("-"):
            skip = arg in TAKES_VALUE
            continue
        if arg.endswith(".whl"):  # a twinkle package's wheel, built from the working tree
            arg = Path(arg).name.split("-")[0].replace("_", "-")
        names.append(arg)
    return ", ".join(n for n in names if MAIN.match(n)) or ", ".join(names)


def filter_nox(source: TextIO, log: TextIO, log_name: str, out: TextIO) -> None:
    """Copy every line of `source` to `log` (shown as `log_name`); to `out`, what a user
    needs of it."""
    building: list[str] = []

    def say(text: str | None) -> None:
        if building:
            out.write(f"   building the wheels of {', '.join(building)}\n")
            building.clear()
        if text is not None:
            out.write(text + "\n")
        out.flush()

    for line in iter(source.readline, ""):
        log.write(line)
        log.flush()
        text = line.rstrip("\n")
        if not text.startswith("nox > "):
            say(text)
            continue
        message = text[len("nox > ") :]
        venv, build, install = VENV.match(message), BUILD.match(message), INSTALL.match(message)
        reused = REUSED.match(message)
        if venv:
            say(
                f"\n== setting up {venv.group(1)}: twinkle, torch and ray (first run: a few "
                f"minutes; log: {log_name})"
            )
        elif reused:
            say(f"\n== using {reused.group(1)}, set up before (log: {log_name})")
        elif build:
            building.append(build.group(1))
        elif install:
            say(f"   installing {installing(install.group(1))}")
        elif not QUIET.match(message):
            say(text)  # anything else nox says (a failure, a warning) is shown as it is
    say(None)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--nox-output"]:
        target = Path(sys.argv[2])
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("w") as sink:
            filter_nox(sys.stdin, sink, shown(target.resolve()), sys.stdout)
    else:
        main()

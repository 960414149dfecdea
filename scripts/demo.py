"""Run examples/rl_pipeline.py unchanged under torchrun, on an embedded Ray cluster and in-process,
then print the per-step losses side by side (the `demo` nox session; `bash scripts/demo.sh`).

Logs and tables go to .demo/{local,ray,inprocess}.{log,json}.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "rl_pipeline.py"
OUT = ROOT / ".demo"


def run(title: str, command: list[str], log: Path, *, echo: bool = True) -> None:
    """Run *command*, writing its output to *log* (and to the terminal when *echo*)."""
    print(f"\n== {title}", flush=True)
    with (
        log.open("w") as sink,
        subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            sink.write(line)
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
    if proc.returncode:
        sys.exit(f"{title}: exit code {proc.returncode} (log: {log})")


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
        echo=False,
    )
    print("\n== per-step losses", flush=True)
    tables = [str(OUT / f"{mode}.json") for mode in ("local", "ray", "inprocess")]
    subprocess.run([py, str(ROOT / "examples" / "compare_losses.py"), *tables], check=True)
    print(f"\nlogs and tables: {OUT}/{{local,ray,inprocess}}.{{log,json}}")


if __name__ == "__main__":
    main()

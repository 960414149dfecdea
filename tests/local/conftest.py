"""Fixtures for twinkle-local's tests: a clean runtime, and real torchrun jobs.

Jobs run `python -m torch.distributed.run --standalone --nproc_per_node=2 SCRIPT` with a
timeout. torchrun starts its workers in their own sessions, so leftover processes are found by a
unique token in their environment (not by process group): after every job none may remain.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest
import torch
from _support import jobs, prestart
from _support.fixtures import _clean_runtime  # noqa: F401 - autouse in this suite
from _support.net import free_port

# Fixtures declared with `prestart.fixture` (the suite's torchrun jobs) run in the background
# from the session's start, two at a time: see tests/_support/prestart.py.
_prestart = prestart.session_fixture()

TESTS = Path(__file__).resolve().parents[1]
JOBS = TESTS / "local" / "jobs"
TORCHRUN_VARS = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@pytest.fixture
def single_process(monkeypatch):
    """This pytest process as a lone process: no torchrun variables."""
    for var in TORCHRUN_VARS:
        monkeypatch.delenv(var, raising=False)


class FakeCudaRng:
    """Per-device generator states for simulated GPUs (torch.cuda's rng API shape)."""

    def __init__(self, count: int) -> None:
        self.states = [torch.tensor([0], dtype=torch.uint8) for _ in range(count)]
        self.seeds: list[int] = []
        self.current: list[int] = []  # set_device calls

    def manual_seed_all(self, seed: int) -> None:
        self.seeds.append(seed)
        self.states = [torch.tensor([seed % 256], dtype=torch.uint8) for _ in self.states]

    def set_device(self, index: int) -> None:
        self.current.append(index)

    def get_rng_state_all(self):
        return [s.clone() for s in self.states]

    def set_rng_state_all(self, states) -> None:
        self.states = [s.clone() for s in states]


@pytest.fixture
def fake_cuda(monkeypatch):
    rng = FakeCudaRng(4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "manual_seed_all", rng.manual_seed_all)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", rng.get_rng_state_all)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", rng.set_rng_state_all)
    monkeypatch.setattr(torch.cuda, "set_device", rng.set_device)
    return rng


def run_job(
    script: str, out_dir: Path, *args: str, timeout: float = 120, nodes: int = 0, nproc: int = 2
) -> jobs.Job:
    """Run `jobs/<script>` under torchrun; never leaves a process behind.

    By default one `--standalone` launcher with `nproc` processes. With `nodes=N`, N launchers
    of one process each join through a c10d rendezvous, as N machines would (one store for the
    job, hosted by one of the launchers).
    """
    token = f"twinkle-test-{uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env.pop("TWINKLE_MODE", None)
    # The job scripts share the tests' helpers (`from _support import ...`), as pytest does.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    script_args = [str(JOBS / script), str(out_dir), *args]
    if nodes:
        endpoint = f"127.0.0.1:{free_port()}"
        rdzv = [
            f"--nnodes={nodes}",
            "--nproc_per_node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={token}",
        ]
        commands = [[*torchrun, *rdzv, *script_args] for _ in range(nodes)]
    else:
        commands = [[*torchrun, "--standalone", f"--nproc_per_node={nproc}", *script_args]]
    # cwd: not the repository root, whose source folders would shadow the installed packages.
    return jobs.run_job(commands, cwd=out_dir, env=env, timeout=timeout, token=token)

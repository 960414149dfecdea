"""Stack dumps: grouped by identical stacks, on demand and on SIGUSR1."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import threading

import twinkle_core
from twinkle_core import DeviceGroup, dump_stacks
from twinkle_core.stacks import group_stacks, render


def _parked(event: threading.Event) -> None:
    event.wait(30)  # parked here


def test_identical_stacks_are_printed_once_with_everyone_who_has_them():
    event = threading.Event()
    threads = [
        threading.Thread(target=_parked, args=(event,), name=f"parked-{i}") for i in range(3)
    ]
    for t in threads:
        t.start()
    try:
        out = io.StringIO()
        text = dump_stacks(file=out)
    finally:
        event.set()
        for t in threads:
            t.join()
    assert out.getvalue().rstrip("\n") == text
    block = next(b for b in text.split("--- ") if "parked-0" in b)
    assert block.startswith("3 x driver: parked-0; driver: parked-1; driver: parked-2")
    assert "in _parked" in block and "event.wait(30)  # parked here" in block
    assert "driver: MainThread" in text


def test_the_calling_threads_stack_ends_where_it_asked_not_inside_the_dump():
    text = dump_stacks(file=io.StringIO())
    block = next(b for b in text.split("--- ") if b.startswith("driver: MainThread"))
    # The innermost frame is this test's own line: none of stacks.py's frames follow it.
    assert block.rstrip().endswith("text = dump_stacks(file=io.StringIO())"), block
    assert "twinkle_core/stacks.py" not in block, block


def test_group_stacks_orders_the_most_shared_first():
    grouped = group_stacks([("a", "s1"), ("b", "s2"), ("c", "s1")])
    assert grouped == [(["a", "c"], "s1"), (["b"], "s2")]
    assert render([("a", "")]).endswith("(idle: no call running)")


def test_sigusr1_on_the_driver_dumps_every_stack(tmp_path):
    script = """
import os, signal, threading, time
import twinkle_core
from twinkle_core import DeviceGroup

twinkle_core.initialize("inprocess", groups=[DeviceGroup("g", 1)])
def stuck():
    time.sleep(3)  # the worker thread waits here
threading.Thread(target=stuck, name="stuck").start()
time.sleep(0.2)
os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(1.5)
twinkle_core.shutdown()
"""
    path = tmp_path / "driver.py"
    path.write_text(script)
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "twinkle: Python stacks of the driver and workers" in done.stderr
    assert "--- driver: stuck" in done.stderr
    assert "time.sleep(3)  # the worker thread waits here" in done.stderr


def test_the_sigusr1_handler_lives_as_long_as_the_run():
    before = signal.getsignal(signal.SIGUSR1)
    twinkle_core.initialize("inprocess", groups=[DeviceGroup("g", 1)])
    try:
        during = signal.getsignal(signal.SIGUSR1)
    finally:
        twinkle_core.shutdown()
    assert during is not before and callable(during)
    assert signal.getsignal(signal.SIGUSR1) is before

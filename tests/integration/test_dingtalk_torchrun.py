"""DingTalk alerts from a real torchrun job: 2 ranks both failing -> exactly one message.

The robot is the fake DingTalk server from tests/notify_dingtalk, started as its own process;
every rank runs the driver script and builds the notifier from TWINKLE_DINGTALK_*.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

from _support import prestart
from _support.fake_dingtalk import SECRET, TOKEN, read_log, start_process
from _support.jobs import run_job

DRIVER = textwrap.dedent(
    """
    import json, os, sys
    from twinkle_core import DeviceGroup, get_worker_context, initialize, remote_class
    from twinkle_core import remote_function

    @remote_class()
    class Trainer:
        @remote_function(dispatch="all", collect="none")
        def leaked(self):
            return sorted(k for k in os.environ if k.startswith("TWINKLE_DINGTALK_"))

        @remote_function(dispatch="all", collect="mean")
        def step(self, n):
            raise FloatingPointError(f"loss is NaN at step {n}")

    initialize("local", name="torchrun-nightly", groups=[DeviceGroup("trainer", 2, "cpu")],
               notifier="dingtalk", timeout=60)
    trainer = Trainer(remote_group="trainer")
    print("LEAKED " + json.dumps(trainer.leaked()()), flush=True)
    trainer.step(41)()  # CALL-SITE: both ranks fail, nobody catches: the job dies here
    """
)


@prestart.fixture(params=[0.0, 2.0], ids=["fast-robot", "slow-robot"])
def job(tmp_path_factory, param):
    """The job against a robot answering after `param` seconds (both run in the background
    from the session's start: tests/_support/prestart.py).

    With a slow robot the alert takes longer than torchrun takes to kill the other rank once
    one exits: the elected rank must still deliver before the job ends."""
    tmp_path = tmp_path_factory.mktemp("dingtalk-torchrun")
    delay = param
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    call_line = (
        DRIVER.splitlines().index(next(ln for ln in DRIVER.splitlines() if "CALL-SITE" in ln)) + 1
    )
    server, port = start_process(
        str(tmp_path / "port"), str(tmp_path / "robot.jsonl"), "--delay", str(delay)
    )
    try:
        env = dict(
            os.environ,
            TWINKLE_DINGTALK_WEBHOOK=f"http://127.0.0.1:{port}/robot/send?access_token={TOKEN}",
            TWINKLE_DINGTALK_SECRET=SECRET,
            no_proxy="127.0.0.1,localhost",
        )
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(driver),
        ]
        job = run_job([cmd], cwd=tmp_path, env=env, timeout=180, check_leftovers=False)
        code, out = job.returncode, job.output
    finally:
        server.terminate()
        server.wait(10)
    return driver, call_line, code, out, read_log(str(tmp_path / "robot.jsonl"))


def test_two_failing_ranks_send_exactly_one_message(job):
    driver, call_line, code, out, requests = job
    assert code != 0, out[-3000:]  # the uncaught failure ends the job
    assert out.count("LEAKED [[], []]") == 2, out[-3000:]  # from_env() took the secrets out
    assert len(requests) == 1, (requests, out[-3000:])
    (msg,) = requests
    assert msg["errcode"] == 0, msg  # signature and timestamp accepted
    md = msg["body"]["markdown"]
    assert md["title"] == "twinkle run torchrun-nightly: Trainer.step failed"
    text = md["text"]
    assert "(mode local)" in text
    assert f"{driver}:{call_line}" in text
    assert "trainer / 0, 1" in text  # both ranks, one message
    assert "FloatingPointError: loss is NaN at step 41" in text
    assert 'raise FloatingPointError(f"loss is NaN at step {n}")' in text  # traceback end
    # The secret and token appear nowhere in the job's output.
    assert SECRET not in out and TOKEN not in out
    assert json.dumps(msg).count(SECRET) == 0

"""Seeding does not import torch: the seed waits for the user's own `import torch`.

Each case runs in a fresh interpreter, where torch is not imported yet (this test process
imported it long ago). The numbers drawn must be the ones an eager `torch.manual_seed` at
`initialize()` gives. The four interpreters run in the background from the session's start,
two at a time (tests/_support/prestart.py); each test reads its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from concurrent.futures import Future, ThreadPoolExecutor

from _support import prestart


def _run(code: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


_WORKER = """
    import json, sys
    import twinkle_core as tc

    @tc.remote_class
    class Sampler:
        @tc.remote_function(dispatch="all", collect="none")
        def draw(self):
            import torch
            return torch.rand(3).tolist()
"""

_INITIALIZE = (
    _WORKER
    + """
    tc.initialize(mode="inprocess", groups=[tc.DeviceGroup("g", 2, "cpu")], seed=11)
    before = "torch" in sys.modules
    workers = Sampler(remote_group="g").draw()()
    import torch
    driver = torch.rand(3).tolist()
    tc.shutdown()
    torch.manual_seed(11)
    fresh = torch.rand(3).tolist()
    print(json.dumps({"before": before, "workers": workers, "driver": driver, "fresh": fresh}))
    """
)

_LAZY_OR_EAGER = textwrap.dedent(
    _WORKER
    + """
    if EAGER:
        import torch
    tc.initialize(mode="inprocess", groups=[tc.DeviceGroup("g", 2, "cpu")], seed=5)
    s = Sampler(remote_group="g")
    first = s.draw()()
    second = s.draw()()
    import torch
    driver = torch.rand(2).tolist()
    tc.shutdown()
    print(json.dumps({"first": first, "second": second, "driver": driver}))
    """
)

_LATER_SEED = """
    import json, sys
    import twinkle_core as tc
    tc.initialize(mode="inprocess", seed=1)
    tc.shutdown()
    tc.initialize(mode="inprocess", seed=2)
    import torch
    value = torch.rand(1).item()
    tc.shutdown()
    torch.manual_seed(2)
    print(json.dumps({"value": value, "fresh": torch.rand(1).item()}))
    """


@prestart.fixture
def runs(tmp_path_factory) -> dict[str, Future]:
    """Each case's interpreter, two at a time; `.result()` is its output (or its failure)."""
    cases = {
        "initialize": _INITIALIZE,
        "lazy": "EAGER = False\n" + _LAZY_OR_EAGER,
        "eager": "EAGER = True\n" + _LAZY_OR_EAGER,
        "later_seed": _LATER_SEED,
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        return {name: pool.submit(_run, code) for name, code in cases.items()}


def test_initialize_does_not_import_torch_and_the_seed_applies_on_import(runs):
    got = runs["initialize"].result()
    assert got["before"] is False
    assert got["workers"] == [got["fresh"], got["fresh"]]
    assert got["driver"] == got["fresh"]


def test_lazy_torch_import_draws_what_an_eager_import_draws(runs):
    """Worker streams stay separate and repeatable when torch arrives inside a method."""
    lazy, eager = runs["lazy"].result(), runs["eager"].result()
    assert lazy == eager
    assert lazy["first"] != lazy["second"]  # each worker's stream advances between calls


def test_a_later_seed_replaces_a_pending_one(runs):
    got = runs["later_seed"].result()
    assert got["value"] == got["fresh"]

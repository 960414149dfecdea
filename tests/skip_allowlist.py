"""The only tests allowed to skip (or xfail): ones that need hardware these machines lack.

Every other skip or xfail fails the run (see tests/conftest.py), so a suite cannot pass by
skipping. To add an entry, name the test by its pytest node id (as printed by ``pytest -rA``,
relative to the repository root, parameters included or left off to cover every case), and say
which hardware it needs. An entry must not be a reason pattern alone: a skip is allowed only for
the named test.

Set ``TWINKLE_ALLOW_SKIPS=1`` to turn the check off for an exploratory local run.
"""

from __future__ import annotations

#: node id (without parameters matches every parametrization) -> the hardware it needs.
ALLOWED_SKIPS: dict[str, str] = {
    # "tests/local/test_platforms.py::test_cuda_all_reduce": "needs two CUDA GPUs",
}


def allowed_reason(nodeid: str) -> str | None:
    """The allowlist's reason for skipping the test *nodeid*, or None when it may not skip."""
    if nodeid in ALLOWED_SKIPS:
        return ALLOWED_SKIPS[nodeid]
    base = nodeid.split("[", 1)[0]
    return ALLOWED_SKIPS.get(base)

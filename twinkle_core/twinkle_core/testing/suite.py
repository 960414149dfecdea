"""`BackendConformance`: the conformance checks as parametrized tests in a plugin's own suite.

Nothing here imports pytest: pytest calls a test class's `pytest_generate_tests` method itself.
"""

from __future__ import annotations

from typing import Any

from .checks import conformance_checks
from .runner import FAILED, NOT_APPLICABLE, CheckFailed, run_check


class BackendConformance:
    """Subclass it in a test module (the subclass's name must start with `Test`)::

        from twinkle_core.testing import BackendConformance

        class TestMyBackend(BackendConformance):
            mode = "mine"                      # the name your plugin registers
            options = {"workers_per_node": 2}  # backend options for initialize(), if any

    pytest then collects one `test_conformance[<check name>]` per check. A check the kit finds
    not applicable fails its test, unless the class names it in `expected_not_applicable`
    (e.g. `("collective_numpy_broadcast",)` for a backend without collective groups): that test
    then passes when the kit reports the check not applicable, and fails when it fails. Override
    `conformance_options(request)` to build the options from fixtures (e.g. a cluster's address).
    Each check runs in a run of its own in the pytest process, so this suits backends driven
    from one process (like `inprocess` or `ray`); run an SPMD backend under its launcher with
    `run_kit(mode, launcher=...)` instead.
    """

    mode: str = ""
    options: dict[str, Any] = {}
    #: Names of checks this backend cannot run (the kit says why when it reports them).
    expected_not_applicable: tuple[str, ...] = ()

    def pytest_generate_tests(self, metafunc: Any) -> None:
        if "conformance_check" in metafunc.fixturenames:
            checks = conformance_checks()
            metafunc.parametrize("conformance_check", checks, ids=[c.name for c in checks])

    def conformance_options(self, request: Any) -> dict[str, Any]:
        """Backend options for `initialize()`; `request` is pytest's fixture request."""
        return dict(self.options)

    def test_conformance(self, conformance_check: Any, request: Any) -> None:
        if not self.mode:
            raise CheckFailed(f"{type(self).__name__}.mode is not set: name the backend to test")
        result = run_check(conformance_check, self.mode, options=self.conformance_options(request))
        if result.outcome == FAILED:
            raise CheckFailed(f"{result.name}: {result.detail}")
        if result.outcome == NOT_APPLICABLE and result.name not in self.expected_not_applicable:
            raise CheckFailed(
                f"{result.name}: not applicable: {result.detail} (name it in "
                f"{type(self).__name__}.expected_not_applicable if this backend cannot run it)"
            )

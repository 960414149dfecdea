"""The conformance kit (`twinkle_core.testing`): it passes against the in-process reference,
and it fails, naming the check, against backends broken on purpose."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
import time

import pytest

from twinkle_core.plugins import plugin_system
from twinkle_core.testing import (
    FAILED,
    NOT_APPLICABLE,
    PASSED,
    BackendConformance,
    CheckFailed,
    CheckResult,
    conformance_checks,
    main,
    run_checks,
    run_kit,
)
from twinkle_core.testing.cli import RankReport, aggregate, parse_option
from twinkle_core.testing.runner import same

from .plugin_factory import make_plugin

# Backends broken on purpose, built on the in-process one: one sums where a mean is asked, one
# runs execute='first' calls on every worker, one lets an unsendable argument fail as copy's bare
# TypeError, one hands numpy arrays to a torch-only collective; and one without collective groups.
BROKEN = """
import copy
import io
import types

import numpy as np

from twinkle_core import hookimpl
from twinkle_core.inprocess import InProcessBackend
from twinkle_core.plugin import (
    Collective,
    CompletedCall,
    ExecutionBackend,
    SumCollector,
    WorkerCall,
    WorkerGroup,
    as_tensor_list,
)


class Wrapped(WorkerGroup):
    def __init__(self, inner):
        super().__init__(
            inner.group, inner.device_mesh, inner.class_name, inner.size, inner.placements
        )
        self.inner = inner


class SumForMeanCall(CompletedCall):
    def collect(self, collector, device_mesh, timeout):
        if getattr(collector, "reduce_op", None) == "mean":
            collector = SumCollector()
        return super().collect(collector, device_mesh, timeout)


class SumForMeanGroup(Wrapped):
    def submit(self, call):
        done = self.inner.submit(call)
        return SumForMeanCall(done.results, done.failures)


class FirstOnAllGroup(Wrapped):
    def submit(self, call):
        if len(call.calls) == 1 and self.size > 1:
            one = call.calls[0]
            call.calls = [WorkerCall(rank, one.args, one.kwargs) for rank in range(self.size)]
        return self.inner.submit(call)


class SumForMean(InProcessBackend):
    name = "sum-for-mean"

    def create_workers(self, *args, **kwargs):
        return SumForMeanGroup(super().create_workers(*args, **kwargs))


class FirstOnAll(InProcessBackend):
    name = "first-on-all"

    def create_workers(self, *args, **kwargs):
        return FirstOnAllGroup(super().create_workers(*args, **kwargs))


# Copies every call's arguments with plain deepcopy: an unsendable one is copy's bare TypeError
# (in-process before issue 30, item 8; torchrun too).
class RawCopyGroup(Wrapped):
    def submit(self, call):
        for one in call.calls:
            copy.deepcopy((one.args, one.kwargs))
        return self.inner.submit(call)


class RawCopyError(InProcessBackend):
    name = "raw-copy-error"

    def create_workers(self, *args, **kwargs):
        return RawCopyGroup(super().create_workers(*args, **kwargs))


# Sends a stand-in for a result tied to the worker's process (Ray before this check): a
# generator's first item, a StringIO copy of an open file.
def stand_in(value):
    if isinstance(value, types.GeneratorType):
        return next(value)
    if isinstance(value, dict) and isinstance(value.get("out"), list):
        return {"out": [io.StringIO(f.read()) for f in value["out"]]}
    return value


class StandInGroup(Wrapped):
    def submit(self, call):
        done = self.inner.submit(call)
        return CompletedCall([stand_in(r) for r in done.results], done.failures)


class StandInResults(InProcessBackend):
    name = "stand-in-results"

    def initialize(self, config):
        super().initialize(config)
        self.isolate = False  # the results as the workers returned them, then stood in for

    def create_workers(self, *args, **kwargs):
        return StandInGroup(super().create_workers(*args, **kwargs))


# A member handing numpy arrays straight to torch.distributed (Ray before issue 30, item 3):
# torch's raw TypeError.
class TorchOnlyMember(Collective):
    def __init__(self, inner):
        super().__init__(inner.spec, inner.rank)
        self.inner = inner

    def broadcast(self, tensors, src=0):
        if any(isinstance(t, np.ndarray) for t in as_tensor_list(tensors, "tensors")):
            raise TypeError(
                "Expected parameter tensor of type torch.Tensor but got numpy.ndarray"
            )
        return self.inner.broadcast(tensors, src)

    def all_reduce(self, tensors, op="sum"):
        return self.inner.all_reduce(tensors, op)

    def all_gather(self, tensor):
        return self.inner.all_gather(tensor)

    def barrier(self):
        self.inner.barrier()


class TorchOnlyCollectives(InProcessBackend):
    name = "torch-only-collectives"

    def create_collective_group(self, group, workers):
        super().create_collective_group(group, workers)
        for w in workers:
            for state in w.states:
                inner = state.context.collectives[group.name]
                state.context.collectives[group.name] = TorchOnlyMember(inner)


# A backend without collective groups (the hook is optional).
class NoCollectives(InProcessBackend):
    name = "no-collectives"
    create_collective_group = ExecutionBackend.create_collective_group


@hookimpl
def register_backends(register):
    register("sum-for-mean", SumForMean)
    register("first-on-all", FirstOnAll)
    register("raw-copy-error", RawCopyError)
    register("stand-in-results", StandInResults)
    register("torch-only-collectives", TorchOnlyCollectives)
    register("no-collectives", NoCollectives)
"""

# A stand-in launcher: starts `python SCRIPT ARGS...` once per rank with RANK and WORLD_SIZE set,
# as torchrun would (or only some ranks, or hangs), so the launching side is tested without torch.
FAKE_LAUNCHER = """
import os, subprocess, sys, time

world, start = int(sys.argv[1]), int(sys.argv[2])
if start < 0:
    time.sleep(600)
procs = [
    subprocess.Popen(
        [sys.executable, *sys.argv[3:]],
        env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(world)},
    )
    for r in range(start, world)
]
sys.exit(max(p.wait() for p in procs))
"""


@pytest.fixture
def broken_site(tmp_path, monkeypatch, fresh_plugins):
    """The broken backends as an installed plugin distribution on sys.path and PYTHONPATH."""
    make_plugin(tmp_path, "twinkle-broken-kit", "twinkle_broken_kit", BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    paths = [str(tmp_path), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    return tmp_path


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    return env


# ----------------------------------------------------------------------------- the checks
def test_the_kit_has_at_least_twenty_named_checks():
    checks = conformance_checks()
    names = [c.name for c in checks]
    assert len(names) >= 20
    assert len(set(names)) == len(names)
    for needed in (
        "dispatch_all", "dispatch_slice", "dispatch_slice_dp", "dispatch_callable",
        "execute_all", "execute_first_collect_none", "execute_peer",
        "collect_none", "collect_flatten", "collect_mean", "collect_sum", "collect_first",
        "sum_refuses_what_it_cannot_add",
        "collect_last_pp", "collect_concat", "collect_callable", "collect_dict_per_key",
        "collect_tuple_elementwise", "device_mesh_keyword", "device_mesh_positional",
        "device_mesh_default", "lazy_to_group_of_other_size", "lazy_to_constructor",
        "lazy_nested_in_arguments", "dispatcher_raising_leaves_nothing_behind",
        "colocated_roles_share_processes", "colocated_hand_off_by_reference",
        "roles_take_turns",
        "iterate_remote_loader", "seeded_random",
        "error_value_error", "error_key_error", "error_os_error", "error_two_arg_init",
        "error_unpicklable_attribute", "error_broken_str", "timeout_per_method",
        "dispatch_wrong_share_count",
        "mesh_dp2_tp2_slice_dp", "mesh_dp2_tp2_reductions", "mesh_accessors",
        "error_unsendable_argument", "error_unsendable_result", "wait_num_returns",
        "wait_loop_each_result_once",
        "collective_numpy_broadcast",
    ):  # fmt: skip
        assert needed in names
    worlds = {c.name: c.world_size for c in checks}
    assert {n for n, w in worlds.items() if w > 2} == {
        "mesh_dp2_tp2_slice_dp",
        "mesh_dp2_tp2_reductions",
        "mesh_accessors",
    }
    assert all(1 <= w <= 4 for w in worlds.values())


def test_comparison_is_strict_about_containers_and_loose_about_number_types():
    import numpy as np

    assert same([1, 2.0], [1, 2])
    assert same(np.float64(14.0), 14.0)
    assert not same((7, 6.0), [7, 6.0])
    assert not same([7, 6.0], (7, 6.0))
    assert not same(np.array([1, 2]), [1, 2])
    assert not same(True, 1)
    assert not same(28.0, 14.0)
    assert same({"a": [1]}, {"a": [1]}) and not same({"a": [1]}, {"a": [1], "b": 2})


# ----------------------------------------------------------------------------- the reference
@pytest.mark.slow  # a real subprocess
@pytest.mark.timeout(240)
def test_inprocess_passes_every_check_from_the_command_line(tmp_path):
    run = run_kit("inprocess", cwd=tmp_path, env=_env(), timeout=180)
    assert run.returncode == 0, run.output
    assert run.passed >= 20 and run.failed == 0, run.output
    assert run.passed == len(conformance_checks())
    assert f"{run.passed} passed, 0 failed" in run.output.splitlines()


class TestInProcessWithTheBaseClass(BackendConformance):
    """What a plugin's own test suite writes: one test per check."""

    mode = "inprocess"


def test_a_small_world_reports_not_applicable_never_passed():
    report = run_checks("inprocess", world_size=2, select=["mesh_dp2_tp2", "collect_sum"])
    outcomes = {r.name: r.outcome for r in report.results}
    assert outcomes == {
        "collect_sum": PASSED,
        "mesh_dp2_tp2_slice_dp": NOT_APPLICABLE,
        "mesh_dp2_tp2_reductions": NOT_APPLICABLE,
    }
    assert report.summary_line() == "1 passed, 0 failed, 2 not applicable"
    assert report.ok
    assert "needs a world of 4 processes" in report.not_applicable[0].detail


def test_require_all_fails_when_a_check_is_not_applicable(capsys):
    args = ["--mode", "inprocess", "-k", "mesh_dp2_tp2_slice", "-k", "collect_sum"]
    assert main([*args, "--world-size", "2"]) == 0
    assert main([*args, "--world-size", "2", "--require-all"]) == 1
    assert main([*args, "--world-size", "4", "--require-all"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out.count("1 passed, 0 failed, 1 not applicable") == 2
    assert out[-1] == "2 passed, 0 failed"
    assert out[0].startswith("NOT APPLICABLE mesh_dp2_tp2_slice_dp: needs a world of 4")


def test_nothing_run_is_not_a_pass(capsys):
    assert main(["--mode", "inprocess", "-k", "mesh_dp2", "--world-size", "1"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "0 passed, 0 failed, 2 not applicable"


def test_options_are_json_when_they_parse():
    assert parse_option("address=127.0.0.1:6379") == ("address", "127.0.0.1:6379")
    assert parse_option("timeout=60") == ("timeout", 60)
    assert parse_option("isolate=false") == ("isolate", False)
    assert parse_option('cpus_per_worker={"g": 0.5}') == ("cpus_per_worker", {"g": 0.5})
    assert parse_option("name=a=b") == ("name", "a=b")


def test_backend_options_reach_initialize(capsys):
    assert main(["--mode", "inprocess", "-k", "collect_sum", "--option", "isolate=false"]) == 0
    assert main(["--mode", "inprocess", "-k", "collect_sum", "--option", "bogus=1"]) == 1
    out = capsys.readouterr().out
    assert "FAILED collect_sum: initialize failed: ConfigurationError" in out
    assert "unknown options ['bogus']" in out


# ----------------------------------------------------------------------------- broken backends
@pytest.mark.slow  # a real subprocess
@pytest.mark.timeout(240)
def test_the_kit_fails_a_backend_that_sums_where_mean_is_asked(broken_site):
    run = run_kit("sum-for-mean", cwd=broken_site, timeout=180)
    assert run.returncode == 1, run.output
    assert run.passed >= 20
    assert {"collect_mean", "collect_dict_per_key", "mesh_dp2_tp2_reductions"} <= set(
        run.failed_checks
    ), run.output
    assert run.failed_checks["collect_mean"].endswith("expected 14.0, got 28.0"), run.output
    assert f"{run.passed} passed, {run.failed} failed" in run.output


@pytest.mark.slow  # a real subprocess
@pytest.mark.timeout(240)
def test_the_kit_fails_a_backend_running_execute_first_on_every_worker(broken_site):
    run = run_kit("first-on-all", cwd=broken_site, timeout=180)
    assert run.returncode == 1, run.output
    detail = run.failed_checks["execute_first_collect_none"]
    assert detail.endswith("expected [[0, 5]], got [[0, 5], [1, 5]]"), run.output
    assert run.failed >= 1


def test_a_plugin_registered_at_run_time_is_checked_in_process(
    tmp_path, monkeypatch, fresh_plugins
):
    (tmp_path / "twinkle_broken_at_run_time.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("twinkle_broken_at_run_time")
    plugin_system().add(module, "broken_at_run_time")
    report = run_checks("first-on-all", select=["execute_first", "collect_sum"])
    outcomes = {r.name: r.outcome for r in report.results}
    assert outcomes == {"execute_first_collect_none": FAILED, "collect_sum": PASSED}
    assert not report.ok


@pytest.fixture
def broken_in_process(tmp_path, monkeypatch, fresh_plugins):
    """The broken backends registered in this process (checked with `run_checks`)."""
    (tmp_path / "twinkle_broken_in_process.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("twinkle_broken_in_process", None)
    plugin_system().add(importlib.import_module("twinkle_broken_in_process"), "broken_in_process")


def test_the_kit_fails_an_unsendable_argument_that_is_a_bare_type_error(broken_in_process):
    """Issue 30, item 8: what in-process and torchrun raised before, copy's bare TypeError."""
    report = run_checks("raw-copy-error", select=["error_unsendable_argument", "collect_sum"])
    outcomes = {r.name: r.outcome for r in report.results}
    assert outcomes == {"error_unsendable_argument": FAILED, "collect_sum": PASSED}
    assert report.failed[0].detail.startswith(
        "take(Unsendable()) (an object holding a threading.Lock): expected ConfigurationError "
        "naming 'Probe.take: argument 0', got TypeError: \"cannot pickle '_thread.lock' object\""
    ), report.failed[0].detail


def test_the_kit_fails_a_stand_in_for_a_result_that_cannot_be_sent(broken_in_process):
    """What Ray sent before: a generator's first item, an open file as a StringIO copy."""
    report = run_checks("stand-in-results", select=["error_unsendable_result", "collect_sum"])
    outcomes = {r.name: r.outcome for r in report.results}
    assert outcomes == {"error_unsendable_result": FAILED, "collect_sum": PASSED}
    detail = report.failed[0].detail
    assert detail.startswith(
        "generator_result() returning a generator on rank 1: expected TypeError starting "
        "'[twinkle driver caller: twinkle-conformance-driver:2] the result of "
        "Faulty.generator_result on rank 1 (generator) cannot be sent', got the value [0, 0]"
    ), detail


def test_the_kit_fails_collectives_that_refuse_numpy_arrays(broken_in_process):
    """Issue 30, item 3: what Ray raised before, torch's TypeError for a numpy array."""
    report = run_checks("torch-only-collectives", select=["collective_numpy_broadcast"])
    [result] = report.results
    assert result.outcome == FAILED
    assert result.detail.startswith("raised TypeError: "), result.detail
    assert "Expected parameter tensor of type torch.Tensor but got numpy.ndarray" in result.detail


def test_a_backend_without_collective_groups_is_not_applicable_never_passed(broken_in_process):
    report = run_checks("no-collectives", select=["collective_numpy_broadcast", "collect_sum"])
    outcomes = {r.name: r.outcome for r in report.results}
    assert outcomes == {"collective_numpy_broadcast": NOT_APPLICABLE, "collect_sum": PASSED}
    assert report.not_applicable[0].detail.startswith(
        "mode 'no-collectives' has no collective groups"
    )
    assert report.ok and report.summary_line() == "1 passed, 0 failed, 1 not applicable"


def test_a_backend_sharing_the_drivers_objects_cannot_fail_to_send_an_argument():
    report = run_checks(
        "inprocess", options={"isolate": False}, select=["error_unsendable", "collect_sum"]
    )
    outcomes = {r.name: r.outcome for r in report.results}
    assert outcomes == {
        "error_unsendable_argument": NOT_APPLICABLE,
        "error_unsendable_result": NOT_APPLICABLE,
        "collect_sum": PASSED,
    }
    details = {r.name: r.detail for r in report.not_applicable}
    assert "hands workers the driver's own objects" in details["error_unsendable_argument"]
    assert "hands the driver the workers' own objects" in details["error_unsendable_result"]


def test_the_kit_fails_a_wait_returning_every_finished_call(monkeypatch):
    """Issue 30, item 5: `wait` as it was, every finished call done whatever num_returns."""
    from twinkle_core.testing import checks

    def every_finished(lazies, num_returns=1, timeout=None):
        items = list(lazies)
        while sum(x.done() for x in items) < num_returns:
            time.sleep(0.005)
        return [x for x in items if x.done()], [x for x in items if not x.done()]

    monkeypatch.setattr(checks, "wait", every_finished)
    report = run_checks("inprocess", select=["wait_"])
    details = {r.name: r.detail for r in report.failed}
    assert set(details) == {"wait_num_returns", "wait_loop_each_result_once"}, report.lines()
    assert details["wait_num_returns"].endswith(
        "num_returns=1): positions [done, pending]: expected [[0], [1, 2]], got [[0, 1, 2], []]"
    )
    assert details["wait_loop_each_result_once"].endswith("expected [1, 1, 1, 1, 1, 1], got [6]")


def test_the_base_class_fails_a_not_applicable_check_unless_expected():
    [check] = [c for c in conformance_checks() if c.name == "error_unsendable_argument"]

    class Sharing(BackendConformance):
        mode = "inprocess"
        options = {"isolate": False}

    class SharingKnown(Sharing):
        expected_not_applicable = ("error_unsendable_argument",)

    with pytest.raises(CheckFailed, match="error_unsendable_argument: not applicable: mode"):
        Sharing().test_conformance(check, None)
    SharingKnown().test_conformance(check, None)


# ----------------------------------------------------------------------------- the launcher side
@pytest.fixture
def launcher(tmp_path):
    path = tmp_path / "fake_launcher.py"
    path.write_text(textwrap.dedent(FAKE_LAUNCHER))
    return f"{sys.executable} {path}"


@pytest.mark.slow  # a real subprocess
@pytest.mark.timeout(240)
def test_every_rank_runs_the_checks_and_the_launching_side_agrees_them(tmp_path, launcher):
    run = run_kit(
        "inprocess",
        launcher=f"{launcher} 2 0",
        select=["collect_", "mesh_dp2_tp2_slice_dp"],
        cwd=tmp_path,
        env=_env(),
        timeout=120,
    )
    assert run.returncode == 0, run.output
    collect = [c for c in conformance_checks() if "collect_" in c.name]
    assert (run.passed, run.failed, run.not_applicable) == (len(collect), 0, 1), run.output
    assert run.not_applicable_checks == ["mesh_dp2_tp2_slice_dp"]
    assert run.output.splitlines()[-1] == f"{len(collect)} passed, 0 failed, 1 not applicable"


@pytest.mark.slow  # a real subprocess
@pytest.mark.timeout(240)
def test_a_rank_that_never_reports_fails_every_check(tmp_path, launcher):
    run = run_kit(
        "inprocess", launcher=f"{launcher} 2 1", select=["collect_sum"], cwd=tmp_path,
        env=_env(), timeout=120,
    )  # fmt: skip
    assert run.returncode == 1
    assert run.failed_checks == {
        "collect_sum": "ranks disagree; rank 0: never started; rank 1: passed"
    }, run.output


@pytest.mark.slow  # a real subprocess
@pytest.mark.timeout(120)
def test_a_hanging_launcher_is_stopped_at_the_timeout(tmp_path, launcher):
    started = time.monotonic()
    run = run_kit(
        "inprocess", launcher=f"{launcher} 2 -1", select=["collect_sum"], cwd=tmp_path,
        env=_env(), timeout=3,
    )  # fmt: skip
    assert time.monotonic() - started < 60
    assert run.returncode == 1, run.output
    assert "ERROR the launched job did not finish within 3s" in run.output
    assert run.failed_checks == {"collect_sum": "no rank reported an outcome"}


def test_ranks_that_disagree_fail_the_check():
    def rank(r, outcome, detail=""):
        return RankReport(r, 2, {"c": CheckResult("c", outcome, detail)}, True)

    agreed = aggregate(["c"], [rank(0, PASSED), rank(1, PASSED)], 0)
    assert [r.outcome for r in agreed.results] == [PASSED] and agreed.ok
    split = aggregate(["c"], [rank(0, PASSED), rank(1, FAILED, "expected 1, got 2")], 0)
    assert split.results[0].outcome == FAILED
    assert split.results[0].detail == "ranks disagree; rank 0: passed; rank 1: expected 1, got 2"
    same_failure = aggregate(["c"], [rank(0, FAILED, "x"), rank(1, FAILED, "x")], 0)
    assert same_failure.results[0].detail == "on every rank: x"
    crashed = aggregate(["c"], [rank(0, PASSED), rank(1, PASSED)], 1)
    assert crashed.errors == ["the launcher exited with code 1"] and not crashed.ok
    assert crashed.summary_line() == "1 passed, 0 failed, 1 error"


def test_an_unknown_mode_is_a_usage_error(capsys):
    assert main(["--mode", "no-such-backend"]) == 2
    err = capsys.readouterr().err
    assert "no backend named 'no-such-backend' is registered" in err and "inprocess" in err

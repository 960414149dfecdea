"""`python -m twinkle_core.testing`: run the conformance checks against a backend.

Without `--launcher` the checks run in this process (a backend with a driver process:
`inprocess`, `ray`, ...). With `--launcher` (an SPMD backend such as `local`), this process starts
`LAUNCHER <this package's __main__.py> ...`: every rank runs every check and writes its outcomes
to a report file; this process then agrees them (a check passes only when it passed on every
rank) and prints the summary once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .runner import (
    FAILED,
    NOT_APPLICABLE,
    PASSED,
    CheckResult,
    ConformanceReport,
    run_checks,
    select_checks,
)

#: The script a launcher runs on every rank (this package's `__main__.py`).
MAIN_SCRIPT = str(Path(__file__).with_name("__main__.py"))
#: Environment variable marking every process of one launched run (to stop leftovers).
RUN_TOKEN_ENV = "TWINKLE_CONFORMANCE_RUN"
DEFAULT_TIMEOUT = 900.0

SUMMARY_RE = re.compile(
    r"^(?P<passed>\d+) passed, (?P<failed>\d+) failed"
    r"(?:, (?P<na>\d+) not applicable)?(?:, (?P<errors>\d+) errors?)?$"
)


def parse_option(text: str) -> tuple[str, Any]:
    """`key=value` -> (key, value): the value parsed as JSON when it parses, else the string."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--option takes key=value, got {text!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m twinkle_core.testing",
        description="Run twinkle's backend conformance checks against the backend registered "
        "as --mode, and print 'N passed, M failed'. Exits 0 only when every check that can run "
        "in the given world passed.",
    )
    parser.add_argument("--mode", help="the backend name, as for initialize(mode=...)")
    parser.add_argument(
        "--launcher",
        help="for SPMD backends: the command that starts the processes, e.g. "
        "'torchrun --standalone --nproc_per_node=2' (the kit's script and arguments are "
        "appended; the launcher must run a Python script)",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        type=parse_option,
        metavar="KEY=VALUE",
        help="a backend option for initialize(); VALUE is parsed as JSON when it parses, "
        "else taken as a string (repeatable)",
    )
    parser.add_argument(
        "-k",
        dest="select",
        action="append",
        default=[],
        metavar="SUBSTRING",
        help="run only checks whose name contains SUBSTRING (repeatable)",
    )
    parser.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="processes available to each group (default: $WORLD_SIZE under a launcher, "
        "else unlimited); checks needing more are reported as not applicable",
    )
    parser.add_argument(
        "--require-all",
        action="store_true",
        help="also fail (exit 1) when a check is not applicable in this world",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds the launched job may take before it is stopped "
        f"(default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="print passed checks and the job's output too"
    )
    parser.add_argument("--report-dir", help=argparse.SUPPRESS)  # set for the launched ranks
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from .checks import conformance_checks

    if args.list:
        for check in select_checks(conformance_checks(), args.select):
            print(f"{check.name}  (world {check.world_size})  {check.description}")
        return 0
    if not args.mode:
        print("error: --mode is required (a backend name, e.g. --mode inprocess)", file=sys.stderr)
        return 2
    options = dict(args.option)
    from twinkle_core.plugin import registered_names

    backends = registered_names("backends")
    if args.mode not in backends:
        print(
            f"error: no backend named {args.mode!r} is registered (registered: "
            f"{', '.join(backends) or 'none'}); install the plugin that provides it",
            file=sys.stderr,
        )
        return 2
    if args.report_dir:
        return _run_as_rank(args, options)
    if args.launcher:
        report = _run_launched(args)
    else:
        world = args.world_size if args.world_size is not None else _env_int("WORLD_SIZE")
        report = run_checks(args.mode, options=options, world_size=world, select=args.select)
    for line in report.lines(verbose=args.verbose):
        print(line, flush=True)
    if args.require_all and report.not_applicable:
        return 1
    return 0 if report.ok else 1


def _env_int(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


# --------------------------------------------------------------------- one rank of a job
def _run_as_rank(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """Run the checks as one rank of a launched job, writing each outcome as it comes."""
    rank = _env_int("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK")
    world = (
        args.world_size
        if args.world_size is not None
        else _env_int("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
    )
    path = Path(args.report_dir) / f"rank{rank if rank is not None else 'x'}-{os.getpid()}.jsonl"
    with path.open("w") as out:

        def write(record: Mapping[str, Any]) -> None:
            out.write(json.dumps(record) + "\n")
            out.flush()

        write({"rank": rank, "world": world, "pid": os.getpid()})
        report = run_checks(
            args.mode,
            options=options,
            world_size=world,
            select=args.select,
            on_result=lambda result: write(result.as_json()),
        )
        write({"done": True})
    for line in report.lines():
        print(f"[rank {rank}] {line}", flush=True)
    return 0  # the verdict is in the report; a non-zero exit means the rank crashed


# --------------------------------------------------------------------- the launching side
def _run_launched(args: argparse.Namespace) -> ConformanceReport:
    from .checks import conformance_checks

    names = [c.name for c in select_checks(conformance_checks(), args.select)]
    report_dir = Path(tempfile.mkdtemp(prefix="twinkle-conformance-"))
    command = [*shlex.split(args.launcher), MAIN_SCRIPT, "--mode", args.mode]
    command += ["--report-dir", str(report_dir)]
    for key, value in args.option:
        command += ["--option", f"{key}={json.dumps(value)}"]
    for sub in args.select:
        command += ["-k", sub]
    if args.world_size is not None:
        command += ["--world-size", str(args.world_size)]
    errors: list[str] = []
    log_path = report_dir / "launcher.log"
    try:
        returncode = _run_job(command, log_path, args.timeout, errors)
        report = aggregate(names, _read_reports(report_dir), returncode, errors)
        if args.verbose or not report.ok:
            output = log_path.read_text(errors="replace").splitlines()
            shown = output if args.verbose else output[-80:]
            print(
                f"--- launcher output ({' '.join(command)}), last {len(shown)} lines ---",
                file=sys.stderr,
            )
            for line in shown:
                print(line, file=sys.stderr)
            print("--- end of launcher output ---", file=sys.stderr, flush=True)
        return report
    finally:
        shutil.rmtree(report_dir, ignore_errors=True)


def _run_job(command: list[str], log_path: Path, timeout: float, errors: list[str]) -> int | None:
    """Run the launcher with its output in `log_path`; stop it (and every process it started)
    after `timeout` seconds. Returns its exit code, None when it had to be stopped."""
    token = uuid.uuid4().hex
    env = {**os.environ, RUN_TOKEN_ENV: token, "PYTHONUNBUFFERED": "1"}
    with log_path.open("w") as log:
        try:
            proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        except OSError as exc:
            errors.append(f"could not start the launcher {command[0]!r}: {exc}")
            return None
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            errors.append(
                f"the launched job did not finish within {timeout:g}s and was stopped "
                "(checks without an outcome count as failed)"
            )
            _stop(proc, token)
            return None
        except BaseException:
            _stop(proc, token)
            raise


def _stop(proc: subprocess.Popen, token: str) -> None:
    """SIGTERM the launcher's process group, then SIGKILL whatever of this run is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    leftovers = [proc.pid, *_processes_with(token)]
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _processes_with(token: str) -> list[int]:
    """Processes whose environment holds this run's token (Linux; none elsewhere). Launchers
    may start ranks in sessions of their own, out of reach of the process group."""
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        return []
    needle = f"{RUN_TOKEN_ENV}={token}".encode()
    found = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@dataclass
class RankReport:
    rank: int | None
    world: int | None
    results: dict[str, CheckResult] = field(default_factory=dict)
    done: bool = False


def _read_reports(report_dir: Path) -> list[RankReport]:
    reports = []
    for path in sorted(report_dir.glob("rank*.jsonl")):
        lines = path.read_text(errors="replace").splitlines()
        if not lines:
            continue
        try:
            header = json.loads(lines[0])
        except ValueError:
            continue
        report = RankReport(header.get("rank"), header.get("world"))
        for line in lines[1:]:
            try:
                record = json.loads(line)
            except ValueError:
                break  # a line cut off by a crash
            if record.get("done"):
                report.done = True
            elif "name" in record:
                report.results[record["name"]] = CheckResult(
                    record["name"],
                    record["outcome"],
                    record.get("detail", ""),
                    float(record.get("seconds", 0.0)),
                )
        reports.append(report)
    return reports


def aggregate(
    names: Sequence[str],
    reports: Sequence[RankReport],
    returncode: int | None,
    errors: Sequence[str] = (),
) -> ConformanceReport:
    """One verdict per check from every rank's report: passed (or not applicable) only when
    every rank of the world says so; a rank without an outcome counts as a failure."""
    errors = list(errors)
    worlds = {r.world for r in reports if r.world is not None}
    if len(worlds) > 1:
        errors.append(f"the ranks disagree on the world size: {sorted(worlds)}")
    world = max(worlds) if worlds else len(reports)
    by_rank: dict[int, RankReport] = {}
    for index, report in enumerate(reports):
        key = report.rank if report.rank is not None else index
        if key in by_rank:
            errors.append(f"two processes reported as rank {key}")
        by_rank[key] = report
    expected = list(range(world)) if world else []
    if not reports:
        errors.append("no rank wrote a report (see the launcher output above)")
    if returncode not in (0, None):
        errors.append(f"the launcher exited with code {returncode}")
    silent = [r for r in expected if r not in by_rank]
    results = []
    for name in names:
        outcomes: dict[int, CheckResult | None] = {
            r: by_rank[r].results.get(name) if r in by_rank else None for r in expected
        }
        results.append(_agree(name, outcomes, silent))
    return ConformanceReport(results, errors)


def _agree(
    name: str, outcomes: Mapping[int, CheckResult | None], silent: Sequence[int]
) -> CheckResult:
    if not outcomes:
        return CheckResult(name, FAILED, "no rank reported an outcome")
    kinds = {o.outcome if o is not None else None for o in outcomes.values()}
    seconds = max((o.seconds for o in outcomes.values() if o is not None), default=0.0)
    if kinds == {PASSED}:
        return CheckResult(name, PASSED, seconds=seconds)
    if kinds == {NOT_APPLICABLE}:
        return CheckResult(name, NOT_APPLICABLE, next(iter(outcomes.values())).detail)  # type: ignore[union-attr]
    details = {o.detail for o in outcomes.values() if o is not None and o.outcome == FAILED}
    if kinds == {FAILED} and len(details) == 1:
        return CheckResult(name, FAILED, f"on every rank: {details.pop()}")
    parts = []
    for rank, outcome in sorted(outcomes.items()):
        if outcome is None:
            why = "never started" if rank in silent else "no outcome (crashed or stopped)"
            parts.append(f"rank {rank}: {why}")
        elif outcome.outcome == FAILED:
            parts.append(f"rank {rank}: {outcome.detail}")
        else:
            parts.append(f"rank {rank}: {outcome.outcome}")
    return CheckResult(name, FAILED, "ranks disagree; " + "; ".join(parts))


# --------------------------------------------------------------------- for test suites
@dataclass
class KitRun:
    """The outcome of `run_kit`: the counts from the summary line and the whole output."""

    command: list[str]
    returncode: int | None
    output: str
    passed: int = 0
    failed: int = 0
    not_applicable: int = 0
    errors: int = 0
    failed_checks: dict[str, str] = field(default_factory=dict)
    not_applicable_checks: list[str] = field(default_factory=list)
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run_kit(
    mode: str,
    *,
    launcher: str | None = None,
    options: Mapping[str, Any] | None = None,
    select: Sequence[str] = (),
    world_size: int | None = None,
    python: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    cwd: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
) -> KitRun:
    """Run `python -m twinkle_core.testing --mode MODE ...` as a subprocess and parse what it
    printed: for a plugin's own test suite, e.g. an SPMD backend under its launcher.

    The subprocess is given `timeout` seconds (plus a margin for its own clean-up) and killed
    after that; `KitRun.returncode` is then None.
    """
    command = [python or sys.executable, "-m", "twinkle_core.testing", "--mode", mode]
    if launcher:
        command += ["--launcher", launcher, "--timeout", str(timeout)]
    for key, value in (options or {}).items():
        command += ["--option", f"{key}={json.dumps(value)}"]
    for sub in select:
        command += ["-k", sub]
    if world_size is not None:
        command += ["--world-size", str(world_size)]
    started = time.monotonic()
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout + 60)
        returncode: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        returncode = None
    run = KitRun(command, returncode, output or "", elapsed=time.monotonic() - started)
    for line in run.output.splitlines():
        match = SUMMARY_RE.match(line.strip())
        if match:
            run.passed = int(match["passed"])
            run.failed = int(match["failed"])
            run.not_applicable = int(match["na"] or 0)
            run.errors = int(match["errors"] or 0)
        elif line.startswith("FAILED "):
            name, _, detail = line[len("FAILED ") :].partition(": ")
            run.failed_checks[name] = detail
        elif line.startswith("NOT APPLICABLE "):
            run.not_applicable_checks.append(line[len("NOT APPLICABLE ") :].partition(":")[0])
    return run

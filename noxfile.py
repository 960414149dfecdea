"""Every environment and check of the twinkle repository, as nox sessions (run through uv).

    bash scripts/test.sh                 # lint docs core dingtalk local ray integration + summary
    bash scripts/test.sh core -- -k seed # some sessions; after "--": arguments for pytest
    .venvs/tools/bin/nox -l              # the session list (scripts/test.sh installs nox there)

Each package's suite runs in an environment holding only that package and what it depends on,
built from the working tree and installed as a user would (not editable): core without torch or
ray; dingtalk = core + dingtalk; local = core + local + torch; ray = core + local + ray + torch;
integration = all four + torch. Environments live in .nox/ and are reused. Each twinkle package
is built into a wheel once per content of its folder (.nox/.twinkle-wheels/NAME-HASH/) and an
environment reinstalls it only when that hash changed: a second run with unchanged sources builds
nothing. uv hard-links installed files from its cache, so the environments that hold torch share
one copy of it on disk.

torch is pinned to TORCH below, for these environments only (the packages ask for torch>=2.2).
Where PyPI's default torch wheel is a CUDA build, set TWINKLE_TORCH_INDEX_URL to PyTorch's CPU
wheel index. uv does not read pip's configuration: its find-links, index-url, extra-index-url,
constraint and cert settings (from PIP_* variables or pip.conf) are passed on to uv's installs
below (TWINKLE_IGNORE_PIP_CONFIG=1 turns that off; UV_* variables already set win).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox
from nox.command import CommandFailed

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv"
nox.options.reuse_venv = "yes"
nox.options.error_on_external_run = True
nox.options.sessions = [
    "lint",
    "docs",
    "core",
    "dingtalk",
    "local",
    "ray",
    "integration",
    "bench-quick",
]

ROOT = Path(__file__).resolve().parent
REPORTS = ROOT / ".test-reports"
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
TORCH = os.environ.get("TWINKLE_TORCH_SPEC", "torch==2.13.0")
TORCH_INDEX_URL = os.environ.get("TWINKLE_TORCH_INDEX_URL", "")
# NIXL for the ray suite's Ray Direct Transport tests (tests/ray/test_rdt.py runs `nixl` for
# real on CPU tensors). 1.5.1: nixl 1.5.2 on PyPI has no wheels of nixl-cu12/cu13 for Linux
# x86_64, so a resolver would only backtrack to it after failing.
NIXL = os.environ.get("TWINKLE_NIXL_SPEC", "nixl==1.5.1")

CORE = "./twinkle_core"
LOCAL = "./twinkle_local"
RAY = "./twinkle_ray"
DINGTALK = "./twinkle_notify_dingtalk"
PACKAGES = (CORE, LOCAL, RAY, DINGTALK)
ALL_IMPORTS = ("torch", "ray", "twinkle_core", "twinkle_local", "twinkle_ray")
ALL_IMPORTS += ("twinkle_notify_dingtalk",)
LINT_PATHS = (
    "twinkle_core",
    "twinkle_local",
    "twinkle_ray",
    "twinkle_notify_dingtalk",
    "tests",
    "examples",
    "benchmarks",
    "scripts",
    "noxfile.py",
)

# Tests never attach to another Ray cluster on this machine, nor report usage.
os.environ.pop("RAY_ADDRESS", None)
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"


# --- pip's configuration, passed on to uv ------------------------------------------------------


def _pip_config() -> dict[tuple[str, str], str]:
    """pip's settings as {(section, name): value}; section ':env:' holds PIP_* variables."""
    try:
        listed = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    values = {}
    for line in listed.splitlines():
        key, sep, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if sep and section:
            values[(section, name)] = value.strip().strip("'\"")
    return values


def _pip_setting(config: dict[tuple[str, str], str], name: str) -> list[str]:
    # pip's precedence: environment variables, then the [install] section, then [global].
    for section in (":env:", "install", "global"):
        if (section, name) in config:
            return config[(section, name)].split()
    return []


def _present(locations: list[str]) -> list[str]:
    """Drop local folders and files that do not exist on this machine (keep remote URLs)."""
    kept = []
    for location in locations:
        if location.startswith("file://"):
            path = location[len("file://") :]
        elif "://" in location:
            kept.append(location)
            continue
        else:
            path = location
        if Path(path).exists():
            kept.append(location)
    return kept


def _uv_env_from_pip_config() -> dict[str, str]:
    """Environment variables that give uv the indexes, links and certificates pip uses."""
    if "TWINKLE_IGNORE_PIP_CONFIG" in os.environ:
        return {}
    config = _pip_config()
    index_url = _present(_pip_setting(config, "index-url"))
    extra = _present(_pip_setting(config, "extra-index-url"))
    find_links = _present(_pip_setting(config, "find-links"))
    constraint = _present(_pip_setting(config, "constraint"))
    cert = _present(_pip_setting(config, "cert"))
    settings = {
        "UV_INDEX_URL": " ".join(index_url[:1]),
        "UV_EXTRA_INDEX_URL": " ".join(extra),
        "UV_FIND_LINKS": ",".join(find_links),
        "UV_CONSTRAINT": " ".join(constraint),
        "SSL_CERT_FILE": " ".join(cert[:1]),
    }
    if index_url or extra:
        # pip picks the best version across all its indexes; uv's default would take only the
        # first index that has a package (an extra index holding an old ray would win).
        settings["UV_INDEX_STRATEGY"] = "unsafe-best-match"
    return {k: v for k, v in settings.items() if v and k not in os.environ}


# Given to uv's installs only (not to the tests).
UV_ENV = _uv_env_from_pip_config()
# uv installs no bytecode: without it every process that imports torch compiles it (about twice
# the CPU time). Processes run by the sessions write it once into the environment.
WRITE_BYTECODE = {"PYTHONDONTWRITEBYTECODE": None}


# --- helpers -----------------------------------------------------------------------------------


def _groups(*names: str) -> tuple[str, ...]:
    return nox.project.dependency_groups(PYPROJECT, *names)


# --- twinkle packages: one wheel per content, reinstalled only when it changed -------------------

WHEELS = ROOT / ".nox" / ".twinkle-wheels"
STAMP = "twinkle-wheels.json"  # in each environment: {package folder: hash of what is installed}
IMPORTED = "twinkle-imported.json"  # in each environment: what _check_env last imported there
_NOT_SOURCE = {"build", "dist", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def _source_hash(package: str) -> str:
    """A hash of every file of the package's folder (names and bytes), build output excluded."""
    digest = hashlib.sha256()
    base = ROOT / package
    for path in sorted(base.rglob("*")):
        rel = path.relative_to(base)
        if any(p in _NOT_SOURCE or p.endswith(".egg-info") for p in rel.parts):
            continue
        if path.is_file():
            digest.update(f"{rel.as_posix()}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _wheels_lock():
    """Held while a wheel is looked up or built: scripts/test.sh runs two nox processes at once
    (its lanes of sessions), and both may want the same wheel."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    with open(WHEELS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _wheel(session: nox.Session, package: str, digest: str) -> Path:
    """The package's wheel for this content: built once (`uv build`), then reused."""
    with _wheels_lock():
        return _build_wheel(session, package, digest)


def _build_wheel(session: nox.Session, package: str, digest: str) -> Path:
    folder = WHEELS / f"{Path(package).name}-{digest}"
    built = sorted(folder.glob("*.whl"))
    if built:
        return built[0]
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    session.log(f"building {package} (its sources changed)")
    uv = nox.virtualenv.UV  # the uv that nox runs (scripts/tools.sh installs it)
    session.run(
        uv,
        "build",
        "--wheel",
        "--quiet",
        "--out-dir",
        str(partial),
        package,
        external=True,
        env=UV_ENV,
    )
    partial.rename(folder)
    for stale in WHEELS.glob(f"{Path(package).name}-*"):
        if stale != folder:
            shutil.rmtree(stale, ignore_errors=True)  # wheels of older contents
    return sorted(folder.glob("*.whl"))[0]


def _twinkle_args(session: nox.Session, packages: tuple[str, ...]) -> tuple[list[str], dict]:
    """uv arguments that install the packages' current wheels (reinstalling those whose content
    differs from what this environment holds), and the stamp to write once installed."""
    stamp_path = Path(session.virtualenv.location) / STAMP
    try:
        installed = json.loads(stamp_path.read_text())
    except (OSError, ValueError):
        installed = {}
    wanted = {package: _source_hash(package) for package in packages}
    args = []
    for package, digest in wanted.items():
        wheel = _wheel(session, package, digest)
        args.append(str(wheel))
        if installed.get(package) != digest:
            args += ["--reinstall-package", wheel.name.split("-")[0].replace("_", "-")]
    return args, {**installed, **wanted}


def _install_twinkle(session: nox.Session, *args: str, packages: tuple[str, ...]) -> None:
    """`session.install(*args)` plus the given twinkle packages, as wheels of the working tree."""
    twinkle, stamp = _twinkle_args(session, packages)
    session.install(*args, *twinkle, env=UV_ENV)
    (Path(session.virtualenv.location) / STAMP).write_text(json.dumps(stamp, indent=1))


def _install(
    session: nox.Session,
    *packages: str,
    torch: bool = False,
    parallel: bool = False,
    extra: tuple[str, ...] = (),
) -> None:
    """Install the test tools, `extra` requirements and the given twinkle packages (built from
    the working tree); with `parallel`, pytest-xdist too (see PARALLEL)."""
    args = [*_groups("test"), *extra]
    if parallel:
        args.append(XDIST)
    if torch:
        args.append(TORCH)
        if TORCH_INDEX_URL:
            args += ["--extra-index-url", TORCH_INDEX_URL, "--index-strategy", "unsafe-best-match"]
    _install_twinkle(session, *args, packages=packages)


def _check_env(session: nox.Session, imports: tuple[str, ...], forbid: tuple[str, ...] = ()):
    """Import the suite's packages once, and fail if a reused environment holds a forbidden one.

    uv installs no bytecode; this first import writes it (-I: whatever PYTHONDONTWRITEBYTECODE
    says), so the many processes a suite starts do not each compile torch and ray from source.
    An environment whose installed packages did not change since its last successful import
    (same twinkle wheels, same torch pin) is only checked for forbidden modules: importing torch
    and ray again would cost seconds per session and write nothing new.
    """
    # One process: the forbidden modules are looked for before the imports (an import of torch
    # or ray by a twinkle package would otherwise hide that the environment holds it).
    fix = f"recreate it with `nox -s {session.name} --reuse-venv=no`"
    location = Path(session.virtualenv.location)
    marker = location / IMPORTED
    stamp = location / STAMP
    done = json.dumps([imports, TORCH, stamp.read_text() if stamp.exists() else ""])
    imported = marker.exists() and marker.read_text() == done
    code = (
        f"import importlib.util as u, sys; found = [m for m in {forbid!r} if u.find_spec(m)]; "
        f"found and sys.exit(f'the {session.name} environment must not hold {{found}}: {fix}')"
    )
    if not imported:
        code += f"; import {', '.join(imports)}"
    try:
        session.run("python", "-I", "-c", code, silent=True)
    except CommandFailed:
        marker.unlink(missing_ok=True)
        session.error(f"the {session.name} environment is not as it should be (output above)")
    marker.write_text(done)


def _start_report(suite: str) -> Path:
    REPORTS.mkdir(exist_ok=True)
    report = REPORTS / f"{suite}.xml"
    report.unlink(missing_ok=True)  # a failed set-up must not leave an old report behind
    return report


# The suites without Ray clusters or torchrun jobs (core, dingtalk) spend much of their time
# waiting (subprocesses, timeouts a test expects to expire): pytest-xdist runs them on up to 4
# worker processes, a test file per worker at a time (--dist loadfile: a module's fixtures are
# built once). The suites that start clusters or jobs run serially: they already fill the
# machine, and each worker would start its own cluster. `-- -n 0` runs a suite serially.
XDIST = "pytest-xdist>=3.5"
PARALLEL = ("--numprocesses", str(min(4, os.cpu_count() or 1)), "--dist", "loadfile")


def _pytest(session: nox.Session, report: Path, path: str, *, parallel: bool = False) -> None:
    # The pytest script (not `python -m pytest`) keeps the repository root off sys.path, so the
    # installed packages are tested, not the source folders. pytest's exit code 5 (no tests
    # collected) fails the session like any other non-zero code.
    session.run(
        "pytest",
        path,
        f"--junitxml={report}",
        "--continue-on-collection-errors",
        *(PARALLEL if parallel else ()),
        *session.posargs,
        env=WRITE_BYTECODE,
    )


# --- sessions ----------------------------------------------------------------------------------


@nox.session
def lint(session: nox.Session) -> None:
    """ruff's checks and its formatter (in check mode) over everything, mypy of twinkle-core and
    of its mypy plugin's type test, import-linter contracts (.importlinter)."""
    _install_twinkle(session, *_groups("lint"), packages=(CORE,))
    failed = []  # run every check, then fail with the list
    try:
        session.run("ruff", "check", *(p for p in LINT_PATHS if (ROOT / p).exists()))
    except CommandFailed:
        failed.append("ruff")
    try:  # `ruff format` (of the files named below) fixes what this finds
        session.run("ruff", "format", "--check", *(p for p in LINT_PATHS if (ROOT / p).exists()))
    except CommandFailed:
        failed.append("ruff format (run `ruff format` over the files it names)")
    try:
        with session.chdir("twinkle_core"):
            session.run("mypy", "twinkle_core")
    except CommandFailed:
        failed.append("mypy")
    try:  # the mypy plugin against lines marked as accepted and rejected (tests/typing)
        session.run("mypy", "--config-file", "tests/typing/mypy.ini", "tests/typing")
    except CommandFailed:
        failed.append("mypy plugin type test")
    if (ROOT / ".importlinter").exists():
        # Contracts are checked on the source (static imports); the plugins are installed without
        # their dependencies only so that import-linter can find them.
        _install_twinkle(session, "--no-deps", packages=(LOCAL, RAY, DINGTALK))
        try:
            session.run("lint-imports")
        except CommandFailed:
            failed.append("lint-imports")
        try:  # the contract catches a plugin importing a core internal (tests/lint/bad_plugin)
            session.run("python", "tests/lint/check_contracts_catch.py")
        except CommandFailed:
            failed.append("import contract self-check")
    else:
        session.log("no .importlinter at the repository root: import contracts not checked")
    if failed:
        session.error(f"failed: {', '.join(failed)}")


@nox.session
def docs(session: nox.Session) -> None:
    """mkdocs build --strict (warnings, broken links and anchors fail)."""
    _install_twinkle(session, *_groups("docs"), packages=(CORE,))
    site = str(REPORTS / "site")
    session.run("mkdocs", "build", "--strict", "--quiet", "--site-dir", site, *session.posargs)


@nox.session
def core(session: nox.Session) -> None:
    """tests/core with twinkle-core installed as a user would: no torch, ray or plugins."""
    report = _start_report("core")
    _install(session, CORE, parallel=True)
    forbid = ("torch", "ray", "twinkle_local", "twinkle_ray", "twinkle_notify_dingtalk")
    _check_env(session, ("twinkle_core", "hypothesis", "numpy"), forbid)
    _pytest(session, report, "tests/core", parallel=True)


@nox.session
def dingtalk(session: nox.Session) -> None:
    """tests/notify_dingtalk with twinkle-core and twinkle-notify-dingtalk only."""
    report = _start_report("dingtalk")
    _install(session, CORE, DINGTALK, parallel=True)
    forbid = ("torch", "ray", "twinkle_local", "twinkle_ray")
    _check_env(session, ("twinkle_core", "twinkle_notify_dingtalk", "hypothesis"), forbid)
    _pytest(session, report, "tests/notify_dingtalk", parallel=True)


@nox.session
def local(session: nox.Session) -> None:
    """tests/local: twinkle-core, twinkle-local and torch."""
    report = _start_report("local")
    _install(session, CORE, LOCAL, torch=True)
    forbid = ("ray", "twinkle_ray", "twinkle_notify_dingtalk")
    _check_env(session, ("torch", "twinkle_core", "twinkle_local", "hypothesis"), forbid)
    _pytest(session, report, "tests/local")


@nox.session
def ray(session: nox.Session) -> None:
    """tests/ray: twinkle-core, twinkle-local, twinkle-ray, ray and torch."""
    report = _start_report("ray")
    _install(session, CORE, LOCAL, RAY, torch=True, extra=(NIXL,))
    _check_env(
        session,
        ("torch", "ray", "twinkle_ray", "hypothesis", "nixl"),
        ("twinkle_notify_dingtalk",),
    )
    _pytest(session, report, "tests/ray")


@nox.session
def integration(session: nox.Session) -> None:
    """tests/integration with all four packages."""
    report = _start_report("integration")
    _install(session, *PACKAGES, torch=True)
    _check_env(session, ALL_IMPORTS)
    _pytest(session, report, "tests/integration")


@nox.session
def bench(session: nox.Session) -> None:
    """benchmarks/run.py with all four packages (arguments after "--" go to it, e.g. --quick)."""
    _install(session, *PACKAGES, torch=True)
    _check_env(session, ALL_IMPORTS)
    session.run("python", "benchmarks/run.py", *session.posargs, env=WRITE_BYTECODE)


@nox.session(name="bench-quick")
def bench_quick(session: nox.Session) -> None:
    """benchmarks/run.py --quick: the CI-sized run that fails only on gross regressions."""
    _install(session, *PACKAGES, torch=True)
    _check_env(session, ALL_IMPORTS)
    out = ["--json", str(REPORTS / "bench.json"), "--markdown", str(REPORTS / "bench.md")]
    session.run("python", "benchmarks/run.py", "--quick", *out, env=WRITE_BYTECODE)


@nox.session
def demo(session: nox.Session) -> None:
    """The example pipeline under torchrun, on an embedded Ray cluster and in-process."""
    _install(session, *PACKAGES, torch=True)
    _check_env(session, ALL_IMPORTS)
    session.run("python", "scripts/demo.py", *session.posargs, env=WRITE_BYTECODE)


@nox.session
def dist(session: nox.Session) -> None:
    """Wheels and sdists of the four packages into dist/, checked by `twine check --strict`."""
    session.install(*_groups("dist"), env=UV_ENV)
    out = ROOT / "dist"
    shutil.rmtree(out, ignore_errors=True)
    for package in PACKAGES:
        session.log(f"building {package}")
        # PYTHONDONTWRITEBYTECODE makes setuptools warn that it skips byte-compiling.
        log = session.run(
            "python",
            "-m",
            "build",
            "--installer",
            "uv",
            "--outdir",
            str(out),
            package,
            silent=True,
            env={**UV_ENV, "PYTHONDONTWRITEBYTECODE": None},
        )
        warnings = [line for line in str(log).splitlines() if "warning" in line.lower()]
        if warnings:
            session.error(f"building {package} printed warnings:\n" + "\n".join(warnings))
    session.run("twine", "check", "--strict", *sorted(str(p) for p in out.iterdir()))
    session.log(f'install from these: pip install --find-links {out} "twinkle-core[ray]"')

"""`twinkle doctor`: the installation report, its problems with fixes, and what it never prints.

Real `twinkle` processes: in a throwaway environment holding twinkle-core alone (its console
script, no torch, ray or plugins), and in the environment running the tests (whatever it holds:
with torch and every plugin under /tmp/rayvenv, core alone under `nox -s core`). Direct calls
for broken plugins. The Ray cluster cases are in tests/ray/test_cli_doctor_ray.py.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _support.cli import pip_install_into
from _support.cli import twinkle as run_twinkle

from twinkle_core import hookimpl
from twinkle_core.plugins import plugin_system
from twinkle_core.tools.cli import main as cli_main
from twinkle_core.tools.doctor import diagnose, environment_report, render_text

from .plugin_factory import make_plugin

ROOT = Path(__file__).resolve().parents[2]
REQUIRED_KEYS = {"python", "distributions", "plugins", "torch", "ray", "platform", "problems"}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TWINKLE_", "RAY_"))
        and k not in ("PYTHONPATH", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        and k not in ("MASTER_ADDR", "MASTER_PORT")
    }
    env.update(extra)
    return env


def twinkle(*args: str, env: dict | None = None, cwd: Path | None = None):
    """The `twinkle` console script, by default with twinkle's and torchrun's variables unset."""
    return run_twinkle(*args, env=env if env is not None else clean_env(), cwd=cwd)


# --------------------------------------------------------------------------- core alone
@pytest.fixture(scope="module")
def core_only(tmp_path_factory):
    """A fresh venv holding twinkle-core (installed from this tree) and its three dependencies
    only; returns (python, its `twinkle` console script, environment)."""
    root = tmp_path_factory.mktemp("core-only")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(root / "venv")],
        check=True,
        timeout=120,
    )
    deps = root / "deps"
    deps.mkdir()
    for name in ("pluggy", "numpy", "packaging"):
        dist = metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in tops:
            source = Path(str(dist.locate_file(top)))
            if source.exists():
                (deps / top).symlink_to(source)
    source = root / "src"
    shutil.copytree(
        ROOT / "twinkle_core",
        source,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )
    site = root / "site"
    pip_install_into(site, source)
    python = root / "venv" / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "twinkle-test.pth").write_text(f"{site}\n{deps}\n")
    check = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('torch'))"],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert check.stdout.strip() == "None", "the core-only environment must not see torch"
    return python, site / "bin" / "twinkle", clean_env()


def run_core_only(core_only, *args: str, **env: str):
    python, script, base = core_only
    return subprocess.run(
        [str(python), str(script), *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**base, **env},
        cwd=script.parent,
    )


@pytest.mark.slow
def test_core_only_json(core_only):
    result = run_core_only(core_only, "doctor", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert REQUIRED_KEYS <= set(report)
    assert report["torch"] is None and report["ray"] is None
    assert report["python"] == ".".join(str(v) for v in sys.version_info[:3])
    assert [d["name"] for d in report["distributions"]] == ["twinkle-core"]
    assert report["distributions"][0]["version"] == report["twinkle_core"]
    assert [(p["name"], p["error"]) for p in report["plugins"]] == [("core", None)]
    assert report["platform"]["device_type"] == "cpu"
    assert report["platform"]["device_count"] == os.cpu_count()
    assert report["torchrun"] == {} and "ray_cluster" not in report  # no --ray asked
    assert report["problems"] == [] and report["warnings"] == []


@pytest.mark.slow
def test_core_only_text(core_only):
    result = run_core_only(core_only, "doctor")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "torch    not installed" in text and "ray      not installed" in text
    assert "platform cpu  " in text
    assert "core  [twinkle-core " in text and "ok" in text
    assert text.rstrip().endswith("no problems found")


@pytest.mark.slow
def test_core_only_ray_flag_fails_with_the_install_command(core_only):
    result = run_core_only(core_only, "doctor", "--ray", "--json")
    assert result.returncode == 1
    [problem] = json.loads(result.stdout)["problems"]
    assert "ray is not installed" in problem["problem"]
    assert problem["fix"].startswith('python scripts/install.py "twinkle-core[ray]" in a clone')
    assert 'once the packages are published: pip install "twinkle-core[ray]"' in problem["fix"]
    text = run_core_only(core_only, "doctor", "--ray", "10.0.0.1:6379")
    assert text.returncode == 1
    assert 'fix: python scripts/install.py "twinkle-core[ray]"' in text.stdout


@pytest.mark.slow
def test_core_only_placement_notes_the_missing_platform(core_only, tmp_path):
    (tmp_path / "g.toml").write_text(
        'nproc_per_node = 2\n[[groups]]\nname = "m"\nranks = [0, 1]\ndevice_type = "cuda"\n'
    )
    result = run_core_only(core_only, "placement", str(tmp_path / "g.toml"))
    assert result.returncode == 0, result.stderr
    assert "group rank 1   global rank 1   node node0  device cuda:1" in result.stdout
    assert 'needs python scripts/install.py "twinkle-core[local]" in a clone' in result.stderr


# --------------------------------------------------------------------------- this environment
@pytest.mark.slow
def test_json_in_this_environment():
    """torch and ray as importlib.metadata sees them here (2.13.0+cpu and 2.60.0 under
    /tmp/rayvenv, null under `nox -s core`), every installed twinkle distribution listed."""
    result = twinkle("doctor", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert REQUIRED_KEYS <= set(report)
    assert report["torch"] == _version("torch")
    assert report["ray"] == _version("ray")
    names = {d["name"] for d in report["distributions"]}
    for dist in ("twinkle-core", "twinkle-local", "twinkle-ray", "twinkle-notify-dingtalk"):
        assert (dist in names) == (_version(dist) is not None), dist
    plugins = {p["name"]: p for p in report["plugins"]}
    assert plugins["core"]["error"] is None
    if _version("twinkle-local") is not None:
        assert {"cuda", "npu", "mps", "cpu"} <= set(report["platform"]["platforms"])
        assert "local" in plugins["local"]["registers"]["backends"]
    platform = report["platform"]
    assert platform["device_type"] in platform["platforms"]
    if platform["device_type"] == "cpu":
        assert platform["device_count"] == os.cpu_count()
    assert report["problems"] == []


def test_doctor_imports_neither_ray_nor_more_than_it_needs():
    code = textwrap.dedent(
        """
        import json, sys
        from twinkle_core.tools.doctor import diagnose
        report = diagnose()
        print(json.dumps({"ray": "ray" in sys.modules, "torch_listed": report["torch"]}))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=clean_env()
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"ray": False, "torch_listed": _version("torch")}


@pytest.mark.slow
def test_secrets_are_never_printed():
    env = clean_env(
        TWINKLE_MODE="inprocess",
        TWINKLE_DINGTALK_SECRET="SEC-sekrit-1",
        TWINKLE_DINGTALK_WEBHOOK="https://oapi.dingtalk.com/robot/send?access_token=sekrit-2",
        TWINKLE_DB_PASSWORD="sekrit-3",
        TWINKLE_API_KEY="sekrit-4",
        RAY_ADDRESS="ray://alice:sekrit-5@head:10001",
        RAY_AUTH_TOKEN="sekrit-6",
        HF_TOKEN="sekrit-7",
        Twinkle_Private_Thing="sekrit-8",
    )
    as_json = twinkle("doctor", "--json", env=env)
    as_text = twinkle("doctor", env=env)
    for result in (as_json, as_text):
        assert result.returncode == 0, result.stderr
        assert "sekrit" not in result.stdout + result.stderr
    report = json.loads(as_json.stdout)
    assert report["environment"]["TWINKLE_MODE"] == "inprocess"
    assert report["environment"]["RAY_ADDRESS"] == "ray://***@head:10001"
    assert {
        "TWINKLE_DINGTALK_SECRET",
        "TWINKLE_DINGTALK_WEBHOOK",
        "TWINKLE_DB_PASSWORD",
        "TWINKLE_API_KEY",
        "RAY_AUTH_TOKEN",
        "Twinkle_Private_Thing",
    } <= set(report["hidden_environment"])
    assert "HF_TOKEN" not in as_json.stdout  # not twinkle's: not even its name
    assert "set, values not shown: " in as_text.stdout


def test_environment_report_directly():
    torchrun, shown, hidden = environment_report(
        {
            "RANK": "1",
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29500",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "TWINKLE_SIGNING_KEY": "x",
            "PATH": "/bin",
        }
    )
    assert torchrun == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    }
    assert shown == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert hidden == ["TWINKLE_SIGNING_KEY"]


@pytest.mark.slow
def test_torchrun_variables_are_shown_and_a_partial_set_is_a_warning():
    env = clean_env(
        RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29555"
    )
    report = json.loads(twinkle("doctor", "--json", env=env).stdout)
    assert report["torchrun"] == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29555",
    }
    assert report["warnings"] == []
    partial = twinkle("doctor", "--json", env=clean_env(WORLD_SIZE="2"))
    assert partial.returncode == 0  # a warning: nothing asked for is broken
    [warning] = json.loads(partial.stdout)["warnings"]
    assert "missing RANK, MASTER_ADDR, MASTER_PORT" in warning["problem"]
    assert "torchrun --nproc_per_node" in warning["fix"]


# --------------------------------------------------------------------------- broken plugins
@pytest.fixture
def site(tmp_path, monkeypatch, fresh_plugins):
    """A folder on sys.path for fake plugins; their modules are forgotten afterwards, so other
    tests' plugins of the same name are imported afresh."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("twinkle_doctor_")]:
        del sys.modules[name]


def doctor_json(capsys) -> tuple[int, dict]:
    code = cli_main(["doctor", "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_plugin_that_fails_to_import(site, capsys):
    make_plugin(
        site,
        "twinkle-doctor-broken",
        "twinkle_doctor_broken",
        "raise ImportError('needs libfoo')\n",
    )
    code, report = doctor_json(capsys)
    assert code == 1
    [problem] = report["problems"]
    assert (
        "plugin 'twinkle_doctor_broken' (twinkle-doctor-broken 1.0) failed to load"
        in problem["problem"]
    )
    assert "ImportError: needs libfoo" in problem["problem"]
    assert "TWINKLE_PLUGINS" in problem["fix"] and "twinkle-doctor-broken" in problem["fix"]
    assert {p["name"]: p["error"] for p in report["plugins"]}["twinkle_doctor_broken"]


def test_plugin_for_another_core(site, capsys):
    make_plugin(
        site,
        "twinkle-doctor-future",
        "twinkle_doctor_future",
        "x = 1\n",
        requires=("twinkle-core>=99",),
    )
    code, report = doctor_json(capsys)
    assert code == 1
    [problem] = report["problems"]
    assert "requires twinkle-core>=99" in problem["problem"]
    assert problem["fix"].startswith("pip install -U")


def test_plugin_with_a_misspelt_hook(site, capsys):
    code = """
        from twinkle_core import hookimpl

        @hookimpl
        def register_dispatcher(register):
            pass
    """
    make_plugin(site, "twinkle-doctor-typo", "twinkle_doctor_typo", code)
    exit_code, report = doctor_json(capsys)
    assert exit_code == 1
    [problem] = report["problems"]
    assert "register_dispatcher" in problem["problem"]
    assert "rename the hook(s) register_dispatcher" in problem["fix"]
    text = render_text(diagnose())
    assert "twinkle_doctor_typo  [twinkle-doctor-typo 1.0]  FAILED" in text
    assert "    fix: rename the hook(s)" in text


# --------------------------------------------------------------------------- cluster probes
class _SlurmProbe:
    """A backend plugin's cluster probe, as docs/plugins.md shows one."""

    calls: list[tuple[str, str, float]] = []

    @hookimpl
    def register_backends(self, register):
        register("slurm", "twinkle_core.inprocess:InProcessBackend")

    @hookimpl
    def twinkle_doctor_probe(self, backend, address, timeout):
        self.calls.append((backend, address, timeout))
        if backend != "slurm":
            return None
        return {
            "data": {"address": address, "nodes": ["a", "b"]},
            "problems": [{"problem": "node b is draining", "fix": "undrain it"}],
            "warnings": [],
            "text": [f"slurm cluster  {address}", "  2 node(s)"],
        }


def test_a_backend_plugin_answers_doctor_for_its_cluster(fresh_plugins, capsys):
    """`--slurm ADDRESS` reaches the plugin through the hook; core's tools know no backend."""
    plugin_system().add(_SlurmProbe(), name="slurm-probe")
    assert cli_main(["doctor", "--slurm", "head:1234", "--json", "--timeout", "7"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["slurm_cluster"] == {"address": "head:1234", "nodes": ["a", "b"]}
    assert {"problem": "node b is draining", "fix": "undrain it"} in report["problems"]
    assert ("slurm", "head:1234", 7.0) in _SlurmProbe.calls
    assert cli_main(["doctor", "--slurm"]) == 1  # address defaults to auto
    text = capsys.readouterr().out
    assert "slurm cluster  auto\n  2 node(s)" in text
    assert "  - node b is draining\n    fix: undrain it" in text


def test_an_unknown_doctor_option_is_an_error_naming_the_backends(fresh_plugins, capsys):
    with pytest.raises(SystemExit) as info:
        cli_main(["doctor", "--rya"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "'--rya'" in err and "--BACKEND [ADDRESS]" in err and "ray" in err

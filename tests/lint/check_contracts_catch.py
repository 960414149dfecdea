"""Show that the contracts catch a plugin importing a core internal, and a plugin importing
another plugin's private module.

Runs `lint-imports` with the repository's own contracts pointed at `bad_plugin/`, which imports
`twinkle_core.calls` and `twinkle_local.transports`; succeeds only when import-linter reports
both contracts BROKEN. Run by the lint session after the real check:

    python tests/lint/check_contracts_catch.py
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CONTRACT = "importlinter:contract:plugins-use-public-core"
PLUGIN_CONTRACT = "importlinter:contract:plugins-use-public-plugin-modules"


def main() -> int:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    kept = {"importlinter", CONTRACT, PLUGIN_CONTRACT}
    for section in [s for s in config.sections() if s not in kept]:
        config.remove_section(section)
    config["importlinter"]["root_packages"] = "\ntwinkle_core\ntwinkle_local\ntwinkle_bad_plugin"
    config[CONTRACT]["source_modules"] = "\ntwinkle_bad_plugin"
    config[PLUGIN_CONTRACT]["source_modules"] = "\ntwinkle_bad_plugin"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "negative.ini"
        with path.open("w") as f:
            config.write(f)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE / "bad_plugin"), tmp])}
        run = subprocess.run(
            ["lint-imports", "--config", str(path), "--no-cache"],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
    output = run.stdout + run.stderr
    caught = run.returncode != 0 and output.count("BROKEN") >= 2
    if caught and "twinkle_core.calls" in output and "twinkle_local.transports" in output:
        print(
            "the contracts catch twinkle_bad_plugin -> twinkle_core.calls and "
            "-> twinkle_local.transports, as they must"
        )
        return 0
    print(f"the contract did NOT catch the bad plugin (exit {run.returncode}):\n{output}")
    return 1


if __name__ == "__main__":
    sys.exit(main())

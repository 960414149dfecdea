"""Which environment variables travel from the driver to the workers.

The driver's whole environment is never copied into actors: API tokens and other secrets stay
on the driver. Only variables matching the pass-through list below (plus the names a user adds
with `initialize(mode='ray', env_passthrough=[...])` or `TWINKLE_ENV_PASSTHROUGH=A,B_*`) are
sent. A name ending in `*` is a prefix.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping

#: Sent to every worker when set on the driver. Twinkle's own settings come first.
DEFAULT_PASSTHROUGH: tuple[str, ...] = (
    "TWINKLE_*",
    "PYTHONPATH",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
    "NCCL_*",
    "HCCL_*",
    "GLOO_*",
    "TORCH_*",
    "CUBLAS_WORKSPACE_CONFIG",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
)

#: What a Ray node needs to run Python at all; kept when twinkle starts an embedded cluster.
NODE_ESSENTIALS: tuple[str, ...] = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TMPDIR",
    "TEMP",
    "TMP",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "PYTHONHOME",
    "LD_LIBRARY_PATH",
    "RAY_*",
    "*_VISIBLE_DEVICES",
    "CUDA_HOME",
    "ASCEND_*",
)

#: Driver variable holding extra pass-through names, comma separated.
PASSTHROUGH_ENV = "TWINKLE_ENV_PASSTHROUGH"


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("*"):
        return name.endswith(pattern[1:])
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    return name == pattern


def passthrough_patterns(extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The default list, the user's `env_passthrough`, and `$TWINKLE_ENV_PASSTHROUGH`."""
    from_env = [p.strip() for p in os.environ.get(PASSTHROUGH_ENV, "").split(",") if p.strip()]
    return (*DEFAULT_PASSTHROUGH, *extra, *from_env)


def select(environ: Mapping[str, str], patterns: Iterable[str]) -> dict[str, str]:
    """The variables of `environ` whose names match one of `patterns`."""
    patterns = tuple(patterns)
    return {k: v for k, v in environ.items() if any(_matches(k, p) for p in patterns)}


@contextlib.contextmanager
def scrubbed_environ(keep: Iterable[str]) -> Iterator[None]:
    """Temporarily reduce `os.environ` to the variables matching `keep`.

    Used around starting an embedded Ray cluster: its processes (and so every worker they
    spawn) inherit the environment at that moment, and must not inherit the driver's secrets.
    """
    saved = dict(os.environ)
    kept = select(saved, keep)
    os.environ.clear()
    os.environ.update(kept)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)

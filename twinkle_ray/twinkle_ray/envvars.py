"""Which environment variables travel from the driver to the workers.

The driver's whole environment is never copied into actors: API tokens and other secrets stay
on the driver. Only variables matching the pass-through list below (plus the names a user adds
with `initialize(mode='ray', env_passthrough=[...])` or `TWINKLE_ENV_PASSTHROUGH=A,B_*`) are
sent. A name ending in `*` is a prefix, one starting with `*` a suffix.

Credentials never travel through a wildcard: a variable matched only by a pattern is dropped
when its name looks like a secret (core's `looks_secret`, the one definition twinkle doctor
uses too; compared case-insensitively), e.g.
`TWINKLE_Db_Password` although `TWINKLE_*` is on the list. Naming a variable exactly (no `*`)
in `env_passthrough` sends it anyway, because then the user asked for it. Variables a plugin
declares as its secrets (hook `twinkle_secret_env_vars`, e.g. the DingTalk notifier's
`TWINKLE_DINGTALK_*`) never travel at all: they belong to the driver.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from collections.abc import Iterable, Iterator, Mapping

from twinkle_core.plugin import looks_secret, secret_env_patterns

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
    return fnmatch.fnmatchcase(name, pattern)


def _matches_any_case(name: str, patterns: Iterable[str]) -> bool:
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, p.upper()) for p in patterns)


def driver_only() -> tuple[str, ...]:
    """Patterns of variables plugins keep on the driver (hook `twinkle_secret_env_vars`)."""
    return secret_env_patterns()


def passthrough_patterns(extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The default list, the user's `env_passthrough`, and `$TWINKLE_ENV_PASSTHROUGH`."""
    from_env = [p.strip() for p in os.environ.get(PASSTHROUGH_ENV, "").split(",") if p.strip()]
    return (*DEFAULT_PASSTHROUGH, *extra, *from_env)


def select(
    environ: Mapping[str, str],
    patterns: Iterable[str],
    guard_secrets: bool = True,
    forbidden: Iterable[str] | None = None,
) -> dict[str, str]:
    """The variables of `environ` named exactly in `patterns`, or matching a wildcard pattern
    there and (with `guard_secrets`) not looking like a secret (`looks_secret`); none
    matching `forbidden` (default: what plugins declare through `twinkle_secret_env_vars`,
    compared ignoring case)."""
    patterns = tuple(patterns)
    exact = {p for p in patterns if "*" not in p}
    wild = [p for p in patterns if "*" in p]
    forbidden = driver_only() if forbidden is None else tuple(forbidden)
    return {
        k: v
        for k, v in environ.items()
        if not _matches_any_case(k, forbidden)
        and (
            k in exact
            or (any(_matches(k, p) for p in wild) and not (guard_secrets and looks_secret(k)))
        )
    }


@contextlib.contextmanager
def scrubbed_environ(passthrough: Iterable[str], essentials: Iterable[str]) -> Iterator[None]:
    """Temporarily reduce `os.environ` to the pass-through variables and a node's essentials.

    Used around starting an embedded Ray cluster: its processes (and so every worker they
    spawn) inherit the environment at that moment, and must not inherit the driver's secrets.
    """
    saved = dict(os.environ)
    kept = {**select(saved, essentials, guard_secrets=False), **select(saved, passthrough)}
    os.environ.clear()
    os.environ.update(kept)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)

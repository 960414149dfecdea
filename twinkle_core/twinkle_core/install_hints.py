"""Which `twinkle-core[EXTRA]` install provides a backend, platform or notifier not installed.

The table lives in twinkle-core's own distribution metadata, as the entry-point group
`twinkle.install_hints` (`"kind/name" = "extra"`), beside the extras that install the plugin
packages (`pyproject.toml`); the packages an extra brings come from the extra's requirements.
So core's code names no plugin package, and a renamed extra is changed in one file.
"""

from __future__ import annotations

import functools
import importlib.metadata as metadata

from packaging.requirements import InvalidRequirement, Requirement

HINTS_GROUP = "twinkle.install_hints"
CORE_DISTRIBUTION = "twinkle-core"


@functools.cache
def _hints() -> dict[tuple[str, str], str]:
    try:
        dist = metadata.distribution(CORE_DISTRIBUTION)
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return {}
    out: dict[tuple[str, str], str] = {}
    for ep in dist.entry_points:
        if ep.group == HINTS_GROUP and "/" in ep.name:
            kind, _, name = ep.name.partition("/")
            out[(kind, name)] = ep.value.strip()
    return out


@functools.cache
def _extra_packages() -> dict[str, tuple[str, ...]]:
    """Each extra of twinkle-core and the distributions it installs."""
    try:
        requires = metadata.requires(CORE_DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return {}
    out: dict[str, list[str]] = {}
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is None:
            continue
        for extra in _extras_of(str(req.marker)):
            out.setdefault(extra, []).append(req.name)
    return {k: tuple(v) for k, v in out.items()}


def _extras_of(marker: str) -> list[str]:
    # `extra == "ray"` (packaging writes the marker back in this form)
    parts = marker.replace("'", '"').split('extra == "')[1:]
    return [p.split('"', 1)[0] for p in parts]


def install_hint(kind: str, name: str) -> tuple[str, tuple[str, ...]] | None:
    """(extra, the distributions it installs) for `name` of `kind`, or None when unknown."""
    extra = _hints().get((kind, name))
    if extra is None:
        return None
    return extra, _extra_packages().get(extra, ())


#: Run from a clone of the repository: the packages are not on PyPI yet (scripts/install.py
#: builds the four wheels from the working tree and pip-installs from them).
INSTALL_SCRIPT = "python scripts/install.py"


def install_command(extra: str) -> str:
    """The command that adds `extra` to twinkle-core, and what replaces it once published:
    `python scripts/install.py "twinkle-core[EXTRA]" in a clone of twinkle (once the packages
    are published: pip install "twinkle-core[EXTRA]")`."""
    requirement = f'"twinkle-core[{extra}]"'
    return (
        f"{INSTALL_SCRIPT} {requirement} in a clone of twinkle "
        f"(once the packages are published: pip install {requirement})"
    )


def providing_sentence(kind: str, name: str) -> str | None:
    """`Install PACKAGES with: python scripts/install.py "twinkle-core[EXTRA]" in a clone of
    twinkle (once the packages are published: pip install "twinkle-core[EXTRA]")`, or None."""
    hint = install_hint(kind, name)
    if hint is None:
        return None
    extra, packages = hint
    return f"Install {', '.join(packages) or 'it'} with: {install_command(extra)}"


def known_names(kind: str) -> list[str]:
    """Every name of `kind` an extra of twinkle-core would add, sorted."""
    return sorted(name for k, name in _hints() if k == kind)

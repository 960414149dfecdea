"""A mypy plugin: constructors of `@remote_class` classes accept twinkle's own keywords.

`@remote_class()` lets a class be built as `Trainer(lr, remote_group="model", device_mesh=mesh)`,
and fills a `device_mesh` parameter its `__init__` declares. The decorator keeps the class a
class (so `Trainer` stays usable in annotations and `isinstance`), which means a type checker
sees only the user's `__init__` and rejects `remote_group=`. Python's typing cannot express "the
same constructor plus two keywords" (PEP 612 adds positional parameters only), so, like
pydantic and SQLAlchemy, twinkle ships a mypy plugin. Enable it in the project's mypy config:

    [tool.mypy]
    plugins = ["twinkle_core.tools.mypy_plugin"]

Then, for a decorated class (and its subclasses), the constructor also takes
`remote_group: str | None` and `device_mesh: DeviceMesh | None` as keywords, and a
`device_mesh` parameter the `__init__` declares becomes optional (twinkle passes it). Everything
else about the constructor is checked as before.

This module is imported only by mypy; twinkle itself never imports it (or mypy).
"""

from __future__ import annotations

from collections.abc import Callable

from mypy.nodes import ARG_NAMED, ARG_NAMED_OPT, ARG_OPT, ARG_POS, ARG_STAR, ARG_STAR2, TypeInfo
from mypy.plugin import ClassDefContext, FunctionSigContext, Plugin
from mypy.types import AnyType, CallableType, NoneType, Type, TypeOfAny, UnionType

DECORATOR = "twinkle_core.remote.remote_class"
MARK = "twinkle_core.remote_class"
MESH = "twinkle_core.device_mesh.DeviceMesh"


def _mark(ctx: ClassDefContext) -> bool:
    """Class decorator hook: remember in the class's metadata (kept in mypy's cache) that it is
    a remote class."""
    ctx.cls.info.metadata[MARK] = {}
    return True


def _is_remote(info: TypeInfo) -> bool:
    return any(MARK in base.metadata for base in info.mro)


def _optional(ctx: FunctionSigContext, fullname: str) -> Type:
    """`<fullname> | None`, or Any when the type is not known here."""
    try:
        named = ctx.api.named_generic_type(fullname, [])  # type: ignore[attr-defined]
    except Exception:  # the module is not loaded in this build
        return AnyType(TypeOfAny.special_form)
    return UnionType([named, NoneType()])


def _with_twinkle_keywords(ctx: FunctionSigContext) -> CallableType:
    """The constructor's signature plus `remote_group=` and `device_mesh=` (both optional)."""
    sig = ctx.default_signature
    kinds, names, types = list(sig.arg_kinds), list(sig.arg_names), list(sig.arg_types)
    if "device_mesh" in names:
        i = names.index("device_mesh")
        if kinds[i] == ARG_POS:
            kinds[i] = ARG_OPT
        elif kinds[i] == ARG_NAMED:
            kinds[i] = ARG_NAMED_OPT
    else:
        kinds.append(ARG_NAMED_OPT)
        names.append("device_mesh")
        types.append(_optional(ctx, MESH))
    if "remote_group" not in names:
        kinds.append(ARG_NAMED_OPT)
        names.append("remote_group")
        types.append(UnionType([ctx.api.named_generic_type("builtins.str", []), NoneType()]))  # type: ignore[attr-defined]
    # Keyword-only parameters must come after the positional ones and before **kwargs.
    order = sorted(range(len(kinds)), key=lambda j: _rank(kinds[j]))
    return sig.copy_modified(
        arg_kinds=[kinds[j] for j in order],
        arg_names=[names[j] for j in order],
        arg_types=[types[j] for j in order],
    )


def _rank(kind: object) -> int:
    """Where a parameter of this kind goes: positional, *args, keyword-only, **kwargs."""
    return {ARG_POS: 0, ARG_OPT: 0, ARG_STAR: 1, ARG_STAR2: 3}.get(kind, 2)  # type: ignore[call-overload]


class TwinklePlugin(Plugin):
    def get_class_decorator_hook_2(self, fullname: str) -> Callable[[ClassDefContext], bool] | None:
        return _mark if fullname == DECORATOR else None

    def get_function_signature_hook(
        self, fullname: str
    ) -> Callable[[FunctionSigContext], CallableType] | None:
        symbol = self.lookup_fully_qualified(fullname)
        if symbol is not None and isinstance(symbol.node, TypeInfo) and _is_remote(symbol.node):
            return _with_twinkle_keywords
        return None


def plugin(version: str) -> type[Plugin]:
    """mypy's entry point."""
    return TwinklePlugin

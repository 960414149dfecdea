"""A plugin that reaches into a core internal: the import contract must catch it."""

from twinkle_core.calls import invoke  # the violation

__all__ = ["invoke"]

"""A plugin that reaches into a core internal and into another plugin's private module: the
import contracts must catch both."""

from twinkle_core.calls import invoke  # the first violation
from twinkle_local.transports import decide  # the second: twinkle_local.torchkit is public

__all__ = ["decide", "invoke"]

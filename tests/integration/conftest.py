"""The integration suite's jobs (torchrun launches, driver scripts, fake robots) run in the
background from the session's start, two at a time: see tests/_support/prestart.py."""

from __future__ import annotations

from _support import prestart

_prestart = prestart.session_fixture()

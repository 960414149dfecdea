"""twinkle's tools: the `twinkle` command and what it runs (`doctor`, `placement`, `trace
summary`), and the mypy plugin.

Nothing on the call path (`initialize`, a remote call, collect) imports this package: the
import-linter contract `core-call-path-without-tools` holds it, and
tests/core/test_layers.py checks that an in-process run leaves it out of `sys.modules`. A tool
may import anything in core; what it needs from a backend it asks through a hook
(`twinkle_doctor_probe`, `ExecutionBackend.plan_placement`), so adding a backend changes no
tool.
"""

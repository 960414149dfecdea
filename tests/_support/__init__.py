"""Helpers shared by the test suites (tests/ is on sys.path in every session: see the
`pythonpath` setting under [tool.pytest.ini_options] in pyproject.toml)."""

"""Integration tests run against the real API server of the local cluster (see
e2e/local/fixtures.py for the fixtures, tests/conftest.py for how they are marked)."""

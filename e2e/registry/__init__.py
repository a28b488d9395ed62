"""A container registry on this machine that kind's nodes pull from (e2e/registry/serve.py)."""

"""What an install of modelpool holds: the product always, the testbeds in an editable one.

The product is the reconciler, the router (sidecar), their shared telemetry and Kubernetes
core, the templates the reconciler renders, and the programs that run them. The testbeds
(the local cluster, the kind cluster's parts, the demo, the fake model server, the e2e
suites: the package `e2e`) are for developing and testing it: build_backend.py sets
MODELPOOL_BUILD_TESTBEDS in an editable install of the checkout, and only then are they
mapped and their commands installed. Everything else about the project is in pyproject.toml.
"""

from __future__ import annotations

import os

from setuptools import find_packages, setup

from build_backend import WITH_TESTBEDS

PRODUCT_PACKAGES = ["reconciler", "sidecar", "telemetry", "kubecore"]
# The reconciler finds its templates beside its package (reconciler/render.py).
TEMPLATES_PACKAGE = "templates"
PRODUCT_SCRIPTS = [
    "modelpool-reconciler = reconciler.__main__:main",
    "modelpool-router = sidecar.__main__:main",
    # the init container of a persisted llama.cpp member (spec.kvCache)
    "modelpool-kv-clean = reconciler.kv_clean:main",
    "modelpool-kv-files = reconciler.kv_files:main",
]

TESTBED_PACKAGES = ["e2e"]
TESTBED_SCRIPTS = [
    "modelpool-local = e2e.local.cli:main",
    "modelpool-fake-model = e2e.fake_model.cli:main",
]


def packages(with_testbeds: bool) -> list[str]:
    """The import packages a build holds, each top-level name with its subpackages."""
    tops = PRODUCT_PACKAGES + (TESTBED_PACKAGES if with_testbeds else [])
    found = find_packages(include=[f"{top}*" for top in tops])
    return [*found, TEMPLATES_PACKAGE]


def scripts(with_testbeds: bool) -> list[str]:
    """The console scripts a build installs, as `name = module:function`."""
    return PRODUCT_SCRIPTS + (TESTBED_SCRIPTS if with_testbeds else [])


if __name__ == "__main__":
    with_testbeds = os.environ.get(WITH_TESTBEDS) == "1"
    # A build directory of each kind: setuptools packs whatever an earlier build left in it,
    # and a build with the testbeds must leave nothing that a product build would pack. The
    # metadata it writes stays there too: at the top of the checkout, on sys.path whenever
    # Python runs there, it would stand for the installed distribution.
    build_base = os.path.join("build", "with-testbeds" if with_testbeds else "product")
    os.makedirs(build_base, exist_ok=True)
    setup(
        packages=packages(with_testbeds),
        entry_points={"console_scripts": scripts(with_testbeds)},
        options={"build": {"build_base": build_base}, "egg_info": {"egg_base": build_base}},
    )

"""The build backend: setuptools', with the testbeds added to an editable install.

A wheel or an sdist of this checkout (`pip install .`, `pip wheel .`, `python -m build`)
holds the product alone; an editable install (`pip install -e '.[test]'`, a developer's
checkout) also maps the testbeds from the checkout and installs their commands. setup.py
says which packages and commands each holds; this module only tells it which kind of
build it runs, through the environment variable it reads.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from setuptools import build_meta
from setuptools.build_meta import (
    build_sdist,
    build_wheel,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_wheel,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

# Read by setup.py: set, the build also holds the testbeds.
WITH_TESTBEDS = "MODELPOOL_BUILD_TESTBEDS"


@contextmanager
def _testbeds() -> Iterator[None]:
    before = os.environ.get(WITH_TESTBEDS)
    os.environ[WITH_TESTBEDS] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[WITH_TESTBEDS]
        else:
            os.environ[WITH_TESTBEDS] = before


def _with_testbeds(hook: Callable[..., Any]) -> Callable[..., Any]:
    def editable_hook(*args: Any, **kwargs: Any) -> Any:
        with _testbeds():
            return hook(*args, **kwargs)

    editable_hook.__name__ = hook.__name__
    editable_hook.__doc__ = hook.__doc__
    return editable_hook


get_requires_for_build_editable = _with_testbeds(build_meta.get_requires_for_build_editable)
prepare_metadata_for_build_editable = _with_testbeds(
    build_meta.prepare_metadata_for_build_editable)
build_editable = _with_testbeds(build_meta.build_editable)

"""Builds the optional C extension ``shmbuf.core._native`` (metadata is in pyproject.toml).

``optional=True``: without a C compiler (or if the build fails) the install still
succeeds and shmbuf runs its pure-Python path. On CPython 3.11+ the extension uses the
stable ABI (one build for every later Python); before that, the version's own ABI.
"""

import sys
from pathlib import Path

from setuptools import Extension, setup

abi3 = sys.version_info >= (3, 11) and sys.implementation.name == "cpython"

setup(
    ext_modules=[Extension(
        "shmbuf.core._native", ["shmbuf/core/_native.c"], optional=True, py_limited_api=abi3,
        depends=sorted(str(p) for p in Path("shmbuf/core/csrc").iterdir()),  # its parts (#included)
        define_macros=[("Py_LIMITED_API", "0x030B0000")] if abi3 else [],
        extra_compile_args=["-O2"],
    )],
    options={"bdist_wheel": {"py_limited_api": "cp311"}} if abi3 else {},
)

"""Builds the optional C extension ``shmbuf.core._native`` (metadata is in pyproject.toml).

``optional=True``: without a C compiler (or if the build fails) the install still
succeeds and shmbuf runs its pure-Python path; the build then says so in one line
(pip shows a build's output with ``pip install -v``; at run time the first buffer a
process makes warns, and ``shmbuf doctor`` tells which path runs). On CPython 3.11+ the extension uses the
stable ABI (one build for every later Python); before that, the version's own ABI.
"""

import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildExt(build_ext):
    """``build_ext`` that says in one line when the optional extension was not built."""

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # a missing compiler, a compile or link error
            if not ext.optional:
                raise
            reason = " ".join(str(e).split()) or type(e).__name__
            sys.stderr.write(
                f"shmbuf: the C extension {ext.name} was not built ({reason}); shmbuf will run "
                "its pure-Python path, about 3x slower. Install a C compiler (e.g. apt-get "
                "install gcc) and reinstall to build it.\n")

abi3 = sys.version_info >= (3, 11) and sys.implementation.name == "cpython"

setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=[Extension(
        "shmbuf.core._native", ["shmbuf/core/_native.c"], optional=True, py_limited_api=abi3,
        depends=sorted(str(p) for p in Path("shmbuf/core/csrc").iterdir()),  # its parts (#included)
        define_macros=[("Py_LIMITED_API", "0x030B0000")] if abi3 else [],
        extra_compile_args=["-O2"],
    )],
    options={"bdist_wheel": {"py_limited_api": "cp311"}} if abi3 else {},
)

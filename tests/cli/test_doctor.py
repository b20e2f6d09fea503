"""What an installation runs on: ``shmbuf doctor``, ``shmbuf.implementation()``, and the
warning of a process whose C extension is not built (simulated: the extension's import
blocked in a fresh interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import shmbuf
from shmbuf.core import native

from helpers import cli

pytestmark = pytest.mark.one_path

NO_EXTENSION = "import sys; sys.modules['shmbuf.core._native'] = None\n"  # (its import then fails)
TWO_BUFFERS = NO_EXTENSION + """import shmbuf
print(shmbuf.implementation())
for _ in range(2):
    shmbuf.Buffer.create({"x": ((), "int64")}, 4).close()
from shmbuf.cli import main
main(["doctor"])
"""


def python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_doctor_says_which_path_runs_and_what_is_installed():
    res = cli("doctor")
    assert res.returncode == 0, res.stderr
    want = native.path()
    assert f"path: {want} (" in res.stdout and "/dev/shm: " in res.stdout and "numpy" in res.stdout
    facts = json.loads(cli("doctor", "--json").stdout)
    assert facts["path"] == want == shmbuf.implementation() and facts["shmbuf"] == shmbuf.__version__
    assert set(facts["optional"]) >= {"torch", "gymnasium", "ray", "stable-baselines3", "torchrl", "cpprb"}
    assert facts["dev_shm"]["free_bytes"] > 0
    assert facts["arrays_read_directly"] is native.ARRAYS_READ_DIRECTLY  # (csrc/arrays.c's probe)
    assert all(e in ("torch", "gym", "hdf5", "safetensors", "arrow", "ray", "sb3", "torchrl", "bench")
               for e in facts["missing_extras"])


def test_a_process_without_the_extension_warns_once_and_says_why():
    res = python(TWO_BUFFERS, SHMBUF_PURE_PYTHON="")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == "python"
    assert res.stderr.count("PurePythonWarning") == 1  # (two buffers, one warning)
    assert "C extension is not built" in res.stderr and "Install a C compiler" in res.stderr
    assert "path: python (the C extension is not built" in res.stdout and "extension: not built" in res.stdout


def test_choosing_the_pure_path_is_quiet():
    res = python(TWO_BUFFERS, SHMBUF_PURE_PYTHON="1")
    assert res.returncode == 0 and "Warning" not in res.stderr, res.stderr
    assert "path: python (SHMBUF_PURE_PYTHON=1 is set)" in python(
        "from shmbuf.cli import main; main(['doctor'])", SHMBUF_PURE_PYTHON="1").stdout or not native.available()

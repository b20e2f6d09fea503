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


def test_doctor_says_whether_buffers_get_huge_pages():
    """The TLB's share of a large buffer's writes: /dev/shm's huge= mount option and the
    kernel's shmem_enabled, as this machine has them, and the verdict each gives."""
    from shmbuf.cli.doctor import THP, _read, huge_pages

    facts = json.loads(cli("doctor", "--json").stdout)["dev_shm"]["huge_pages"]
    assert facts == huge_pages(_read("/proc/mounts"), _read(THP))
    line = [ln for ln in cli("doctor").stdout.splitlines() if ln.startswith("huge pages: ")]
    assert len(line) == 1 and ("get 2 MiB pages (" in line[0]) is (facts["used"] is True)
    knob = "always within_size advise [never] deny force"
    mounts = "proc /proc proc rw 0 0\ntmpfs /dev/shm tmpfs rw,nosuid,size=100k{} 0 0\n"
    for option, want in [("", False), (",huge=never", False), (",huge=advise", False),
                         (",huge=within_size", True), (",huge=always", True)]:
        assert huge_pages(mounts.format(option), knob) == {
            "mount": option.partition("=")[2] or "never", "shmem_enabled": "never", "used": want}
    assert huge_pages(mounts.format(",huge=always"), knob.replace("[never] deny", "never [deny]"))["used"] is False
    assert huge_pages(mounts.format(""), knob.replace("[never] deny force", "never deny [force]"))["used"] is True
    assert huge_pages("proc /proc proc rw 0 0", knob)["used"] is None  # no /dev/shm listed: unknown

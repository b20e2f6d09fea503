"""Fixtures shared by the suite.

The whole run lives in its own namespace (``SHMBUF_NAMESPACE``, inherited by every
child process, spawned or not), so every segment the suite makes is named
``shmbuf@<run>-<name>`` and nothing else on the machine is ever seen, touched or
removed by it: other programs' buffers and other runs of this suite are left alone.
Every test gets a fresh buffer name and must leave no segment behind; the session
checks the run's namespace as a whole at the end."""

from __future__ import annotations

import gc
import os
import uuid

import pytest

from shmbuf import segment

# Child processes that import this module (spawn re-imports test modules) keep the
# run's namespace; a new run never inherits one from the shell.
RUN = os.environ.get("SHMBUF_TEST_RUN") or f"test{os.getpid()}-{uuid.uuid4().hex[:8]}"
os.environ["SHMBUF_TEST_RUN"] = os.environ[segment.NAMESPACE_ENV] = RUN


@pytest.fixture(scope="session", autouse=True)
def no_leaked_segments():
    assert segment.prefix() == f"shmbuf@{RUN}-"
    yield
    gc.collect()
    leaked = segment.list_names()  # only this run's namespace: all of it is ours
    for name in leaked:
        segment.unlink_name(name)
    assert not leaked, f"the suite left shared-memory segments behind: {sorted(leaked)}"


@pytest.fixture
def name(request):
    """A unique buffer name; the test fails if a segment of that name outlives it."""
    n = f"t{os.getpid()}-{uuid.uuid4().hex[:10]}"
    yield n
    gc.collect()
    if segment.unlink_name(n):
        pytest.fail(f"test left segment {n!r} in /dev/shm", pytrace=False)


MUJOCO = {"obs": ((17,), "float32"), "action": ((6,), "float32"),
          "reward": ((), "float32"), "done": ((), "bool")}


def shm_path(name: str) -> str:
    """Where the segment of buffer ``name`` lives (this run's namespace)."""
    return segment.SHM_DIR + segment.os_name(name)

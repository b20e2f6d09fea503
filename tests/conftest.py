"""Fixtures shared by the suite. Every test gets a fresh buffer name and must leave no
segment behind; the session checks /dev/shm as a whole at the end."""

from __future__ import annotations

import gc
import os
import uuid

import pytest

from shmbuf import segment


def _ours() -> set[str]:
    return set(segment.list_names())


@pytest.fixture(scope="session", autouse=True)
def no_leaked_segments():
    before = _ours()
    yield
    gc.collect()
    leaked = _ours() - before
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

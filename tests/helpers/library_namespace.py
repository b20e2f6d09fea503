"""What the plugins that run a library's own tests on a facade share (``sb3_facade``,
``imitation_facade``): a shared-memory namespace of the run's own, and a run that fails
if the library's tests leave a buffer in it."""

from __future__ import annotations

import gc
import os
import uuid

import pytest

from shmbuf.core.segment import NAMESPACE_ENV, list_names, unlink_name


def enter(label: str) -> None:
    """Give this run a namespace of its own (every buffer the tests make lives there)."""
    os.environ[NAMESPACE_ENV] = f"{label}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def check(session: pytest.Session, label: str) -> None:
    """Fail the run if the tests left buffers behind (and remove them)."""
    gc.collect()
    left = list_names()
    for name in left:
        unlink_name(name)
    if left:
        print(f"\n{label}_facade: FAILED: {label}'s tests left shmbuf buffers behind: {sorted(left)}")
        session.exitstatus = 1

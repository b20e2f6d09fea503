"""Policy versions: queue writers whose versions grow, and takers with a lag limit
that log what each take delivered.

Code that runs in child processes lives here, importable by name.
"""

from __future__ import annotations

import os
import time

import numpy as np

import shmbuf
from shmbuf.core import queue as core_queue

from .queues import _log, keys, queue_rows, queue_torn

__all__ = ["lagged_taker", "versioned_writer"]


def versioned_writer(name: str, writer: int, rows: int, chunk: int, per_version: int, first: int = 0) -> None:
    """Write rows (writer, 0 .. rows-1) in chunks; row i is of version
    ``first + i // per_version``."""
    q = shmbuf.Buffer.attach(name, timeout=60)
    lo = 0
    while lo < rows:
        hi = min(rows, lo + chunk, (lo // per_version + 1) * per_version)  # (a write has one version)
        q.extend(queue_rows(writer, lo, hi), version=first + lo // per_version, timeout=120)
        lo = hi


def lagged_taker(name: str, log: str, stop: str, batch: int, min_version: int, hang: str = "",
                 flag: str = "") -> None:
    """Take up to ``batch`` rows at a time with ``min_version`` until ``stop`` exists and
    nothing is left; log "D <keys>" and "V <versions>" of each take, and "X <count>" for
    torn rows. ``hang``: stop forever at that point of the first take (see
    :data:`shmbuf.core.queue.HOOK`), touching ``flag`` there."""
    q = shmbuf.Buffer.attach(name, timeout=60)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    if hang:
        def hook(where: str, rows) -> None:
            if where == hang:
                open(flag, "w").close()
                while True:
                    time.sleep(1)
        core_queue.HOOK = hook
    while True:
        try:
            b = q.take(batch, partial=True, timeout=0.2, min_version=min_version)
        except (shmbuf.SampleTimeout, shmbuf.LockTimeout):
            if os.path.exists(stop):
                return
            continue
        _log(fd, "D", keys(b))
        _log(fd, "V", np.asarray(b["version"]))
        if queue_torn(b):
            _log(fd, "X", [queue_torn(b)])

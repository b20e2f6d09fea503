"""Policy versions: queue writers whose versions grow, and takers with a lag limit
that log what each take delivered.

Code that runs in child processes lives here, importable by name.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np

import shmbuf
from shmbuf.queue import protocol as queue_protocol

from .queues import _log, keys, queue_rows, queue_torn

__all__ = ["lag_taker", "lag_writer", "lagged_taker", "versioned_writer"]


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
    :data:`shmbuf.queue.protocol.HOOK`), touching ``flag`` there."""
    q = shmbuf.Buffer.attach(name, timeout=60)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    if hang:
        def hook(where: str, rows) -> None:
            if where == hang:
                open(flag, "w").close()
                while True:
                    time.sleep(1)
        queue_protocol.HOOK = hook
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


def lag_writer(name: str, writer: int, lane: int, version: int, chunk: int, stop: str, log: str) -> None:
    """Write rows (writer, 0, 1, ...) of ``version`` into ``lane`` (no lane claimed: other
    writers share it) in chunks of 1 .. ``chunk``, every other one with ``add_each``
    (a row a write: other writers' rows may come between them), until ``stop`` exists;
    log "W <count>" after each write returned."""
    q = shmbuf.Buffer.attach(name, timeout=60)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    rng = np.random.default_rng(writer)
    i = 0
    while not os.path.exists(stop):
        k = int(rng.integers(1, chunk + 1))
        if rng.random() < 0.5:
            q.extend(queue_rows(writer, i, i + k), version=version, lane=lane, timeout=120)
        else:
            q.add_each(queue_rows(writer, i, i + k), [lane] * k, version=version, timeout=120)
        i += k
        _log(fd, "W", [i])


def lag_taker(name: str, log: str, stop: str, batch: int, min_version: int, hang: str = "", flag: str = "") -> None:
    """Take up to ``batch`` rows at a time with ``min_version`` until ``stop`` exists; log
    "C <keys>" once a take's rows are copied (before they are delivered), "D <keys>" and
    "V <versions>" once it returned, "X <count>" for torn rows and "O <writer>" for a
    take whose rows of a writer are out of order. A SIGINT raises KeyboardInterrupt only
    inside ``take`` (a notebook that catches Ctrl-C and goes on): the loop goes on.
    ``hang``: stop at that point of the first take ("commit@k": the k-th commit of this
    process), touching ``flag``, for good."""
    inside = [False]

    def on_sigint(signum, frame):
        if inside[0]:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    q = shmbuf.Buffer.attach(name, timeout=60)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    point, _, nth = hang.partition("@")
    seen = [0]

    def hook(where: str, rows) -> None:
        if where == "copied":
            _log(fd, "C", keys(rows))
        if point and where == point:
            seen[0] += 1
            if seen[0] == int(nth or 1):
                open(flag, "w").close()
                while True:
                    time.sleep(0.01)
    queue_protocol.HOOK = hook
    while not os.path.exists(stop):
        try:
            inside[0] = True
            b = q.take(batch, partial=True, timeout=0.2, min_version=min_version)
            inside[0] = False
        except (shmbuf.SampleTimeout, shmbuf.LockTimeout, KeyboardInterrupt):
            inside[0] = False
            continue
        _log(fd, "D", keys(b))
        _log(fd, "V", np.asarray(b["version"]))
        if queue_torn(b):
            _log(fd, "X", [queue_torn(b)])
        for w in np.unique(b["w"]).tolist():
            if (np.diff(b["i"][b["w"] == w]) <= 0).any():
                _log(fd, "O", [w])

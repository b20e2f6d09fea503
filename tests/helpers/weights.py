"""Policy weights: publishers, readers, a publish stopped halfway.

Code that runs in child processes lives here, importable by name (spawn, forkserver
and Ray workers import it).
"""

from __future__ import annotations

import time

import numpy as np

import shmbuf

# Weights: every element of every array of version v is v.
WEIGHT_SHAPES = {"w1": (256, 256), "b1": (256,), "w2": (64, 256)}


def weights_of(version: int) -> dict:
    return {k: np.full(s, float(version), np.float32) for k, s in WEIGHT_SHAPES.items()}


def weights_mixed(params: dict, version: int) -> bool:
    """True if ``params`` are not all version ``version``."""
    return any(not (a == version).all() for a in params.values())


def weights_publisher(name: str, seconds: float, ready, results) -> None:
    w = shmbuf.Weights.attach(name)
    ready.wait(30)
    deadline, n = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        n = w.publish(weights_of(w.version + 1))
    w.close()
    results.put(("publisher", n))


def weights_reader(name: str, seconds: float, ready, results) -> None:
    w = shmbuf.Weights.attach(name)
    ready.wait(30)
    deadline, reads, mixed, last = time.monotonic() + seconds, 0, 0, 0
    while time.monotonic() < deadline:
        got = w.read(newer_than=last)
        if got is not None:
            last, params = got
            reads += 1
            mixed += weights_mixed(params, last)
    w.close()
    results.put(("reader", reads, mixed))


def weights_publish_then_hang(name: str, flag: str, persist: bool) -> None:
    """Create weights, publish version 1, then stop for good half-way through publishing
    version 2 (after its first array)."""
    w = shmbuf.Weights.create(name, weights_of(0), persist=persist)
    w.publish(weights_of(1))
    real, calls = np.copyto, [0]

    def copyto(dst, src, **kw):
        calls[0] += 1
        if calls[0] == 2:
            open(flag, "w").close()
            time.sleep(600)
        real(dst, src, **kw)
    np.copyto = copyto
    w.publish(weights_of(2))

__all__ = ['WEIGHT_SHAPES', 'weights_mixed', 'weights_of', 'weights_publish_then_hang', 'weights_publisher', 'weights_reader']

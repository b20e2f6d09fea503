"""Prioritized replay: learners, tree checks, updates and syncs stopped halfway.

Code that runs in child processes lives here, importable by name (spawn, forkserver
and Ray workers import it).
"""

from __future__ import annotations

import os
import time

import numpy as np

import shmbuf

from .processes import pause_at
from .storm import storm_torn

def check_trees(trees) -> None:
    """Every inner node of a buffer's priority trees equals the sum (the nonzero
    minimum) of its children, exactly; the version is even."""
    s, m, lo = trees.sum, trees.min, trees.leaves
    assert int(trees.head[0]) % 2 == 0, "a change was left half done"
    while lo > 1:
        assert np.array_equal(s[lo // 2:lo], s[lo:2 * lo:2] + s[lo + 1:2 * lo:2])
        a, b = m[lo:2 * lo:2], m[lo + 1:2 * lo:2]
        assert np.array_equal(m[lo // 2:lo], np.where(a == 0, b, np.where(b == 0, a, np.minimum(a, b))))
        lo //= 2


def prio_learner(name: str, seconds: float, ready, results) -> None:
    """Sample by priority and update with random priorities for ``seconds``; report
    (rows sampled, updates applied, torn rows)."""
    buf = shmbuf.Buffer.attach(name, seed=os.getpid())
    rng = np.random.default_rng(os.getpid())
    ready.wait(30)
    sampled = applied = torn = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        b = buf.sample(32, beta=0.5)
        torn += storm_torn(b)
        sampled += 32
        applied += buf.update_priorities(b["index"], rng.random(32) * 10 + 0.1)
    buf.close()
    results.put(("learner", sampled, applied, torn))


def prio_update_then_hang(name: str, flag: str) -> None:
    """Start a priority update and stop forever in the middle of changing the trees
    (the leaves set, their ancestors not yet), touching ``flag`` there."""
    from shmbuf.priority import trees as priority

    def half_set(self, slots, values):
        self.sum[slots + self.leaves] = values
        self.min[slots + self.leaves] = values
        open(flag, "w").close()
        while True:
            time.sleep(1)
    priority.Trees.set = half_set
    buf = shmbuf.Buffer.attach(name)
    b = buf.sample(4)
    buf.update_priorities(b["index"], [50.0, 50.0, 50.0, 50.0])


def prio_sync_then_hang(name: str, flag: str, where: str) -> None:
    """Sample a prioritized buffer and stop forever inside the sync of its new rows:
    ``where`` "set" (entering the tree update) or "after set" (the leaves and their
    ancestors set, nothing else yet), touching ``flag`` there."""
    from shmbuf.priority import trees as priority

    real = priority.Trees.set

    def stop(self, slots, values):
        if where == "after set":
            real(self, slots, values)
        open(flag, "w").close()
        while True:
            time.sleep(1)
    priority.Trees.set = stop
    buf = shmbuf.Buffer.attach(name)
    buf.sample(1)


def add_rows_paused(name: str, x: int, priority: float, point: str, flag: str, go: str) -> None:
    """Add one row (``x``, at ``priority``), paused at ``point`` until ``go`` exists."""
    buf = shmbuf.Buffer.attach(name)
    pause_at(point, flag, go)
    buf.add({"x": x}, priority=priority)
    buf.close()

__all__ = ['add_rows_paused', 'check_trees', 'prio_learner', 'prio_sync_then_hang', 'prio_update_then_hang']

"""Sampling by priority: :class:`Prioritized`, the sampler of a buffer created with
``priority=`` (rows drawn by the trees of :mod:`shmbuf.priority.trees`, read through the read
path, with ``weight`` and ``index``)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from shmbuf.core import sampling
from shmbuf.core.engine import Engine
from shmbuf.core.read import until_filled
from shmbuf.core.sampler import Uniform
from shmbuf.priority.trees import FIELD, Trees, check_beta, update


class Prioritized(Uniform):
    """Rows drawn by priority (see the module), with ``weight`` and ``index``: the
    sampler of a buffer created with ``priority=``."""

    def sample(self, n: int, out: Any, timeout: float | None, beta: Any) -> dict[str, np.ndarray]:
        if out is not None:
            raise ValueError("out= is not supported by prioritized sampling")
        beta = check_beta(beta)
        engine = self.engine
        return engine.sample(n, n, timeout, lambda t: sample(engine, n, beta, t))

    def update(self, index: Any, priorities: Any, timeout: float) -> int:
        return update(self.engine, index, priorities, timeout)


def sample(engine: Engine, n: int, beta: float, timeout: float) -> dict[str, np.ndarray]:
    """``n`` rows drawn by priority, with ``weight`` and ``index`` (see the module),
    through the read path: rows overwritten since the draw (or an empty leaf reached by
    rounding) are drawn again."""
    trees: Trees = engine.trees
    fields = [f for f in engine.fields if f.name != FIELD]
    out = {f.name: np.empty((n,) + f.shape, f.dtype) for f in fields}
    slots, p, seq = np.empty(n, np.int64), np.empty(n), np.empty(n, np.int64)
    low = [np.inf]  # the smallest leaf of every version drawn from (every weight <= 1)
    deadline = time.monotonic() + timeout

    def fill(todo: np.ndarray) -> np.ndarray | None:
        m = len(todo)
        s, leaf, q, least, drawn = trees.pick(engine.rng, m, deadline, timeout)
        low[0] = min(low[0], least)
        got = out if m == n else {f.name: np.empty((m,) + f.shape, f.dtype) for f in fields}
        ok = sampling.copy_windows(engine.ring, s // trees.lc, q, 1, None, [got.get(f.name) for f in engine.fields])
        ok = drawn if ok is None else drawn & ok
        if m < n:
            for k in out:
                out[k][todo[ok]] = got[k][ok]
        slots[todo[ok]], p[todo[ok]], seq[todo[ok]] = s[ok], leaf[ok], q[ok]
        return ok

    until_filled(fill, n, timeout, "rows by priority", deadline=deadline)
    out["weight"] = np.power(low[0] / p, beta)
    out["index"] = np.stack([slots, seq], axis=1)
    return out

"""Sampling by priority: :class:`Prioritized`, the sampler of a buffer created with
``priority=`` (rows drawn by the trees of :mod:`shmbuf.priority.trees`, read through the read
path, with ``weight`` and ``index``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from shmbuf.core import gather, pool
from shmbuf.core.engine import Engine
from shmbuf.core.read import Sampler, read
from shmbuf.samplers.uniform import Uniform
from shmbuf.priority.trees import FIELD, check_beta


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
        return self.engine.priorities.update_priorities(index, priorities, timeout)


class Rows(Sampler):
    """Rows drawn by the trees (:meth:`~shmbuf.priority.trees.Trees.pick`), for
    :func:`~shmbuf.core.read.read`: each with its slot, sequence number and leaf (the
    private ``_slot``, ``_seq``, ``_p``). ``low`` is the smallest leaf of every version
    drawn from since it was reset (every weight is then <= 1)."""

    what = "rows by priority"

    def __init__(self, engine: Engine, timeout: float) -> None:
        self.engine, self.trees, self.timeout = engine, engine.priorities, timeout
        self.fields = engine.fields
        self.low = np.inf

    def empty(self, m: int) -> dict[str, np.ndarray]:
        return pool.batch([f for f in self.fields if f.name != FIELD], m, _slot=np.int64, _seq=np.int64, _p=float)

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        picked = self.trees.pick(self.engine.rng, len(todo), deadline, self.timeout)
        self.low = min(self.low, picked[3])
        return picked

    def gather(self, drawn: Any, out: dict[str, np.ndarray]) -> np.ndarray | None:
        s, leaf, q, _, ok = drawn
        out["_slot"][:], out["_seq"][:], out["_p"][:] = s, q, leaf
        got = gather.copy_windows(self.engine.ring, s // self.trees.lc, q, 1, None,
                                    [out.get(f.name) for f in self.fields])
        return ok if got is None else ok & got


def sample(engine: Engine, n: int, beta: float, timeout: float) -> dict[str, np.ndarray]:
    """``n`` rows drawn by priority, with ``weight`` and ``index`` (see the module),
    through the read path: rows overwritten since the draw (or an empty leaf reached by
    rounding) are drawn again."""
    rows = Rows(engine, timeout)
    out = read(rows, n, timeout)
    p = out.pop("_p")
    out["weight"] = np.power(rows.low / p, beta)
    out["index"] = np.stack([out.pop("_slot"), out.pop("_seq")], axis=1)
    return out

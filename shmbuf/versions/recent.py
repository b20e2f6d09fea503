"""Rows of recent policies: a sample uniform over the rows whose ``version`` is at least
a bound (``Buffer.sample(n, min_version=v)`` or ``max_staleness=k``, on a buffer created
with ``versions=True``; see :mod:`shmbuf.versions.bound`).

A lane's versions never decrease (each writer's never do, and a lane has one writer at a
time), so the rows of a lane that qualify are the newest ones: a suffix of its window.
Where each suffix begins is found by a binary search over the raw versions (a guide),
kept between calls and moved forward from there (the bound only grows in training, and
rows only come after), so a sample costs about what a uniform one does. Every row drawn
is then read through the checked gather and its version checked again on the copy: a
sample never holds a torn or unpublished row, nor one below the bound. When no row
qualifies, the sample waits for one (writers may be about to write them) and raises
``SampleTimeout`` at its deadline, saying how many rows the buffer holds and their
newest version.

``freshness=True`` (TorchRL's ``StalenessAwareSampler`` weighting) keeps each row drawn
with probability ``1 / (staleness + 1)`` (staleness: the newest version less the row's),
or the value a function of the staleness gives: rows are then drawn in proportion to it,
by rejection (over-drawing by the share lately kept, so a sample costs a round or two).
The batch gains ``weight``, each row's inverse probability scaled so that the stalest
allowed has 1, for importance correction: a weighted mean is a uniform sample's.

Examples:
    >>> import numpy as np, shmbuf
    >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 16, versions=True, seed=0)
    >>> buf.extend({"x": np.arange(4)}, version=1)
    >>> buf.extend({"x": np.arange(4, 8)}, version=2)
    >>> sorted(set(buf.sample(100, min_version=2)["x"].tolist()))
    [4, 5, 6, 7]
    >>> b = buf.sample(3, max_staleness=1); bool(b["version"].min() >= 1)
    True
    >>> buf.close()
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from shmbuf.core import pool
from shmbuf.core.read import Sampler
from shmbuf.core.gather import draw_in

FIELD = "version"


MAX_WINDOW = 1 << 20  # versions a freshness weighting spans at most (its table of weights)


def freshness_table(freshness: Any, span: int) -> np.ndarray | None:
    """The keep probability of a row of each staleness ``0 .. span`` (``freshness=True``:
    ``1 / (staleness + 1)``, TorchRL's default; a callable: its values on the stalenesses,
    each in [0, 1], one at least above 0), checked before anything is drawn; None for
    ``freshness=None``."""
    if freshness is None:
        return None
    if span > MAX_WINDOW:
        raise ValueError(f"freshness= weighs at most {MAX_WINDOW} versions; this sample spans {span + 1}: "
                         "pass max_staleness= (or a larger min_version=)")
    s = np.arange(span + 1)
    if freshness is True:
        return 1.0 / (s + 1.0)
    if not callable(freshness):
        raise TypeError(f"freshness must be True or a callable from staleness to weight, got {freshness!r}")
    table = np.asarray(freshness(s), np.float64)
    if table.shape != s.shape or not ((table >= 0) & (table <= 1)).all() or not (table > 0).any():
        raise ValueError("freshness must map an int array of stalenesses to weights of its shape, each in [0, 1] "
                         f"and one above 0 (a row is kept with that probability); got {table!r:.200}")
    return table


class Recent(Sampler):
    """Rows of version ``>= bound``, uniformly (see the module), for
    :func:`~shmbuf.core.read.read`; ``starts`` is the handle's memo of where each lane's
    qualifying rows begin, for one bound. With ``table`` (:func:`freshness_table`), a
    row of staleness ``s`` (from ``newest``) is kept with probability ``table[s]``."""

    def __init__(self, engine: Any, bound: int, starts: dict[str, Any], window: Any = None,
                 newest: int = 0, table: np.ndarray | None = None, view: np.ndarray | None = None) -> None:
        self.engine, self.bound, self.memo, self.window = engine, bound, starts, window
        self.fields = engine.fields
        self.versions = engine.view(FIELD) if view is None else view  # (a handle passes the one it keeps)
        self.lc = engine.layout.lane_capacity
        self.delay = 0.0
        self.newest, self.table = newest, table
        self.kept = 0.5  # the share of drawn rows the freshness kept lately (spares drawn for the rest)

    def spare(self, m: int, rounds: int) -> int:
        return 0 if self.table is None else int(m / max(self.kept, 0.05)) - m + 1

    def empty(self, m: int) -> dict[str, np.ndarray]:
        return pool.batch(self.fields, m)

    def starts(self, lo: np.ndarray, head: np.ndarray) -> np.ndarray:
        """Per lane, the first row of version >= bound in ``lo .. head`` (head: none)."""
        memo, bases = self.memo, self.engine.bases().tolist()
        if memo.get("bound") == self.bound and memo["bases"] == bases:
            return np.minimum(np.maximum(memo["at"], lo), head)  # (rows only come after: still the start)
        if memo.get("bound") is None or self.bound < memo["bound"] or memo["bases"] != bases:
            memo["at"] = lo.copy()  # (search the whole window)
        memo["bound"], memo["bases"] = self.bound, bases
        lanes = np.arange(len(lo))
        lo_, hi = np.minimum(np.maximum(memo["at"], lo), head), head.copy()  # the first qualifying row is in [lo_, hi]
        while True:
            open_ = lo_ < hi
            if not open_.any():
                break
            mid = (lo_ + hi) // 2
            ok = self.versions[lanes * self.lc + mid % self.lc] >= self.bound
            hi = np.where(open_ & ok, mid, hi)
            lo_ = np.where(open_ & ~ok, mid + 1, lo_)
        memo["at"] = lo_
        return lo_

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        lo, head = self.window if rounds == 0 and self.window is not None else self.engine.window()
        start, ends = self.starts(lo, head).tolist(), head.tolist()  # (Python ints: a few lanes)
        sizes = [h - a for a, h in zip(start, ends)]
        total = sum(sizes)
        if total == 0:  # none yet: wait for them (SampleTimeout at the deadline)
            newest = [int(self.versions[i * self.lc + (h - 1) % self.lc]) for i, h in enumerate(head.tolist()) if h]
            self.hint = (f": no row has a version >= {self.bound} (the buffer holds {int((head - lo).sum())} "
                         f"rows, the newest of version {max(newest) if newest else 'none'})")
            time.sleep(self.delay)
            self.delay = min(max(self.delay * 2, 50e-6), 2e-3)
            return None
        return draw_in(self.engine.rng, len(todo) + self.spare(len(todo), rounds), start, sizes)

    def gather(self, drawn: Any, out: dict[str, np.ndarray]) -> np.ndarray | None:
        m = len(out[FIELD])
        if drawn is None:
            return np.zeros(m, bool)
        ok = self.engine.gather(drawn[0], drawn[1], 1, [out[f.name] for f in self.fields])
        got = out[FIELD]  # (the version checked on the copy: a row overwritten meanwhile fails its stamps)
        if self.table is None and ok is None and m and int(got.min()) >= self.bound:
            return None  # (the usual case: one reduction)
        recent = got >= self.bound
        if self.table is not None:  # kept with the probability of its staleness
            keep = self.engine.rng.random(m) < self.table[np.clip(self.newest - got, 0, len(self.table) - 1)]
            self.kept = 0.5 * self.kept + 0.5 * float(keep.mean())
            recent &= keep
        if ok is None:
            return None if recent.all() else recent
        return ok & recent


def weights(table: np.ndarray, newest: int, versions: np.ndarray) -> np.ndarray:
    """The importance weights of rows of ``versions`` kept by ``table`` (1 / their
    probability, scaled so that the least likely staleness has weight 1)."""
    p = table[np.clip(newest - versions, 0, len(table) - 1)]
    return table[table > 0].min() / p

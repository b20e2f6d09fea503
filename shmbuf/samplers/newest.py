"""Newest first: a sample is the ``n`` most recent rows, newest first (Reverb's ``Lifo``
selector, without replacement; what to train on for the freshest data). Chosen with
``Buffer.create(..., sampler="newest")``.

With one lane these are exactly the ``n`` newest rows. With several lanes (one per
writer) there is no order between lanes' rows, so they take turns: every lane's newest
row (lanes in order), then every lane's second newest, and so on, lanes that hold
fewer rows dropping out. A row still being written when the sample reads it is left
out (the next older one comes in its place), as is a row reserved by a writer that
died: like every sampler's, its rows are read through the checked gather, never torn
and never unpublished.

``ValueError`` if the buffer holds fewer than ``n`` rows (``len``), or fewer than ``n``
published and no live writer is writing the others (rows reserved by writers that
died never come). If live writers are still writing rows the sample needs, it waits
for them up to its timeout, then raises ``SampleTimeout`` saying so.

Examples:
    >>> import numpy as np, shmbuf
    >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 6, sampler="newest")
    >>> buf.extend({"x": np.arange(10)}, truncate_ok=True)  # keeps 4 .. 9
    >>> buf.sample(4)["x"].tolist()
    [9, 8, 7, 6]
    >>> buf.close()
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from shmbuf.core import pool, read
from shmbuf.samplers.uniform import Uniform


class Newest(Uniform, read.Sampler):
    """The ``n`` newest rows, newest first (see the module). As a
    :class:`shmbuf.core.read.Sampler`, it draws the next older rows in that order,
    position after position; a batch carries each row's rank in that order (the
    private ``_rank``), by which it is sorted at the end."""

    what = "newest rows"

    def sample(self, n: int, out: Any, timeout: float | None, beta: Any) -> dict[str, np.ndarray]:
        if beta is not None:
            raise ValueError("beta= is for a prioritized buffer: create it with priority=<exponent>")
        out, arrays = self.outputs.prepare(out, (n,))
        self.n, self.first, self.taken, self.failed, self.verdict, self.hint = n, None, set(), set(), False, ""
        got = self.engine.read(self, n, n, timeout)
        rank = np.argsort(got["_rank"], kind="stable")
        for a, name in zip(arrays, self.outputs.names):
            a[:] = got[name][rank]
        return out

    def empty(self, m: int) -> dict[str, np.ndarray]:
        return pool.batch(self.outputs.fields, m, _rank=np.int64)

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        """The next ``len(todo)`` newest rows of one look at the lanes (the first round's
        while it has rows left; then a new look, less the rows already in the batch)."""
        m = len(todo)
        if self.first is None:
            self.first = self.engine.window()
            self.order, self.used = newest_first(*self.first, m), 0
            if len(self.order[0]) < m:
                raise ValueError(f"cannot sample the {m} newest rows: the buffer holds {len(self.order[0])}; "
                                 "add rows or ask for fewer")
        elif self.used + m > len(self.order[0]):  # a new look: rows came, or are still coming
            lanes, seqs = newest_first(*self.engine.window(), len(self.taken) + len(self.failed) + m)
            pairs = list(zip(lanes.tolist(), seqs.tolist()))
            new = [i for i, p in enumerate(pairs) if p not in self.taken and p not in self.failed]
            again = [i for i, p in enumerate(pairs) if p in self.failed]  # (tried again after the new ones)
            pick = np.array(new + again, np.int64)
            self.order, self.used = (lanes[pick], seqs[pick]), 0
            if len(new) < m:  # nothing new enough: wait for the live writers, or give the verdict
                self.verdict = not self.engine.writing()  # (no live writer: the next gather is final)
                if not self.verdict:
                    self.hint = (f": the buffer holds {len(pairs)} rows, {int(self.engine.published(lanes, seqs).sum())} of "
                                 "them published; "
                                 "live writers are still writing the others (the sample waited for them)")
                    time.sleep(0.0005)
        lanes, seqs = (a[self.used:self.used + m] for a in self.order)
        self.used += m
        return lanes, seqs

    def gather(self, drawn: Any, out: dict[str, np.ndarray]) -> np.ndarray | None:
        lanes, seqs = drawn
        first = self.first[1]
        out["_rank"][:] = (first[lanes] - 1 - seqs) * len(first) + lanes  # (age in the first look, lane)
        ok = self.engine.gather(lanes, seqs, 1, [out[name] for name in self.outputs.names])
        kept = np.ones(len(seqs), bool) if ok is None else ok
        self.taken.update(zip(lanes[kept].tolist(), seqs[kept].tolist()))
        self.failed.update(zip(lanes[~kept].tolist(), seqs[~kept].tolist()))
        if self.verdict and (len(seqs) < len(out["_rank"]) or not kept.all()):
            raise ValueError(f"cannot sample the {self.n} newest rows: only {len(self.taken)} of the rows the "
                             "buffer holds are published (the others are reserved by writers that died or gave "
                             "up); ask for fewer")
        return ok if len(seqs) == len(out["_rank"]) else np.concatenate([kept, np.zeros(len(out["_rank"]) - len(seqs), bool)])


def newest_first(lo: np.ndarray, head: np.ndarray, upto: int) -> tuple[np.ndarray, np.ndarray]:
    """The lanes and sequence numbers of at least the first ``upto`` rows (all, if fewer)
    of the windows ``lo .. head``, newest first, lanes taking turns (see the module)."""
    sizes = head - lo
    busy = max(int(np.count_nonzero(sizes)), 1)
    ranks = min(int(sizes.max(initial=0)), math.ceil(upto / busy))
    while True:
        r = np.arange(ranks)[:, None]
        held = r < sizes[None, :]
        if held.sum() >= upto or ranks >= sizes.max(initial=0):
            lanes = np.broadcast_to(np.arange(len(head)), held.shape)[held]
            return lanes.astype(np.int64), (head[None, :] - 1 - r)[held]
        ranks = min(2 * ranks, int(sizes.max()))


SAMPLER = Newest  # (what sampler="<this module>" opens: shmbuf.samplers.part)

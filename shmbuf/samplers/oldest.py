"""Oldest first: a sample is the ``n`` oldest rows the buffer holds, oldest first
(Reverb's ``Fifo`` selector, without removing anything: the mirror of
:mod:`shmbuf.samplers.newest`). Chosen with ``Buffer.create(..., sampler="oldest")``;
it takes no options.

With one lane these are exactly the ``n`` oldest rows. With several lanes (one per
writer) there is no order between lanes' rows, so they take turns: every lane's oldest
row (lanes in order), then every lane's second oldest, and so on, lanes that hold fewer
rows dropping out. A row still being written when the sample reads it is left out (the
next newer one comes in its place), as is a row reserved by a writer that died. The
oldest rows are the ones writers overwrite next: a row overwritten while it is copied
fails the checked gather and the sample takes a new look at the lanes, whose oldest
rows are then newer ones. Like every sampler's, its rows are never torn and never
unpublished.

``ValueError`` if the buffer holds fewer than ``n`` rows (``len``), or fewer than ``n``
published and no live writer is writing the others (rows reserved by writers that died
never come). If live writers are still writing rows the sample needs, it waits for them
up to its timeout, then raises ``SampleTimeout`` saying so.

Examples:
    >>> import numpy as np, shmbuf
    >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 6, sampler="oldest")
    >>> buf.extend({"x": np.arange(10)}, truncate_ok=True)  # keeps 4 .. 9
    >>> buf.sample(4)["x"].tolist()
    [4, 5, 6, 7]
    >>> buf.close()
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np

from shmbuf.core import pool, read
from shmbuf.samplers.newest import newest_first
from shmbuf.samplers.uniform import Uniform


class Oldest(Uniform, read.Sampler):
    """The ``n`` oldest rows, oldest first (see the module). As a
    :class:`shmbuf.core.read.Sampler` it draws candidates only: the first round the ``n``
    oldest rows of one look at the lanes, each later round the oldest rows of a new look
    that are neither in the batch yet nor failed before (those failed come last: a live
    writer may have published them since). :meth:`gather` copies them with the checked
    gather and gives each its rank in the first look (the private ``_rank``), by which
    the batch is sorted at the end."""

    what = "oldest rows"

    @classmethod
    def options(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        """The sampler's options, checked: it has none (``{}``)."""
        if not isinstance(given, Mapping):
            raise TypeError(f"the options of sampler 'oldest' must be a mapping, got {given!r}")
        if given:
            raise ValueError(f"sampler 'oldest' takes no options, got {sorted(map(str, given))}; "
                             "pass sampler=\"oldest\"")
        return {}

    def sample(self, n: int, out: Any, timeout: float | None, beta: Any) -> dict[str, np.ndarray]:
        if beta is not None:
            raise ValueError("beta= is for a prioritized buffer: create it with priority=<exponent>")
        out, arrays = self.outputs.prepare(out, (n,))
        self.n, self.taken, self.failed, self.final, self.hint, self.delay = n, set(), set(), None, "", 0.0
        got = self.engine.read(self, n, n, timeout)
        rank = np.argsort(got["_rank"], kind="stable")
        for a, name in zip(arrays, self.outputs.names):
            a[:] = got[name][rank]
        return out

    def empty(self, m: int) -> dict[str, np.ndarray]:
        return pool.batch(self.outputs.fields, m, _rank=np.int64)

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        m = len(todo)
        lo, head = self.engine.window()
        if rounds == 0:
            self.first = lo  # (ranks count from the first look: windows only move forward)
            held = int((head - lo).sum())
            if held < m:
                raise ValueError(f"cannot sample the {m} oldest rows: the buffer holds {held}; "
                                 "add rows or ask for fewer")
            return tuple(a[:m] for a in oldest_first(lo, head, m))
        lanes, seqs = oldest_first(lo, head, len(self.taken) + len(self.failed) + m)
        pairs = list(zip(lanes.tolist(), seqs.tolist()))
        new = [i for i, p in enumerate(pairs) if p not in self.taken and p not in self.failed]
        again = [i for i, p in enumerate(pairs) if p in self.failed]
        self.final = None
        if len(new) < m:  # (then ``pairs`` is the whole window: it holds fewer rows than asked)
            published = int(self.engine.published(lanes, seqs).sum())
            if self.engine.writing():  # wait for them (SampleTimeout at the deadline)
                self.hint = (f": the buffer holds {len(pairs)} rows, {published} of them published; live writers "
                             "are still writing the others (the sample waited for them)")
                time.sleep(self.delay)
                self.delay = min(max(self.delay * 2, 50e-6), 2e-3)
            else:  # this gather is final if the window stays as it is (nothing written meanwhile)
                self.final = (lo, head, f"cannot sample the {self.n} oldest rows: the buffer holds {len(pairs)} "
                              f"rows, {published} of them published, and no live writer is writing the others "
                              "(rows reserved by writers that died or gave up never come); ask for fewer")
        pick = np.array(new + again, np.int64)[:m]
        return lanes[pick], seqs[pick]

    def gather(self, drawn: Any, out: dict[str, np.ndarray]) -> np.ndarray | None:
        lanes, seqs = drawn
        m, k = len(out["_rank"]), len(seqs)
        out["_rank"][:k] = (seqs - self.first[lanes]) * len(self.first) + lanes  # (age in the first look, lane)
        ok = self.engine.gather(lanes, seqs, 1, [out[name] if k == m else out[name][:k]
                                                 for name in self.outputs.names]) if k else None
        kept = np.ones(k, bool) if ok is None else ok
        self.taken.update(zip(lanes[kept].tolist(), seqs[kept].tolist()))
        self.failed.update(zip(lanes[~kept].tolist(), seqs[~kept].tolist()))
        if self.final is not None and (k < m or not kept.all()):
            lo, head, why = self.final
            now = self.engine.window()
            if np.array_equal(now[0], lo) and np.array_equal(now[1], head):
                raise ValueError(why)
        return ok if k == m else np.concatenate([kept, np.zeros(m - k, bool)])


def oldest_first(lo: np.ndarray, head: np.ndarray, upto: int) -> tuple[np.ndarray, np.ndarray]:
    """The lanes and sequence numbers of at least the first ``upto`` rows (all, if fewer)
    of the windows ``lo .. head``, oldest first, lanes taking turns (see the module):
    :func:`~shmbuf.samplers.newest.newest_first`'s order, each lane's ages counted from
    its other end.

    Examples:
        >>> lanes, seqs = oldest_first(np.array([0, 5]), np.array([3, 6]), 4)
        >>> list(zip(lanes.tolist(), seqs.tolist()))
        [(0, 0), (1, 5), (0, 1), (0, 2)]
    """
    lanes, seqs = newest_first(lo, head, upto)
    return lanes, (lo + head - 1)[lanes] - seqs


SAMPLER = Oldest  # (what sampler="<this module>" opens: shmbuf.samplers.part)

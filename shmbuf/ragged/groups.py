"""Whole groups: the rows one ``extend`` wrote (a GRPO group: one prompt's responses),
sampled together, uniformly over the groups a buffer holds whole.

Each row of a buffer with ragged fields keeps its place in its write
(:data:`~shmbuf.ragged.schema.GROUP`: row ``i`` of ``n``). :class:`Groups` is a sampler of
the one read path (:func:`shmbuf.core.read.read`): a position is a group; it draws rows
uniformly and keeps those that start a group (so every group is as likely as another,
whatever its size), copies each group's rows with the checked gather as a window of its
size, proves that the window is one write (its rows' places are ``0 .. n - 1`` of ``n``)
and reads its records; a group that fails any check is drawn again.

Examples:
    >>> import numpy as np, shmbuf
    >>> buf = shmbuf.Buffer.create({"r": ((None,), np.int32), "g": ((), np.int64)}, 16, arena=4096, seed=0)
    >>> for g, size in enumerate([2, 3, 1]):
    ...     buf.extend({"r": [np.full(g + 1, g)] * size, "g": [g] * size})
    >>> b = buf.sample(50, groups=True)  # (50 groups: every group's rows come together)
    >>> [int((b["g"] == g).sum() % size) for g, size in enumerate([2, 3, 1])]
    [0, 0, 0]
    >>> buf.close()
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shmbuf.core import gather, pool
from shmbuf.core.read import Sampler
from shmbuf.ragged import schema
from shmbuf.ragged.jagged import Jagged

DRAWS = 8
"""Rows drawn per group wanted, a round (groups of up to about this many rows on average
are found in one round; larger ones take a few)."""


class Groups(Sampler):
    """Whole groups (see the module): a batch is ``{"groups": object array}``, each
    position one group's batch (``{field: rows}``, its ragged fields read in)."""

    what = "whole groups"
    hint = ""

    def __init__(self, engine: Any, rows: Any) -> None:
        self.engine, self.rows = engine, rows
        self.ring, self.lc = engine.ring, engine.layout.lane_capacity
        self.fields = engine.layout.fields
        self.place = engine.view(schema.GROUP)

    def empty(self, m: int) -> dict[str, np.ndarray]:
        return {"groups": np.empty(m, object)}

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        m = len(todo)
        lane, first, _ = gather.draw_windows(self.ring, self.engine.rng, DRAWS * m + DRAWS, 1, None)
        lane = np.broadcast_to(lane, first.shape)
        place = self.place[lane * self.lc + first % self.lc]  # (a guide: the gather proves it)
        starts = np.flatnonzero(place[:, 0] == 0)[:m]
        self.drawn, self.starts = len(first), len(starts)
        return lane[starts], first[starts], place[starts, 1]

    def gather(self, drawn: Any, out: dict[str, np.ndarray]) -> np.ndarray:
        lane, first, size = drawn
        ok = np.zeros(len(out["groups"]), bool)
        for s in np.unique(size).tolist():
            if not 1 <= s <= self.lc:
                continue  # (a guide that was read torn: no group of that size)
            at = np.flatnonzero(size == s)
            arrays = pool.empty([((len(at) * s,) + f.shape, f.dtype) for f in self.fields])
            whole = self.engine.gather(lane[at], first[at], s, arrays)
            whole = np.ones(len(at), bool) if whole is None else whole
            place = arrays[[f.name for f in self.fields].index(schema.GROUP)].reshape(len(at), s, 2)
            whole &= (place[:, :, 0] == np.arange(s)).all(axis=1) & (place[:, :, 1] == s).all(axis=1)
            for j in np.flatnonzero(whole).tolist():
                batch = {f.name: a[j * s:(j + 1) * s] for f, a in zip(self.fields, arrays)}
                got = self.rows.records(batch)
                if got is not None:
                    out["groups"][at[j]] = got
                    ok[at[j]] = True
        # (what the timeout's message says: the last round's counts, as they were)
        self.hint = (f": the last round drew {self.drawn} rows, {self.starts} of them a group's first row, and "
                     f"{int(ok.sum())} of those groups were read whole (the others' rows were unpublished, "
                     f"being written or overwritten while read, or their records covered)")
        return ok


def joined(groups: np.ndarray) -> dict[str, Any]:
    """The groups of a :class:`Groups` batch as one batch, their rows one after the other."""
    first = groups[0]
    return {k: Jagged.concatenate([g[k] for g in groups]) if isinstance(v, Jagged)
            else np.concatenate([g[k] for g in groups]) for k, v in first.items()}

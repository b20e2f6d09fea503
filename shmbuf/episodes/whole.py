"""Whole episodes: complete (ended) and unevicted, uniform over episodes (garage's
``sample_path``), each in order even where it wraps around its lane.

The episodes are found by walking each lane back from its newest row, an episode at a
time (a row's ``_start`` says where its episode began), so a scan costs one read per
episode, not per row. The walk reads raw values only as a guide: each episode drawn is
then copied in one window whose every row is stamp-checked and of that episode.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from shmbuf.core import gather as core_gather, pool
from shmbuf.core.read import Sampler, read
from shmbuf.core.ring import Ring
from shmbuf.episodes import gather
from shmbuf.episodes.rows import FINAL, TERMINATED, TRUNCATED
from shmbuf.episodes.parts import Episodes


_NONE = ("the buffer holds no complete episode: one that has ended (its final observation written) "
         "and whose first step is not evicted yet")


class Index:
    """A handle's index of the complete episodes of each lane, extended by walking back
    from the newest row only as far as the rows it has already indexed (so a call costs
    the episodes written since the last one, not all of them), and trimmed as rows are
    evicted. Rows a walk finds not published yet are walked again next time."""

    def __init__(self, lanes: int) -> None:
        self.base = [-1] * lanes  # the lane's base when indexed (a clear or restore: start over)
        self.next = [0] * lanes  # every complete episode ending below this row is indexed
        self.found: list[list[tuple[int, int]]] = [[] for _ in range(lanes)]  # (first, final) rows

    def complete(self, ring: Ring) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lane, first row, final row) of every complete, unevicted episode, as read now."""
        lo, head = ring.window_lists()
        bases = gather.bases(ring)
        out: list[tuple[int, int, int]] = []
        for lane in range(ring.lanes):
            if bases[lane] != self.base[lane] or head[lane] < self.next[lane]:
                self.base[lane], self.next[lane], self.found[lane] = bases[lane], 0, []
            new, frontier = gather.walk(ring, lane, lo[lane], head[lane], self.next[lane])
            found = self.found[lane]
            found += [e for e in new if e[1] < frontier]  # the rest: walked again next time
            self.next[lane] = frontier
            drop = 0
            while drop < len(found) and found[drop][0] < lo[lane]:
                drop += 1  # evicted (in part): never whole again
            del found[:drop]
            out += [(lane, f, h) for f, h in found + [e for e in new if e[1] >= frontier]]
        a = np.array(out, np.int64).reshape(-1, 3)
        return a[:, 0], a[:, 1], a[:, 2]


def sample(ebuf: Episodes, n: int, timeout: float) -> list[dict[str, np.ndarray]]:
    """``n`` whole episodes, uniformly over the complete ones, with replacement: each a
    dict of ``(T, ...)`` arrays (the fields, ``next_<obs>``, ``terminated``,
    ``truncated``)."""
    return list(read(Whole(ebuf), n, timeout)["episode"])


class Whole(Sampler):
    """Whole episodes, uniformly over the complete ones (of the episode index), for
    :func:`~shmbuf.core.read.read`: a batch is ``{"episode": (m,) objects}``."""

    what = "episodes"

    def __init__(self, ebuf: Episodes) -> None:
        self.ebuf = ebuf

    def empty(self, m: int) -> dict[str, np.ndarray]:
        return {"episode": np.empty(m, object)}

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        lanes, first, last = self.ebuf.episode_index.complete(self.ebuf.engine.ring)
        if not len(lanes):
            raise ValueError(_NONE)
        j = self.ebuf.engine.rng.integers(0, len(lanes), len(todo))
        return lanes[j], first[j], last[j]

    def gather(self, drawn: Any, out: dict[str, np.ndarray]) -> np.ndarray | None:
        got = out["episode"]
        for i, (lane, first, last) in enumerate(zip(*(a.tolist() for a in drawn))):
            got[i] = _copy(self.ebuf, lane, first, last)
        return np.array([e is not None for e in got], bool)


def _copy(ebuf: Episodes, lane: int, first: int, last: int) -> dict[str, np.ndarray] | None:
    """The episode in rows ``first .. last`` (its final row) of ``lane``, or None if a row
    was not intact or not of one episode (evicted or overwritten meanwhile)."""
    ring = ebuf.engine.ring
    rows = last - first + 1
    got = pool.batch([f for f in ring.layout.fields if f.name in ebuf.user_fields or f.name == "_flags"], rows)
    ok = core_gather.copy_windows(ring, lane, np.array([first], np.int64), rows, None,
                                  [got.get(f.name) for f in ring.layout.fields], same="_start")
    flags = got.pop("_flags")
    if ok is not None or not flags[-1] & FINAL or (flags[:-1] & FINAL).any():
        return None
    episode = {name: a[:-1] for name, a in got.items()}
    for o in ebuf.observations:
        episode["next_" + o] = got[o][1:]
    episode["terminated"] = (flags[:-1] & TERMINATED) != 0
    episode["truncated"] = (flags[:-1] & TRUNCATED) != 0
    return episode


def every(ebuf: Episodes) -> Iterator[dict[str, np.ndarray]]:
    """Every complete episode held now, lane by lane, oldest first (as :func:`sample`
    returns them); episodes evicted or overwritten during the walk are left out."""
    lanes, first, last = ebuf.episode_index.complete(ebuf.engine.ring)
    for j in np.lexsort((first, lanes)).tolist():
        episode = _copy(ebuf, int(lanes[j]), int(first[j]), int(last[j]))
        if episode is not None:
            yield episode

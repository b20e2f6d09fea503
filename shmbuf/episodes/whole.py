"""Whole episodes: complete (ended) and unevicted, uniform over episodes (garage's
``sample_path``), each in order even where it wraps around its lane.

The episodes are found by walking each lane back from its newest row, an episode at a
time (a row's ``_start`` says where its episode began), so a scan costs one read per
episode, not per row. The walk reads raw values only as a guide: each episode drawn is
then copied in one window whose every row is stamp-checked and of that episode.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from .. import sampling
from .rows import FINAL, TERMINATED, TRUNCATED

if TYPE_CHECKING:
    from .buffer import EpisodeBuffer

_NONE = ("the buffer holds no complete episode: one that has ended (its final observation written) "
         "and whose first step is not evicted yet")


def complete(ebuf: "EpisodeBuffer") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lane, first row, final row) of every complete, unevicted episode, as read now."""
    ring = ebuf.core._ring
    lc = ring.lane_capacity
    starts, flags = ring.arrays["_start"], ring.arrays["_flags"]
    lo, head = ring.window_lists()
    found: list[tuple[int, int, int]] = []
    for lane in range(ring.lanes):
        h = head[lane] - 1
        while h >= lo[lane]:
            slot = lane * lc + h % lc
            s = int(starts[slot])
            if flags[slot] & FINAL and lo[lane] <= s < h:
                found.append((lane, s, h))
            h = s - 1 if lo[lane] <= s <= h else h - 1  # a value out of place: one row back
    a = np.array(found, np.int64).reshape(-1, 3)
    return a[:, 0], a[:, 1], a[:, 2]


def sample(ebuf: "EpisodeBuffer", n: int, timeout: float) -> list[dict[str, np.ndarray]]:
    """``n`` whole episodes, uniformly over the complete ones, with replacement: each a
    dict of ``(T, ...)`` arrays (the fields, ``next_<obs>``, ``terminated``,
    ``truncated``)."""
    ring, rng = ebuf.core._ring, ebuf.core._rng
    out: list[dict[str, np.ndarray] | None] = [None] * n
    deadline = time.monotonic() + timeout
    while True:
        todo = [i for i, e in enumerate(out) if e is None]
        if not todo:
            return out  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise sampling.SampleTimeout(f"could not copy {len(todo)} intact episodes within {timeout:g} s")
        lanes, first, last = complete(ebuf)
        if not len(lanes):
            raise ValueError(_NONE)
        for i, j in zip(todo, rng.integers(0, len(lanes), len(todo))):
            out[i] = _copy(ebuf, int(lanes[j]), int(first[j]), int(last[j]))


def _copy(ebuf: "EpisodeBuffer", lane: int, first: int, last: int) -> dict[str, np.ndarray] | None:
    """The episode in rows ``first .. last`` (its final row) of ``lane``, or None if a row
    was not intact or not of one episode (evicted or overwritten meanwhile)."""
    ring = ebuf.core._ring
    rows = last - first + 1
    got = {f.name: np.empty((rows,) + f.shape, f.dtype) for f in ring.layout.fields
           if f.name in ebuf._user or f.name == "_flags"}
    ok = sampling.copy_windows(ring, lane, np.array([first], np.int64), rows, None,
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

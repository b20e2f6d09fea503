"""Trajectories: windows of one episode ending at a sampled step (d3rlpy's
``BasicTrajectorySlicer``), torn-read proof.

The end step is drawn like a one-step transition (uniform over transitions), the window
``end - length + 1 .. end`` is read row by row, and the rows before the episode's first
step are padding: zeros, ``mask`` False, ``timestep`` 0, ``returns_to_go`` 0. Steps of
the episode that were already evicted are padding too (d3rlpy keeps whole episodes in
memory and would still show them; a ring has overwritten them). ``returns_to_go`` adds
the rewards up to the episode's end: its last step for an episode that has ended, the
newest step written so far for one in progress.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from .. import sampling
from . import gather
from .rows import FINAL, TERMINATED, TRUNCATED
from .transitions import _NONE_YET

if TYPE_CHECKING:
    from .buffer import EpisodeBuffer


def sample(ebuf: "EpisodeBuffer", batch: int, length: int, timeout: float) -> dict[str, np.ndarray]:
    """``batch`` trajectories of ``length`` steps: every field ``(batch, length, ...)``
    and ``mask``, ``timestep`` (1-based), ``returns_to_go``, ``terminated``,
    ``truncated``."""
    out = _empty(ebuf, batch, length)
    bad = np.arange(batch)
    deadline = time.monotonic() + timeout
    while len(bad):
        if time.monotonic() >= deadline:
            raise sampling.SampleTimeout(f"could not draw {len(bad)} intact trajectories within {timeout:g} s")
        more = _empty(ebuf, len(bad), length)
        good = np.flatnonzero(_fill(ebuf, more, length))
        for key, a in out.items():
            a[bad[:len(good)]] = more[key][good]
        bad = bad[len(good):]
    return out


def _empty(ebuf: "EpisodeBuffer", n: int, length: int) -> dict[str, np.ndarray]:
    out = {name: np.empty((n, length) + shape, dtype) for name, (shape, dtype) in ebuf._user.items()}
    rtg = np.dtype(ebuf._user[ebuf.reward][1]) if ebuf.reward else np.dtype(np.float64)
    out["returns_to_go"] = np.empty((n, length), rtg if rtg.kind == "f" else np.float64)
    out["timestep"] = np.empty((n, length), np.int64)
    out["mask"] = np.empty((n, length), bool)
    out["terminated"] = np.empty((n, length), bool)
    out["truncated"] = np.empty((n, length), bool)
    return out


def _fill(ebuf: "EpisodeBuffer", out: dict[str, np.ndarray], length: int) -> np.ndarray:
    """Draw ``len(out)`` trajectories into ``out``; returns the mask of the intact ones."""
    ring, rng = ebuf.core._ring, ebuf.core._rng
    m = len(out["mask"])
    try:
        lane, end, _ = sampling.draw_windows(ring, rng, m, 2, None)
    except ValueError:
        if ring.size() == 0:
            raise
        raise ValueError(_NONE_YET) from None
    if type(lane) is not np.ndarray:
        lane = np.full(m, lane, np.int64)
    # 1. The end: a transition (not a final row, its next row of the same episode)
    start = np.empty(m, np.int64)
    valid = gather.windows(ring, lane, end, [{"_start": start}, {}])
    # 2. The window, row by row: fields, episode, flags
    seq = end[:, None] - np.arange(length - 1, -1, -1)
    inside = seq >= start[:, None]  # the episode's steps (the rest is padding)
    want = {name: a.reshape((m * length,) + a.shape[2:]) for name, a in out.items() if name in ebuf._user}
    starts, flags = np.empty(m * length, np.int64), np.empty(m * length, np.uint8)
    want.update(_start=starts, _flags=flags)
    ok = gather.rows(ring, lane.repeat(length), np.maximum(seq, 0).ravel(), want).reshape(m, length)
    ok &= starts.reshape(m, length) == start[:, None]
    lo = ring.window()[0][lane]  # after the copy: rows below are evicted (padding), not torn
    mask = inside & ok
    valid &= ~(inside & ~ok & (seq >= lo[:, None])).any(axis=1) & mask[:, -1]  # (the end itself: not evicted)
    for name, a in out.items():
        if name in ebuf._user:
            a[~mask] = 0
    flags = flags.reshape(m, length)
    out["mask"][:] = mask
    out["timestep"][:] = np.where(mask, seq - start[:, None] + 1, 0)
    out["terminated"][:] = mask & ((flags & TERMINATED) != 0)
    out["truncated"][:] = mask & ((flags & TRUNCATED) != 0)
    # 3. Returns to go: the window's rewards, plus those of the rest of the episode
    if ebuf.reward is None:
        out["returns_to_go"][:] = 0
        return valid
    rew = np.where(mask, out[ebuf.reward], 0).astype(np.float64)
    after, known = _rest(ebuf, lane, end, start)
    valid &= known
    out["returns_to_go"][:] = np.where(mask, np.cumsum(rew[:, ::-1], axis=1)[:, ::-1] + after[:, None], 0)
    return valid


def _rest(ebuf: "EpisodeBuffer", lane: np.ndarray, end: np.ndarray,
          start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sum of the rewards after row ``end`` to its episode's end, and a mask of the
    windows for which it is known (every row read intact; the end found is the final
    row, or no published row of the episode follows it)."""
    ring = ebuf.core._ring
    m = len(end)
    last = ebuf._episode_ends().last_rows(lane, end, start)  # the episode's last row (final, or newest)
    count = last - end  # rows after the end, up to and with the last
    rows = np.repeat(np.arange(m), count)
    seq = np.repeat(end + 1 - np.cumsum(count) + count, count) + np.arange(count.sum())
    rew = np.empty(len(seq), ebuf._user[ebuf.reward][1])
    starts, flags = np.empty(len(seq), np.int64), np.empty(len(seq), np.uint8)
    ok = gather.rows(ring, lane[rows], seq, {ebuf.reward: rew, "_start": starts, "_flags": flags})
    ok &= starts == start[rows]
    known = np.bincount(rows, weights=~ok, minlength=m) == 0
    final = np.zeros(m, bool)
    final[rows[(flags & FINAL) != 0]] = True
    known &= final | ~gather.continues(ring, lane, last + 1, start)  # (it went on since: drawn again)
    return np.bincount(rows, weights=np.where(ok, rew, 0), minlength=m), known


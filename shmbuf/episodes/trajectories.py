"""Trajectories: windows of one episode ending at a sampled step (d3rlpy's
``BasicTrajectorySlicer``), torn-read proof.

The end step is drawn like a one-step transition (uniform over transitions). Each
trajectory is then read in one pass that proves everything it returns:

1. **The window** ``end - length + 1 .. end``, every field, through the checked read
   (:func:`shmbuf.episodes.gather.rows`). Row ``end`` must be intact and a transition
   (not a final row): its ``_start`` names the episode. The rows before the episode's
   first step are padding: zeros, ``mask`` False, ``timestep`` 0, ``returns_to_go`` 0.
   Steps of the episode already evicted are padding too, and padding is only ever at the
   front: a row that failed its check counts as evicted only if it lies below the lane's
   window read after the copy, and then every row before it is padding as well; a failed
   row inside the window means the copy was torn, and the trajectory is drawn again.
2. **The tail** ``end + 1 .. last`` (reward and episode fields) through the same checked
   read, where ``last`` is the episode's last row found by a search over raw reads (a
   guide only). The sum of its rewards is the trajectory's return after ``end``, and it
   is used only if it is proven to be the whole rest of the episode: every tail row was
   read intact and of the episode, and either row ``last`` is the episode's final row
   (the episode has ended), or row ``last + 1``, read through the same check, is
   another episode's (the episode was cut: its writer died), or the stamp of row
   ``last + 1``, read before the tail was copied, shows that row not yet published in
   its lap (the episode is in progress, and ``last`` was its newest published step).
   Anything else (the ring wrapped over the tail, the episode went on since the search)
   redraws the trajectory.

d3rlpy keeps whole episodes in memory and would still show evicted steps; a ring has
overwritten them. ``returns_to_go`` adds the rewards up to the episode's end: its last
step for an episode that has ended, the newest step written so far for one in progress.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shmbuf.core import pool
from shmbuf.core.read import Sampler, read
from shmbuf.episodes import gather
from shmbuf.episodes.rows import FINAL, TERMINATED, TRUNCATED
from shmbuf.episodes.transitions import draw_pairs, none_yet
from shmbuf.episodes.parts import Episodes
from shmbuf.core.layout import published



def sample(ebuf: Episodes, batch: int, length: int, timeout: float, where: bool = False,
           burn_in: int = 0, beta: float | None = None) -> dict[str, np.ndarray]:
    """``batch`` trajectories of ``burn_in + length`` steps: every field ``(batch,
    burn_in + length, ...)`` and ``mask``, ``timestep`` (1-based), ``returns_to_go``,
    ``terminated``, ``truncated``; with ``burn_in``, ``burn_in_mask`` (True on the first
    ``burn_in`` positions that hold a step). The end step is drawn uniformly over
    transitions, or with ``beta`` by its priority (then with ``weight`` and ``index``,
    as :func:`shmbuf.episodes.transitions.sample_by_priority` gives them). With
    ``where``, also each one's ``_lane``, ``_seq`` (its last row) and ``_start`` (its
    episode's first row), for samplers built on this one."""
    total = burn_in + length
    draws = Trajectories(ebuf, total, where) if beta is None else ByPriority(ebuf, total, where, timeout)
    out = read(draws, batch, timeout)
    if burn_in:
        out["burn_in_mask"] = out["mask"] & (np.arange(total) < burn_in)
    if beta is not None:
        out["weight"] = np.power(draws.low / out.pop("_p"), beta)  # type: ignore[attr-defined]
        out["index"] = np.stack([out.pop("_slot"), out.pop("_end")], axis=1)
    return out


class Trajectories(Sampler):
    """Trajectories of ``length`` steps ending at a step drawn uniformly over pairs of
    adjacent rows (the pairs that are not transitions are rejected by the gather), for
    :func:`~shmbuf.core.read.read`."""

    what = "trajectories"

    def __init__(self, ebuf: Episodes, length: int, where: bool) -> None:
        self.ebuf, self.length, self.where = ebuf, length, where

    def empty(self, m: int) -> dict[str, np.ndarray]:
        return _empty(self.ebuf, m, self.length, self.where)

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        lane, end = draw_pairs(self.ebuf, len(todo))
        if type(lane) is not np.ndarray:
            lane = np.full(len(todo), lane, np.int64)
        return lane, end, None

    def gather(self, drawn: Any, out: dict[str, np.ndarray]) -> np.ndarray | None:
        lane, end, ok = drawn
        valid = copy_trajectories(self.ebuf, out, self.length, lane, end)
        return valid if ok is None else valid & ok


class ByPriority(Trajectories):
    """Trajectories ending at a step drawn by its priority, each with its slot, end row
    and leaf (the private ``_slot``, ``_end``, ``_p``); ``low``: the smallest leaf of
    every version of the trees drawn from."""

    what = "trajectories"

    def __init__(self, ebuf: Episodes, length: int, where: bool, timeout: float) -> None:
        super().__init__(ebuf, length, where)
        self.trees, self.timeout, self.low = ebuf.engine.priorities, timeout, np.inf
        self.check = none_yet(ebuf)  # type: ignore[method-assign]

    def empty(self, m: int) -> dict[str, np.ndarray]:
        out = super().empty(m)
        out.update(_slot=np.empty(m, np.int64), _end=np.empty(m, np.int64), _p=np.empty(m))
        return out

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        slots, p, end, least, drawn = self.trees.pick(self.ebuf.engine.rng, len(todo), deadline, self.timeout)
        self.low = min(self.low, least)
        lane = slots // self.trees.lc
        drawn &= end + 1 < self.ebuf.engine.heads()[lane]  # a transition: not the newest row
        self.picked = slots, p
        return lane, end, drawn

    def gather(self, drawn: Any, out: dict[str, np.ndarray]) -> np.ndarray | None:
        out["_slot"][:], out["_p"][:] = self.picked
        out["_end"][:] = drawn[1]
        return super().gather(drawn, out)


def _empty(ebuf: Episodes, n: int, length: int, where: bool = False) -> dict[str, np.ndarray]:
    specs = {name: ((n, length) + shape, dtype) for name, (shape, dtype) in ebuf.user_fields.items()}
    rtg = np.dtype(ebuf.user_fields[ebuf.reward][1]) if ebuf.reward else np.dtype(np.float64)
    specs["returns_to_go"] = ((n, length), rtg if rtg.kind == "f" else np.float64)
    specs["timestep"] = ((n, length), np.int64)
    specs.update(dict.fromkeys(("mask", "terminated", "truncated"), ((n, length), bool)))
    if where:
        specs.update(dict.fromkeys(("_lane", "_start", "_seq"), ((n,), np.int64)))
    return dict(zip(specs, pool.empty(list(specs.values()))))


def copy_trajectories(ebuf: Episodes, out: dict[str, np.ndarray], length: int, lane: np.ndarray,
          end: np.ndarray) -> np.ndarray:
    """Read the trajectories ending at rows ``end`` of ``lane`` into ``out``; returns the
    mask of the ones proven intact (the others are drawn again)."""
    ring = ebuf.engine.ring
    m = len(out["mask"])
    # 1. The window, row by row through the checked read: fields, episode, flags
    seq = end[:, None] - np.arange(length - 1, -1, -1)
    want = {name: a.reshape((m * length,) + a.shape[2:]) for name, a in out.items() if name in ebuf.user_fields}
    starts, flags = np.empty((m, length), np.int64), np.empty((m, length), np.uint8)
    want.update(_start=starts.reshape(-1), _flags=flags.reshape(-1))
    ok = gather.rows(ring, lane.repeat(length), np.maximum(seq, 0).ravel(), want).reshape(m, length)
    start = starts[:, -1].copy()  # the episode: proven by row end's check (required below)
    valid = ok[:, -1] & ((flags[:, -1] & FINAL) == 0)
    start[~valid] = end[~valid]  # (a rejected window's episode: any row, so the code below runs)
    ok &= starts == start[:, None]
    inside = seq >= start[:, None]  # the episode's steps (the rest is padding)
    if "_lane" in out:
        out["_lane"][:], out["_start"][:], out["_seq"][:] = lane, start, end
    # 2. The tail: rows end + 1 .. last of the episode, proven whole (see the module)
    after, known = _tail(ebuf, lane, end, start, valid) if ebuf.reward is not None else (np.zeros(m), valid)
    valid &= known
    # Front padding only: a failed row of the episode is evicted if it lies below the
    # lane's window now (after the copies); every row up to the last evicted one is padding
    mask = inside & ok
    failed = inside & ~ok
    if failed.any():
        lo = ring.window()[0][lane]
        valid &= ~(failed & (seq >= lo[:, None])).any(axis=1)
        mask &= seq > np.where(failed, seq, -1).max(axis=1)[:, None]
    for name, a in out.items():
        if name in ebuf.user_fields:
            a[~mask] = 0
    out["mask"][:] = mask
    out["timestep"][:] = np.where(mask, seq - start[:, None] + 1, 0)
    out["terminated"][:] = mask & ((flags & TERMINATED) != 0)
    out["truncated"][:] = mask & ((flags & TRUNCATED) != 0)
    # 3. Returns to go: the window's rewards, plus those of the rest of the episode
    if ebuf.reward is None:
        out["returns_to_go"][:] = 0
        return valid
    rew = np.where(mask, out[ebuf.reward], 0).astype(np.float64)
    out["returns_to_go"][:] = np.where(mask, np.cumsum(rew[:, ::-1], axis=1)[:, ::-1] + after[:, None], 0)
    return valid


def _tail(ebuf: Episodes, lane: np.ndarray, end: np.ndarray, start: np.ndarray,
          valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For the windows of ``valid``: the sum of the rewards of rows ``end + 1`` to their
    episode's last row, and a mask of the windows for which it is proven to be the whole
    rest of the episode (see the module docstring). Other windows: 0 and False."""
    ring = ebuf.engine.ring
    m = len(end)
    after, known = np.zeros(m), np.zeros(m, bool)
    which = np.flatnonzero(valid)
    if not len(which):
        return after, known
    ln, e, s = lane[which], end[which], start[which]
    last = ebuf.episode_ends().last_rows(ln, e, s)  # a guide: proven below
    # the row after the last: its stamp read before the tail is copied
    lc = ring.lane_capacity
    nxt = last + 1
    sentinel = gather.stamps(ring, ln, nxt)
    count = np.maximum(last - e, 0)  # rows end + 1 .. last: at least the next step (or final row)
    span = count + 1  # and the row after them, read through the check too
    rows = np.repeat(np.arange(len(which)), span)
    seq = np.repeat(e + 1 - np.cumsum(span) + span, span) + np.arange(int(span.sum()))
    rew = np.empty(len(seq), ebuf.user_fields[ebuf.reward][1])
    starts, flags = np.empty(len(seq), np.int64), np.empty(len(seq), np.uint8)
    ok = gather.rows(ring, ln[rows], seq, {ebuf.reward: rew, "_start": starts, "_flags": flags})
    after_last = seq == nxt[rows]
    mine = ok & (starts == s[rows]) & ~after_last  # intact rows of the episode's tail
    whole = (count > 0) & (np.bincount(rows, weights=~mine & ~after_last, minlength=len(which)) == 0)
    # ended: its final row is the last; cut: the row after the last is intact and another
    # episode's (its writer died: a lane's next rows are a new episode's)
    ended = np.zeros(len(which), bool)
    ended[rows[mine & (seq == last[rows]) & ((flags & FINAL) != 0)]] = True
    ended[rows[after_last & ok & (starts != s[rows])]] = True
    # in progress: row last + 1 not published when looked at (an older lap's stamp, its
    # odd stamp, or 0), and not a later lap's abandoned row (its slot reserved again)
    unpublished = sentinel < published(nxt)
    zero = unpublished & (sentinel == 0)
    if zero.any():
        unpublished[zero] = ebuf.engine.heads()[ln[zero]] < nxt[zero] + lc
    known[which] = whole & (ended | unpublished)
    after[which] = np.bincount(rows, weights=np.where(mine, rew, 0), minlength=len(which))
    return after, known

"""One-step and n-step transitions out of an episode buffer, torn-read proof.

A transition is a step row whose next row in the lane belongs to the same episode (the
next step, or the final row). Candidates are drawn uniformly over pairs of adjacent
rows (the core's windows of 2), so rejecting the pairs that are not transitions (a
final row first, or two episodes) leaves a uniform draw over transitions. Every row a
transition reads (the step, the rows an n-step return adds up, the one holding the next
observation) is copied with the core's stamp check; a torn or unpublished row rejects
the candidate, which is drawn again.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from .. import sampling
from ..layout import LANE_HEAD
from .rows import FINAL, SYSTEM, TERMINATED, TRUNCATED

if TYPE_CHECKING:
    from .buffer import EpisodeBuffer

_ROUNDS_BEFORE_SCAN = 8
_NONE_YET = ("the buffer holds no transition yet: an episode's step becomes one once its next step "
             "or its end is written")


def sample(ebuf: "EpisodeBuffer", n: int, n_step: int, gamma: float, timeout: float) -> dict[str, np.ndarray]:
    """``n`` transitions: the step's fields, ``next_<obs>``, ``terminated``, ``truncated``
    and, for ``n_step > 1``, ``steps`` (taken, <= n_step) with the discounted reward."""
    core = ebuf.core
    ring, rng = core._ring, core._rng
    fields = ring.layout.fields
    user = [f for f in fields if f.name not in SYSTEM]
    out = {f.name: np.empty((n,) + f.shape, f.dtype) for f in user}
    for o in ebuf.observations:
        out["next_" + o] = np.empty_like(out[o])
    out["terminated"] = np.empty(n, bool)
    out["truncated"] = np.empty(n, bool)
    if n_step > 1:
        out["steps"] = np.empty(n, np.int64)
    span = n_step + 1
    todo = np.arange(n)
    deadline = time.monotonic() + timeout
    rounds = 0
    while len(todo):
        rounds += 1
        if rounds > _ROUNDS_BEFORE_SCAN and not _any_transition(ebuf):
            raise ValueError(_NONE_YET)
        if time.monotonic() >= deadline:
            raise sampling.SampleTimeout(
                f"could not draw {len(todo)} transitions within {timeout:g} s" +
                (f": with n_step={n_step}, the newest steps of an episode in progress wait until "
                 f"{n_step} steps follow them or it ends" if n_step > 1 else ""))
        m = len(todo)
        try:
            lane, first, _ = sampling.draw_windows(ring, rng, m, 2, None)
        except ValueError:
            if ring.size() == 0:
                raise  # "empty buffer"
            raise ValueError(_NONE_YET) from None  # no lane holds two rows
        lane = np.ascontiguousarray(np.broadcast_to(lane, first.shape), np.int64)
        seq = first[:, None] + np.arange(span)
        head = ring.lane_table[:, LANE_HEAD][lane][:, None]
        beyond = seq >= head  # not written yet (only for n-step windows)
        seq = np.minimum(seq, head - 1)
        tmp = [np.empty((m * span,) + f.shape, f.dtype) for f in fields]
        ok = sampling.copy_windows(ring, lane.repeat(span), seq.ravel(), 1, None, tmp)
        got = {f.name: a.reshape((m, span) + f.shape) for f, a in zip(fields, tmp)}
        ok = ~beyond if ok is None else ok.reshape(m, span) & ~beyond
        ep, fl = got["_episode"], got["_flags"]
        same = ok & (ep == ep[:, :1])
        ends = (fl[:, :n_step] & (TERMINATED | TRUNCATED)) != 0
        k = np.where(ends.any(axis=1), ends.argmax(axis=1) + 1, n_step)  # steps taken
        rows = np.arange(m)
        valid = same[:, 0] & ((fl[:, 0] & FINAL) == 0) & (np.cumprod(same, axis=1)[rows, k] == 1)
        r, k = rows[valid], k[valid]
        pos = todo[valid]
        for f in user:
            out[f.name][pos] = got[f.name][r, 0]
        for o in ebuf.observations:
            out["next_" + o][pos] = got[o][r, k]
        last = fl[r, k - 1]
        out["terminated"][pos] = (last & TERMINATED) != 0
        out["truncated"][pos] = (last & TRUNCATED) != 0
        if n_step > 1:
            rew = got[ebuf.reward][r, :n_step].astype(np.float64)
            disc = np.where(np.arange(n_step) < k[:, None], gamma ** np.arange(n_step), 0.0)
            out[ebuf.reward][pos] = (rew * disc).sum(axis=1)
            out["steps"][pos] = k
        todo = todo[~valid]
    return out


def _any_transition(ebuf: "EpisodeBuffer") -> bool:
    """Whether any published pair of rows is a transition (an exact scan; rare)."""
    ring = ebuf.core._ring
    lo, head = ring.window()
    lc = ring.lane_capacity
    for lane in range(ring.lanes):
        seq = np.arange(lo[lane], head[lane])
        slots = lane * lc + seq % lc
        ok = ring.stamps[slots] == 2 * seq + 2
        ep, fl = ring.arrays["_episode"][slots], ring.arrays["_flags"][slots]
        pair = ok[:-1] & ok[1:] & (ep[:-1] == ep[1:]) & ((fl[:-1] & FINAL) == 0)
        if pair.any():
            return True
    return False

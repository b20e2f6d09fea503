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
from . import gather
from .rows import FINAL, TERMINATED, TRUNCATED

if TYPE_CHECKING:
    from .buffer import EpisodeBuffer

_ROUNDS_BEFORE_SCAN = 8
_NONE_YET = ("the buffer holds no transition yet: an episode's step becomes one once its next step "
             "or its end is written")


def sample(ebuf: "EpisodeBuffer", n: int, n_step: int, gamma: float, timeout: float) -> dict[str, np.ndarray]:
    """``n`` transitions: the step's fields, ``next_<obs>``, ``terminated``, ``truncated``
    and, for ``n_step > 1``, ``steps`` (taken, <= n_step) with the discounted reward.
    With frame stacking, observations come as stacks ``(n, k, *frame)``.

    A few more candidates than ``n`` are drawn (about the fraction this handle last saw
    rejected: final rows, rows still waiting for their next observation), so that a
    second draw is rare: the first ``n`` that are transitions are kept, which in an
    i.i.d. stream of candidates are i.i.d. too."""
    if n == 0:
        return _empty(ebuf, 0, n_step)
    out = _empty(ebuf, n + int(n * ebuf._rejected) + 4, n_step)
    valid = _fill(ebuf, out, n_step, gamma)
    if valid[:n].all():
        return {key: a[:n] for key, a in out.items()}
    ebuf._rejected = min(1.5 * (1.0 - np.count_nonzero(valid) / len(valid)), 1.0)
    bad = np.flatnonzero(~valid[:n])
    spare = np.flatnonzero(valid[n:])[:len(bad)] + n
    for a in out.values():
        a[bad[:len(spare)]] = a[spare]
    bad = bad[len(spare):]
    deadline = time.monotonic() + timeout
    rounds = 0
    while len(bad):  # draw again for the candidates that were not transitions (or torn)
        rounds += 1
        if rounds > _ROUNDS_BEFORE_SCAN and not _any_transition(ebuf):
            raise ValueError(_NONE_YET)
        if time.monotonic() >= deadline:
            raise sampling.SampleTimeout(
                f"could not draw {len(bad)} transitions within {timeout:g} s" +
                (f": with n_step={n_step}, the newest steps of an episode in progress wait until "
                 f"{n_step} steps follow them or it ends" if n_step > 1 else ""))
        more = _empty(ebuf, 2 * len(bad) + 4, n_step)
        good = np.flatnonzero(_fill(ebuf, more, n_step, gamma))[:len(bad)]
        for key, a in out.items():
            a[bad[:len(good)]] = more[key][good]
        bad = bad[len(good):]
    return {key: a[:n] for key, a in out.items()}


def _empty(ebuf: "EpisodeBuffer", n: int, n_step: int) -> dict[str, np.ndarray]:
    """The arrays of a batch of ``n`` transitions."""
    k = ebuf.frame_stack
    out: dict[str, np.ndarray] = {}
    for name, (shape, dtype) in ebuf._user.items():
        stacked = k > 1 and name in ebuf.observations
        out[name] = np.empty((n,) + ((k,) if stacked else ()) + shape, dtype)
    for o in ebuf.observations:
        out["next_" + o] = np.empty_like(out[o])
    out["terminated"] = np.empty(n, bool)
    out["truncated"] = np.empty(n, bool)
    if n_step > 1:
        out["steps"] = np.empty(n, np.int64)
    return out


def _fill(ebuf: "EpisodeBuffer", out: dict[str, np.ndarray], n_step: int, gamma: float) -> np.ndarray:
    """Draw ``len(out)`` candidates uniformly over pairs of adjacent rows and copy them
    into ``out``; returns the mask of those that are intact transitions."""
    ring, rng = ebuf.core._ring, ebuf.core._rng
    m, k, n = len(out["terminated"]), ebuf.frame_stack, n_step
    try:
        lane, t, _ = sampling.draw_windows(ring, rng, m, 2, None)
    except ValueError:
        if ring.size() == 0:
            raise  # "empty buffer"
        raise ValueError(_NONE_YET) from None  # no lane holds two rows
    if type(lane) is not np.ndarray:  # a one-lane ring
        lane = np.full(m, lane, np.int64)
    # 1. Rows t .. t+n, one window per candidate: row t's fields straight into the
    #    output, then what the rows after it are read for (the large observations
    #    apart: 2.); each row checked on its own, as a window may run past the head
    apart, obs = ebuf._apart, [o for o in ebuf.observations if o not in ebuf._apart]
    fl = np.empty(m, np.uint8)
    first = {name: out[name] for name in ebuf._user if name not in apart}
    first["_flags"] = fl
    if k > 1:
        first["_start"] = start = np.empty(m, np.int64)
    if n == 1:
        valid = gather.windows(ring, lane, t, [first, {o: out["next_" + o] for o in obs}])
        steps, last = 1, fl
    else:
        rew = out[ebuf.reward]
        flags = np.empty((n, m), np.uint8)
        rews = np.empty((n,) + rew.shape, rew.dtype)
        nobs = {o: np.empty((n,) + out[o].shape, out[o].dtype) for o in obs}
        after = [{"_flags": flags[j], ebuf.reward: rews[j],
                  **{o: a[j] for o, a in nobs.items()}} for j in range(n)]
        ok = gather.windows(ring, lane, t, [first] + after, per_row=True)
        same = ok[:, 1:]  # intact rows of the candidate's episode
        ended = (np.concatenate([fl[None], flags[:n - 1]]) & (TERMINATED | TRUNCATED)) != 0  # rows t .. t+n-1
        steps = np.where(ended.any(axis=0), ended.argmax(axis=0) + 1, n)
        rows = np.arange(m)
        valid = ok[:, 0] & (np.cumprod(same, axis=1)[rows, steps - 1] == 1)  # rows t+1 .. t+steps
        last = np.where(steps == 1, fl, flags[np.maximum(steps - 2, 0), rows])
        taken = np.arange(n)[:, None] < steps  # (n, m): the rewards of rows t .. t+steps-1
        r = np.concatenate([rew[None], rews[:n - 1]]).astype(np.float64)
        rew[:] = (np.where(taken, r, 0.0) * gamma ** np.arange(n)[:, None]).sum(axis=0)
        out["steps"][:] = steps
        for o, a in nobs.items():
            out["next_" + o][:] = a[steps - 1, rows]
    np.bitwise_and(last, TERMINATED, out=out["terminated"].view(np.uint8))
    np.not_equal(last & TRUNCATED, 0, out=out["truncated"])
    # 2. The large observations: frame stacks, or the rows t and t+steps alone
    if k > 1:
        valid &= gather.stacks(ring, lane, t, start, k, {o: out[o] for o in apart})
        valid &= gather.stacks(ring, lane, t + steps, start, k, {o: out["next_" + o] for o in apart})
    elif apart:
        valid &= gather.rows(ring, lane, t, {o: out[o] for o in apart})
        valid &= gather.rows(ring, lane, t + steps, {o: out["next_" + o] for o in apart})
    return valid


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

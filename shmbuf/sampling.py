"""Sampling rows and windows out of a ring, with the torn-read check.

A draw picks lane sequence numbers ``s`` from each lane's window of current rows and
maps them to slots. The copy is then checked: a row is kept only if its stamp was
``2*s + 2`` (published, holding exactly row ``s``) both before and after the copy.
Rows that fail (being written, overwritten meanwhile, reserved by a dead writer) are
drawn again. After a few rounds the draw switches to the exact set of published rows,
so even a ring that is mostly reserved by dead writers is sampled uniformly over what
is really there.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from .layout import LANE_BASE, LANE_HEAD
from .lock import LockTimeout
from .ring import Ring

_UNIFORM_ROUNDS = 4


class SampleTimeout(TimeoutError):
    """No published row could be copied in time."""


def _check_enough(lo: Any, head: Any, length: int, lanes: int) -> None:
    """Raise the ValueError that says why no window of ``length`` rows can be drawn from
    the lane windows ``lo .. head`` (ints for one lane, arrays for several), if none can."""
    if lanes == 1:
        if head - lo >= length:
            return
        size, longest = head - lo, head - lo
    else:
        if (head - lo >= length).any():
            return
        size, longest = int((head - lo).sum()), int((head - lo).max())
    if size == 0:
        raise ValueError("cannot sample from an empty buffer: add rows first")
    raise ValueError(
        f"no lane holds {length} consecutive rows yet (the buffer holds {size} rows"
        + (f" over {lanes} lanes" if lanes > 1 else "")
        + f"); add more rows or ask for a length <= {longest}")


def _draw(ring: Ring, rng: np.random.Generator, n: int, length: int,
          pool: tuple[np.ndarray, np.ndarray] | None) -> tuple[Any, np.ndarray, Any]:
    """Draw ``n`` windows of ``length`` rows: their lane (an int for a single-lane ring,
    else an array), first sequence numbers, and for a uniform draw from one lane the
    lowest sequence number it could draw (else None).

    Without ``pool``: uniform over the windows inside one snapshot of each lane's
    current rows (``ValueError`` if there are none, e.g. just after a clear).
    With ``pool`` (lanes, first sequence numbers of windows known to be published):
    uniform over those.
    """
    if pool is not None:
        pick = rng.integers(0, len(pool[0]), n)
        return pool[0][pick], pool[1][pick], None
    if ring.lanes == 1:
        lo, head = ring.window1()
        _check_enough(lo, head, length, 1)
        # floor(u * m) for uniform floats u: as uniform as integers() (bias below m / 2**53)
        # and twice as fast for a batch of a few hundred
        first = (rng.random(n) * (head - length + 1 - lo)).astype(np.int64)
        first += lo
        return 0, first, lo
    lo, head = ring.window_lists()
    starts = [max(h - l - length + 1, 0) for l, h in zip(lo, head)]
    if not any(starts):
        _check_enough(np.array(lo), np.array(head), length, ring.lanes)  # raises
    u = rng.random(n)  # window floor(u * total) of all lanes' windows, in lane order
    if ring.native is not None:  # the same arithmetic in one call
        first, lane = np.empty(n, np.int64), np.empty(n, np.int64)
        ring.native.draw(u, lo, starts, first, lane)
        return lane, first, None
    cum = np.cumsum(starts)
    x = (u * int(cum[-1])).astype(np.int64)
    lane = np.searchsorted(cum, x, side="right")
    x += (np.array(lo) - (cum - starts)).take(lane)  # minus the windows of lower lanes, plus lo
    return lane, x, None


def _rows(ring: Ring, lane: Any, first: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Slots and expected stamps, both ``(n, length)``, of the windows (lane, first)."""
    lc = ring.lane_capacity
    if length == 1 and ring.lanes == 1:  # the common case: uniform rows of one lane
        return (first % lc)[:, None], (first * 2 + 2)[:, None]
    seq = first[:, None] + np.arange(length)
    rows = seq % lc
    if ring.lanes > 1:
        rows += (lane * lc)[:, None]
    return rows, 2 * seq + 2


def published_windows(ring: Ring, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(lane, first sequence) of every window of ``length`` published rows (exact scan)."""
    lo, head = ring.window()
    lanes, firsts = [], []
    for lane in range(ring.lanes):
        seq = np.arange(lo[lane], head[lane])
        ok = ring.stamps[lane * ring.lane_capacity + seq % ring.lane_capacity] == 2 * seq + 2
        run = np.concatenate(([0], np.cumsum(ok)))
        good = np.flatnonzero(run[length:] - run[:-length] == length)
        lanes.append(np.full(len(good), lane, np.int64))
        firsts.append(seq[good])
    return np.concatenate(lanes), np.concatenate(firsts)


def _pool_or_raise(ring: Ring, length: int, deadline: float) -> tuple[np.ndarray, np.ndarray] | None:
    """The published windows; None if there are none *yet*; ValueError if there never
    will be without new writes (the buffer is empty, or everything it counts is held
    by writers that died or gave up).

    The final verdict is taken under the header lock (nothing is cleared or restored
    meanwhile) and is exact: no live writer was in flight when it looked, and no lane's
    head moved between then and the scan of the stamps, so nothing was published meanwhile."""
    _check_enough(*ring.window(), length, ring.lanes)
    pool = published_windows(ring, length)
    if len(pool[0]) or ring.live_writers_in_flight():
        return pool if len(pool[0]) else None
    try:
        ring.lock.acquire(max(0.0, min(deadline - time.monotonic(), 0.05)))
    except LockTimeout:
        return None  # busy (a restore?): look again later
    try:
        heads = ring.lane_table[:, LANE_HEAD].copy()
        if ring.live_writers_in_flight():
            return None
        _check_enough(*ring.window(), length, ring.lanes)
        pool = published_windows(ring, length)
        if len(pool[0]):
            return pool
        if not np.array_equal(heads, ring.lane_table[:, LANE_HEAD]):
            return None  # an owner (who takes no lock) wrote meanwhile: look again
    finally:
        ring.lock.release()
    raise ValueError(
        "the buffer has no published rows to sample: every row it counts was "
        "reserved by a writer that died (or gave up) before publishing it")


def _copy(ring: Ring, lane: Any, first: np.ndarray, length: int, lo: Any,
          out: Sequence[np.ndarray]) -> np.ndarray | None:
    """Copy the windows (lane, first) of ``length`` rows into ``out`` (field order, first
    axes flattened).

    A window is intact if every stamp named its row before and after the copy, and
    the window still starts at or after its lane's base (no clear() fell in between:
    a window drawn before a clear could otherwise join rows from both sides of it).
    ``lo`` (if not None) is a lower bound of ``first``: the common case is then one
    scalar comparison. Returns None if every window is intact, else a boolean mask of
    the intact ones. The native path does the same in C, with acquire loads.
    """
    if ring.native is not None:
        mask = ring.native.gather(first, lane, length, out)
        return None if mask is None else np.frombuffer(mask, np.bool_)
    rows, expected = _rows(ring, lane, first, length)
    flat = rows.ravel()
    stamps = ring.stamps
    before = stamps[flat]
    block, views = ring.row_scratch(len(flat))  # packed fields: one gather of whole rows
    np.take(ring.rows, flat, axis=0, out=block, mode="clip")
    for f, dst in zip(ring.layout.fields, out):
        if f.packed:
            np.copyto(dst, views[f.name])
        else:
            np.take(ring.arrays[f.name], flat, axis=0, out=dst, mode="clip")
    after = stamps[flat]
    ok = before == expected.ravel()
    ok &= after == before
    if ring.lanes == 1:
        base = int(ring.lane_table[0, LANE_BASE])
        cleared = None if lo is not None and lo >= base else first < base
    else:
        cleared = first < ring.lane_table[:, LANE_BASE].take(lane)
    if cleared is None or not cleared.any():
        if ok.all():
            return None
        return ok.reshape(rows.shape).all(axis=1)
    return ok.reshape(rows.shape).all(axis=1) & ~cleared


def sample_windows(ring: Ring, rng: np.random.Generator, n: int, length: int,
                   out: Sequence[np.ndarray], timeout: float) -> None:
    """Fill ``out`` (one array per field, in field order, shape ``(n * length, *shape)``)
    with ``n`` intact windows. ``ValueError`` if the buffer holds no such window."""
    lane, first, lo = _draw(ring, rng, n, length, None)
    if n == 0:
        return
    ok = _copy(ring, lane, first, length, lo, out)
    if ok is not None:
        _redraw(ring, rng, length, out, np.flatnonzero(~ok), time.monotonic() + timeout, timeout)


def _redraw(ring: Ring, rng: np.random.Generator, length: int, out: Sequence[np.ndarray],
            bad: np.ndarray, deadline: float, timeout: float) -> None:
    """Replace the windows at positions ``bad`` until all of them are intact."""
    shaped = [a.reshape((-1, length) + a.shape[1:]) for a in out]
    rounds, delay = 0, 0.0
    while len(bad):
        rounds += 1
        pool = None
        if rounds > _UNIFORM_ROUNDS:
            pool = _pool_or_raise(ring, length, deadline)
        if time.monotonic() >= deadline:
            raise SampleTimeout(
                f"could not copy {len(bad)} intact rows within {timeout:g} s: writers overwrite "
                "the ring faster than it can be read (capacity too small for the write rate?)")
        if pool is None and rounds > _UNIFORM_ROUNDS:
            time.sleep(delay)  # rows exist but are all still being written
            delay = min(max(delay * 2, 20e-6), 1e-3)
            continue
        lane, first, lo = _draw(ring, rng, len(bad), length, pool)
        tmp = [np.empty((len(bad) * length,) + a.shape[1:], a.dtype) for a in out]
        ok = _copy(ring, lane, first, length, lo, tmp)
        if ok is None:
            ok = np.ones(len(bad), bool)
        for dst, t in zip(shaped, tmp):
            dst[bad[ok]] = t.reshape((-1, length) + t.shape[1:])[ok]
        bad = bad[~ok]

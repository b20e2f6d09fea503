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

import itertools
import operator
import time
from typing import Any, Sequence

import numpy as np

from shmbuf.core import pool
from shmbuf.core.counters import S_REDRAWS, S_RETRIES
from shmbuf.core.layout import LANE_BASE, LANE_HEAD
from shmbuf.core.lock import LockTimeout
from shmbuf.core.read import Sampler, read
from shmbuf.core.ring import Ring
from shmbuf.core.layout import published

_UNIFORM_ROUNDS = 4

FAULTS = 0
"""Test switch of the pure-Python path, as ``set_faults`` is the native path's: bit 1
turns the stamp check of :func:`copy_windows` off (tests prove with it that a stress
test would see torn rows). Never set outside tests."""


def _check_enough(lo: list[int], head: list[int], length: int) -> None:
    """Raise the ValueError that says why no window of ``length`` rows can be drawn from
    the lane windows ``lo .. head``, if none can."""
    sizes = [h - l for l, h in zip(lo, head)]
    if max(sizes) >= length:
        return
    if sum(sizes) == 0:
        raise ValueError("cannot sample from an empty buffer: add rows first")
    raise ValueError(
        f"no lane holds {length} consecutive rows yet (the buffer holds {sum(sizes)} rows"
        + (f" over {len(sizes)} lanes" if len(sizes) > 1 else "")
        + f"); add more rows or ask for a length <= {max(sizes)}")


def draw_windows(ring: Ring, rng: np.random.Generator, n: int, length: int,
          pool: tuple[np.ndarray, np.ndarray] | None, only: int | None = None) -> tuple[Any, np.ndarray, Any]:
    """Draw ``n`` windows of ``length`` rows: their lane (an int for a single-lane ring,
    else an array), first sequence numbers, and for a pure-Python uniform draw the
    lowest sequence number it could draw from each lane (else None).

    Without ``pool``: uniform over the windows inside one snapshot of each lane's
    current rows (``ValueError`` if there are none, e.g. just after a clear).
    With ``pool`` (lanes, first sequence numbers of windows known to be published):
    uniform over those.
    """
    if pool is not None:
        pick = rng.integers(0, len(pool[0]), n)
        return pool[0][pick], pool[1][pick], None
    if only is not None:  # one lane's windows only
        lo, head = ring.window_lists()
        count = head[only] - lo[only] - length + 1
        if count <= 0:
            raise ValueError(f"lane {only} holds {head[only] - lo[only]} rows, fewer than a window of "
                             f"{length}; add more rows to it or ask for a shorter window")
        x = (rng.random(n) * count).astype(np.int64) + lo[only]
        return only, x, lo
    if ring.native is not None:  # the arithmetic below, in one call
        first, lane = np.empty(n, np.int64), np.empty(n, np.int64)
        if ring.native.draw(rng.random(n), length, first, lane):
            return lane, first, None
        undraw(rng, n)  # no window: the code below says why (or draws, if rows came meanwhile)
    lo, head = ring.window_lists()
    starts = [max(h - l - length + 1, 0) for l, h in zip(lo, head)]  # windows per lane
    total = sum(starts)
    if not total:
        _check_enough(lo, head, length)  # raises
    if ring.lanes == 1:
        x = (rng.random(n) * total).astype(np.int64)  # (as draw_in's, without the lanes)
        x += lo[0]
        return 0, x, lo
    lane, x = draw_in(rng, n, lo, starts)
    return lane, x, lo


def draw_in(rng: np.random.Generator, n: int, first: Sequence[int], sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``n`` draws uniform over the lanes' ranges ``first[i] .. first[i] + sizes[i]`` (Python
    ints, a total above 0): their lanes and sequence numbers. Position floor(u * total)
    of all ranges, in lane order: for uniform floats u as uniform as ``integers()``
    (bias below total / 2**53) and twice as fast. Every uniform draw of rows uses it."""
    x = (rng.random(n) * sum(sizes)).astype(np.int64)
    cum = list(itertools.accumulate(sizes))
    lane = np.array(cum).searchsorted(x, side="right")
    x += np.array([f - c + s for f, c, s in zip(first, cum, sizes)])[lane]  # less the lower lanes', from first
    return lane, x


_REWINDABLE = (np.random.PCG64, np.random.PCG64DXSM)  # (one 64-bit output per random())


def undraw(rng: np.random.Generator, n: int) -> None:
    """Take back the last ``rng.random(n)``: a refused call changes nothing, its
    generator included. PCG64 (numpy's default) steps back; any other generator is
    left as it is (the native draw refuses only when no window exists, and the
    pure-Python draw checks that before it draws)."""
    bits = rng.bit_generator
    if type(bits) in _REWINDABLE:
        kept = bits.state  # (the buffered 32 bits, which random() leaves and advance() clears)
        bits.advance((-n) % (1 << 128))
        back = bits.state
        back["has_uint32"], back["uinteger"] = kept["has_uint32"], kept["uinteger"]
        bits.state = back


def _rows(ring: Ring, lane: Any, first: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Slots and expected stamps of the rows of the windows (lane, first), flat
    (window after window)."""
    lc = ring.lane_capacity
    seq = first if length == 1 else (first[:, None] + np.arange(length)).ravel()
    rows = seq % lc
    if ring.lanes > 1:
        rows += lane * lc if length == 1 or np.ndim(lane) == 0 else (lane * lc).repeat(length)
    return rows, published(seq)


def published_windows(ring: Ring, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(lane, first sequence) of every window of ``length`` published rows (exact scan)."""
    lo, head = ring.window()
    lanes, firsts = [], []
    for lane in range(ring.lanes):
        seq = np.arange(lo[lane], head[lane])
        ok = ring.stamps[lane * ring.lane_capacity + seq % ring.lane_capacity] == published(seq)
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
    _check_enough(*ring.window_lists(), length)
    pool = published_windows(ring, length)
    if len(pool[0]) or ring.live_writers_in_flight():
        return pool if len(pool[0]) else None
    try:
        with ring.lock.hold(max(0.0, min(deadline - time.monotonic(), 0.05))):
            heads = ring.lane_table[:, LANE_HEAD].copy()
            if ring.live_writers_in_flight():
                return None
            _check_enough(*ring.window_lists(), length)
            pool = published_windows(ring, length)
            if len(pool[0]):
                return pool
            if not np.array_equal(heads, ring.lane_table[:, LANE_HEAD]):
                return None  # an owner (who takes no lock) wrote meanwhile: look again
    except LockTimeout:
        return None  # busy (a restore?): look again later
    raise ValueError(_none_published(ring, length))


def _none_published(ring: Ring, length: int) -> str:
    """Why no window of ``length`` published rows exists, given that none does and no
    live writer is in flight: nothing is published, or no run of published rows is that
    long (unpublished rows, reserved by writers that died or gave up, break the runs)."""
    lo, head = ring.window()
    longest = 0
    for lane in range(ring.lanes):
        seq = np.arange(lo[lane], head[lane])
        ok = ring.stamps[lane * ring.lane_capacity + seq % ring.lane_capacity] == published(seq)
        edges = np.flatnonzero(np.diff(np.concatenate(([0], ok.view(np.int8), [0]))))
        if len(edges):
            longest = max(longest, int((edges[1::2] - edges[::2]).max()))
    unpublished = int((head - lo).sum()) - int(published_windows(ring, 1)[0].size)
    if longest == 0:
        return ("the buffer has no published rows to sample: none of the rows it counts "
                f"({unpublished}) carries its published stamp, and no live writer is writing one "
                "(rows reserved by a writer that died or gave up stay so); add rows")
    return (f"no lane holds {length} consecutive published rows: the longest run of published rows is "
            f"{longest}, and {unpublished} rows the buffer counts carry no published stamp while no "
            f"live writer is writing one (rows reserved by a writer that died or gave up stay so); "
            f"ask for a length <= {longest} or add more rows")


def copy_windows(ring: Ring, lane: Any, first: np.ndarray, length: int, lo: Any,
                 out: Sequence[Any], per_row: bool = False, same: str | None = None,
                 skip: tuple[str, int] | None = None) -> np.ndarray | None:
    """Copy the windows (lane, first) of ``length`` rows into ``out``: one array per field
    (field order, the windows one after the other), or one such list per position in
    the window (``out[j]`` takes row ``j`` of every window); None for a field not
    wanted, whose stamps are checked all the same. Used by the core's samplers and by the capabilities built on it
    (episodes), so every copy out of a ring goes through this one check.

    A window is intact if every stamp named its row before and after the copy, and
    the window still starts at or after its lane's base (no clear() fell in between:
    a window drawn before a clear could otherwise join rows from both sides of it).
    ``lo`` (if not None) is a lower bound of ``first`` per lane: the common case is
    then a comparison per lane. Returns None if every window is intact, else a boolean mask of
    the intact ones (with ``per_row``: of the intact rows, ``(n, length)``, a row being
    intact on its own). Two filters for the capabilities that keep segments of rows
    (episodes): with ``same``, a row counts only if its value of that field (at most 8
    bytes) equals the window's first row's; with ``skip=(field, bits)``, a window (or
    its first row, per row) does not count if its first row's first byte of that field
    has any of ``bits``. Both look at values read between the two stamp reads. The
    native path does the same in C, with acquire loads. Writers wait while a large copy
    runs (:mod:`shmbuf.core.yielding`).
    """
    mark = ring.yielding.begin(len(first) * length)
    try:
        return _copy_windows(ring, lane, first, length, lo, out, per_row, same, skip)
    finally:
        ring.yielding.end(mark)


def _copy_windows(ring: Ring, lane: Any, first: np.ndarray, length: int, lo: Any,
                  out: Sequence[Any], per_row: bool, same: str | None,
                  skip: tuple[str, int] | None) -> np.ndarray | None:
    if ring.native is not None:
        if same is None and skip is None:
            mask = ring.native.gather(first, lane, length, out, per_row)
        else:
            mask = ring.native.gather(first, lane, length, out, per_row,
                                      -1 if same is None else ring.index[same],
                                      -1 if skip is None else ring.index[skip[0]], 0 if skip is None else skip[1])
        if mask is None:
            return None
        codes = np.frombuffer(mask, np.uint8)  # 1 intact, 0 torn, 2 to draw again (gather.c)
        mask = codes == 1
        _count_retries(ring, mask, len(codes) - int(np.count_nonzero(codes)))
        return mask.reshape(-1, length) if per_row else mask
    if out and isinstance(out[0], list):
        flat, scatter = by_position(ring, len(first), length, out)
        ok = _copy_windows(ring, lane, first, length, lo, flat, per_row, same, skip)
        scatter()
        return ok
    rows, expected = _rows(ring, lane, first, length)
    stamps = ring.stamps
    before = stamps[rows]
    block, packed, own = _scratch(ring, out)
    np.take(ring.rows, rows, axis=0, out=block, mode="clip")  # packed fields: whole rows
    for src, dst in packed:
        np.copyto(dst, src)
    for src, dst in own:
        np.take(src, rows, axis=0, out=dst, mode="clip")
    kept = filters(ring, rows, length, same, skip)  # on values read between the stamp reads
    if FAULTS & 1:  # (the tests' break_protection: the check switched off)
        ok = torn = np.ones(len(rows), bool)
    else:
        torn = stamps[rows] != before  # changed during the copy
        ok = ~torn & (before == expected)
    if kept is not None:
        ok &= kept
    bases = ring.lane_table[:, LANE_BASE].tolist()
    if lo is not None and all(map(operator.ge, lo, bases)):
        cleared = None  # every lane's lowest drawable row is still at or after its base
    elif per_row:
        cleared = (expected - 2) // 2 < (bases[0] if ring.lanes == 1 else
                                         np.array(bases)[lane if length == 1 else np.repeat(lane, length)])
    elif ring.lanes == 1:
        cleared = first < bases[0]
    else:
        cleared = first < np.array(bases)[lane]
    if per_row:
        if cleared is not None:
            ok &= ~cleared
        if ok.all():
            return None
        _count_retries(ring, ok, int(np.count_nonzero(torn & ~ok)))
        return ok.reshape(-1, length)
    if length > 1:
        ok = ok.reshape(-1, length).all(axis=1)
        torn = torn.reshape(-1, length).any(axis=1)
    if cleared is not None:
        ok &= ~cleared
    if ok.all():
        return None
    _count_retries(ring, ok, int(np.count_nonzero(torn & ~ok)))
    return ok


def _count_retries(ring: Ring, ok: np.ndarray, torn: int) -> None:
    """Count the copies that failed their check in the handle's stats slot: ``torn``
    of them were torn (a row changed during its copy), the others were not to be used
    for another reason (a row not yet published or no longer there, a sampler's filter,
    a clear() in between). Each is drawn again."""
    slot = ring.counters.slot
    slot[S_RETRIES] += torn
    slot[S_REDRAWS] += len(ok) - int(np.count_nonzero(ok)) - torn


def filters(ring: Ring, rows: np.ndarray, length: int, same: str | None,
            skip: tuple[str, int] | None) -> np.ndarray | None:
    """copy_windows' filters on the flat ``rows`` of windows of ``length``: a mask of the
    rows that count (None: no filter)."""
    if same is None and skip is None:
        return None
    kept = np.ones((len(rows) // length, length), bool)
    if same is not None:
        key = ring.arrays[same][rows].reshape(-1, length)
        kept &= key == key[:, :1]
    if skip is not None:
        flag = ring.arrays[skip[0]][rows[::length]].reshape(len(kept), -1).view(np.uint8)[:, 0]
        kept[:, 0] &= (flag & skip[1]) == 0
    return kept.ravel()


def by_position(ring: Ring, n: int, length: int,
                out: Sequence[Sequence[np.ndarray | None]]) -> tuple[list[Any], Any]:
    """For ``out`` given per window position: flat arrays to copy the windows into (one
    per field, None where no position wants it) and a function that then puts row
    ``j`` of every window into ``out[j]``."""
    flat = [None if all(pos[i] is None for pos in out) else np.empty((n * length,) + f.shape, f.dtype)
            for i, f in enumerate(ring.layout.fields)]

    def scatter() -> None:
        for j, pos in enumerate(out):
            for src, dst in zip(flat, pos):
                if dst is not None:
                    dst[...] = src.reshape((n, length) + src.shape[1:])[:, j]
    return flat, scatter


def _scratch(ring: Ring, out: Sequence[np.ndarray]) -> tuple[np.ndarray, list[Any], list[Any]]:
    """The pure-Python gather's scratch, per thread, reused while ``out`` is the same
    arrays: a private ``(rows, row_stride)`` block that takes whole packed rows, then
    (source, destination) pairs: each packed field's bytes in the block and in its
    output, as ``(rows,)`` opaque items (one copy a field), and each field of its own
    with its output."""
    memo = ring.scratch
    got = getattr(memo, "plan", None)
    if got is not None and len(got[0]) == len(out) and all(map(operator.is_, got[0], out)):
        return got[1]
    n, layout = next(len(a) for a in out if a is not None), ring.layout
    block = getattr(memo, "block", None)
    if block is None or len(block) != n:
        block = memo.block = np.empty((n, layout.row_stride), np.uint8)
    packed, own = [], []
    for f, dst in zip(layout.fields, out):
        if dst is None:
            continue
        if f.packed:
            at = f.offset - layout.rows_offset
            item = f"V{f.row_bytes}"
            packed.append((block[:, at:at + f.row_bytes].view(item)[:, 0],
                           dst.reshape(n, -1).view(item)[:, 0]))
        else:
            own.append((ring.arrays[f.name], dst))
    # (a batch of the pool is not kept: its memory is free again once the caller drops it)
    memo.plan = None if pool.owns(out) else (list(out), (block, packed, own))
    return block, packed, own


class Windows(Sampler):
    """Windows of ``length`` rows, uniformly over every lane's current windows (of lane
    ``only``, if given): the core's sampler, behind every uniform sample. The first few
    rounds draw uniformly over the lanes' windows; then over the exact set of published
    windows, so a ring mostly reserved by writers that died is still sampled uniformly
    over what is really there. A batch is one array per field, ``(m * length, *shape)``
    (the windows one after the other), and with ``index`` an int64 ``(m,)`` array last
    that gets each window's first slot."""

    hint = ": writers overwrite the ring faster than it can be read (capacity too small for the write rate?)"

    def __init__(self, ring: Ring, rng: np.random.Generator, length: int, only: int | None = None,
                 index: bool = False) -> None:
        self.ring, self.rng, self.length, self.only, self.index = ring, rng, length, only, index
        self.delay = 0.0

    def empty(self, m: int) -> list[np.ndarray]:
        specs = [((m * self.length,) + f.shape, f.dtype) for f in self.ring.layout.fields]
        return pool.empty(specs + [((m,), np.int64)] if self.index else specs)

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        pool = None
        if rounds > _UNIFORM_ROUNDS:
            pool = _pool_or_raise(self.ring, self.length, deadline)
            if pool is not None and self.only is not None:
                keep = pool[0] == self.only
                pool = (pool[0][keep], pool[1][keep]) if keep.any() else None
            if pool is None:  # rows exist but are all still being written
                time.sleep(self.delay)
                self.delay = min(max(self.delay * 2, 20e-6), 1e-3)
                return None
        return draw_windows(self.ring, self.rng, len(todo), self.length, pool, self.only)

    def gather(self, drawn: Any, out: list[np.ndarray]) -> np.ndarray | None:
        if drawn is None:
            return np.zeros(len(out[0]) // self.length, bool)
        lane, first, lo = drawn
        if self.index:
            lc = self.ring.lane_capacity
            out[-1][:] = lane * lc + first % lc
            out = out[:-1]
        return copy_windows(self.ring, lane, first, self.length, lo, out)

    def scatter(self, got: list[np.ndarray], src: np.ndarray, out: list[np.ndarray], dst: np.ndarray) -> None:
        k, last = self.length, len(out) - 1
        for i, (a, b) in enumerate(zip(got, out)):
            if k > 1 and not (self.index and i == last):  # (a field's arrays: k rows a position)
                a, b = a.reshape((-1, k) + a.shape[1:]), b.reshape((-1, k) + b.shape[1:])
            b[dst] = a[src]


def sample_windows(ring: Ring, rng: np.random.Generator, n: int, length: int,
                   out: Sequence[np.ndarray], timeout: float, only: int | None = None,
                   index: np.ndarray | None = None) -> None:
    """Fill ``out`` (one array per field, in field order, shape ``(n * length, *shape)``)
    with ``n`` intact windows (of lane ``only``, if given) through :func:`read` and
    :class:`Windows`. ``ValueError`` if the buffer (the lane) holds no such window.
    ``index`` (int64 ``(n,)``, if given) gets each window's first slot."""
    lane, first, lo = draw_windows(ring, rng, n, length, None, only)
    if n == 0:
        return
    if index is not None:
        index[:] = lane * ring.lane_capacity + first % ring.lane_capacity
    ok = copy_windows(ring, lane, first, length, lo, out)
    if ok is None:
        return  # the common case: one draw, one checked copy (read's first round, made here)
    read(Windows(ring, rng, length, only, index is not None), n, timeout,
         list(out) if index is None else [*out, index], todo=np.flatnonzero(~ok))

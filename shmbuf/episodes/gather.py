"""Reading an episode buffer's rows: named fields of chosen rows, stamp-checked, and
the raw reads that guide the samplers and counts (the only module of the episodes
that reads the ring's tables, beside the writer that numbers episodes in them).

Every sampler of the package reads rows through :func:`rows`, which calls the core's
:func:`shmbuf.core.gather.copy_windows` (the one torn-read check of the library) with
only the fields it needs, and :func:`stacks`, which builds frame stacks out of single
stored frames with the same check.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from shmbuf.core import gather
from shmbuf.core.ring import Ring
from shmbuf.core.layout import LANE_BASE, LANE_HEAD
from shmbuf.episodes.rows import FINAL
from shmbuf.core.layout import published


def rows(ring: Ring, lane: np.ndarray, seq: np.ndarray, want: Mapping[str, np.ndarray]) -> np.ndarray:
    """Copy rows ``seq`` (int64) of lanes ``lane`` (int64, same length) into ``want``
    ({field: array of len(seq) rows}, C-contiguous). The fields not named are not
    copied. Returns a bool mask: True where the row was intact (published, and the
    row it names, before and after the copy)."""
    if not len(seq):
        return np.ones(0, bool)
    outs = [want.get(f.name) for f in ring.layout.fields]
    ok = gather.copy_windows(ring, lane, np.ascontiguousarray(seq, np.int64), 1, None, outs)
    return np.ones(len(seq), bool) if ok is None else ok.copy()  # (the native mask is read-only)


def windows(ring: Ring, lane: np.ndarray, first: np.ndarray, want: Sequence[Mapping[str, np.ndarray]],
            per_row: bool = False) -> np.ndarray:
    """Copy the windows of ``len(want)`` rows starting at ``first``: row ``j`` of each
    window into ``want[j]`` ({field: array of len(first) rows}). Returns a bool mask of
    the windows that are intact rows of one episode, the first not a final row; with
    ``per_row``, ``(n, len(want))`` of the rows that are (a window may then run past its
    lane's newest row, or its episode's end)."""
    names = [f.name for f in ring.layout.fields]
    outs = [[pos.get(name) for name in names] for pos in want]
    ok = gather.copy_windows(ring, lane, first, len(want), None, outs, per_row,
                               same="_start", skip=("_flags", FINAL))
    if ok is None:
        return np.ones((len(first), len(want)) if per_row else len(first), bool)
    return ok.copy()


def stacks(ring: Ring, lane: np.ndarray, end: np.ndarray, start: np.ndarray, k: int,
           out: Mapping[str, np.ndarray]) -> np.ndarray:
    """Frame stacks: for each window, the ``k`` frames of rows ``end - k + 1 .. end`` of
    its lane into ``out`` ({field: (n, k, *frame)}), oldest first. Frames before the
    episode's first row (``start``) are zeros. Returns a bool mask of the windows whose
    needed frames were all intact rows of that episode (a frame evicted or being
    overwritten rejects the window: it is never replaced by zeros)."""
    n = len(end)
    seq = end[:, None] - np.arange(k - 1, -1, -1)        # oldest frame first
    need = seq >= start[:, None]                         # inside the episode
    first = np.empty(n * k, np.int64)
    want: dict[str, Any] = {name: a.reshape((n * k,) + a.shape[2:]) for name, a in out.items()}
    want["_start"] = first
    ok = rows(ring, lane.repeat(k), np.maximum(seq, 0).ravel(), want).reshape(n, k)
    good = ok & (first.reshape(n, k) == start[:, None])
    valid = (good | ~need).all(axis=1)
    if not need.all():
        for a in out.values():
            a[~need] = 0
    return valid


def last_rows(ring: Ring, lane: np.ndarray, end: np.ndarray, start: np.ndarray) -> np.ndarray:
    """The last published row at or after ``end`` (a row of the episode that starts at
    ``start``) of that episode: its final row, or for an episode in progress its newest
    published step. A binary search over raw reads, a guide only (the rows are then
    read with the stamp check): an episode's rows are contiguous, later episodes start
    later, and a lane's only unpublished rows are its newest (one writer owns it)."""
    if ring.native is not None:
        out = np.empty(len(end), np.int64)
        ring.native.last_rows(end, lane, start, ring.index["_start"], out)
        return out
    lc = ring.lane_capacity
    starts, stamps = ring.arrays["_start"], ring.stamps
    lo, hi = end.copy(), ring.lane_table[:, LANE_HEAD][lane] - 1  # invariant: row lo is in the episode
    while True:
        open_ = lo < hi
        if not open_.any():
            return lo
        mid = (lo + hi + 1) // 2
        slot = lane * lc + mid % lc
        inside = (stamps[slot] == published(mid)) & (starts[slot] == start)
        lo = np.where(open_ & inside, mid, lo)
        hi = np.where(open_ & ~inside, mid - 1, hi)


def continues(ring: Ring, lane: np.ndarray, seq: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Whether rows ``seq`` of ``lane`` are published rows of the episodes that start
    at ``start``, now (raw reads: a row written since a search ran shows here)."""
    slot = lane * ring.lane_capacity + seq % ring.lane_capacity
    return (ring.stamps[slot] == published(seq)) & (ring.arrays["_start"][slot] == start)


class Ends:
    """A handle's memo of where its ended episodes end, so that the samplers that need
    an episode's last row (hindsight goals) search for it once per episode, not once
    per draw: ``capacity`` entries (16 bytes each, made on first use), keyed by the
    slot of the episode's first row and checked against its sequence number (unique in
    a lane, so a hit is that very episode, ended for good). Only an end read intact
    (stamp before and after, of the episode, a final row) is remembered; episodes in
    progress are searched every time."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.start = np.full(ring.layout.capacity, -1, np.int64)
        self.last = np.zeros(ring.layout.capacity, np.int64)

    def last_rows(self, lane: np.ndarray, end: np.ndarray, start: np.ndarray) -> np.ndarray:
        """:func:`last_rows`, from the memo where it can."""
        ring, lc = self.ring, self.ring.lane_capacity
        key = lane * lc + start % lc
        hit = self.start[key] == start
        last = self.last[key]
        if hit.all():
            return last
        miss = np.flatnonzero(~hit)
        lane_m, start_m = lane[miss], start[miss]
        found = last_rows(ring, lane_m, end[miss], start_m)
        last[miss] = found
        slot = lane_m * lc + found % lc
        before = ring.stamps[slot]
        final = (ring.arrays["_flags"][slot] & FINAL) != 0
        final &= ring.arrays["_start"][slot] == start_m
        final &= (before == published(found)) & (ring.stamps[slot] == before)
        keep = key[miss][final]
        self.start[keep] = start_m[final]
        self.last[keep] = found[final]
        return last


# -- raw reads (guides, and counts exact while no writer runs) ---------------------

def per_lane(ring: Ring) -> list[tuple[int, int, int, int]]:
    """What an episode buffer holds, per lane: rows, episodes with rows, episodes with a
    transition, final rows (raw reads, exact while no writer runs; for
    :class:`shmbuf.episodes.EpisodeBuffer`'s counts)."""
    lo, head = ring.window_lists()
    eps, starts, flags = ring.arrays["_episode"], ring.arrays["_start"], ring.arrays["_flags"]
    lc = ring.lane_capacity
    out = []
    for lane in range(ring.lanes):
        rows = head[lane] - lo[lane]
        if rows == 0:
            out.append((0, 0, 0, 0))
            continue
        h = head[lane] - 1  # the newest published row (not one a writer is writing, or died in)
        while h > lo[lane] and ring.stamps[lane * lc + h % lc] != published(h) and head[lane] - h < 8:
            h -= 1
        unpublished = head[lane] - 1 - h
        first, last = lane * lc + lo[lane] % lc, lane * lc + h % lc
        n = max(int(eps[last]) - int(eps[first]) + 1, 0)
        live = n - bool(flags[first] & FINAL) - (not flags[last] & FINAL and starts[last] == h)
        finals = min(n, rows) - (not flags[last] & FINAL)  # (the episode of the newest row has none yet)
        out.append((rows - unpublished, min(n, rows), max(live, 0), max(finals, 0)))
    return out


def walk(ring: Ring, lane: int, lo: int, head: int, stop: int) -> tuple[list[tuple[int, int]], int]:
    """The complete episodes of ``lane`` whose final row is in ``[max(lo, stop), head)``,
    oldest first, and the row below which the lane is now fully indexed. A published row
    (its stamp the same before and after the reads) is trusted to say where its episode
    began, and the walk jumps there; any other row is stepped over one at a time."""
    lc = ring.lane_capacity
    stamps, starts, flags = ring.stamps, ring.arrays["_start"], ring.arrays["_flags"]
    found: list[tuple[int, int]] = []
    unpublished = None  # the lowest row stepped over
    h = head - 1
    floor = max(lo, stop)
    while h >= floor:
        slot = lane * lc + h % lc
        before = int(stamps[slot])
        s, f = int(starts[slot]), int(flags[slot])
        if before != published(h) or int(stamps[slot]) != before or not lo <= s <= h:
            h -= 1  # not published (being written, reserved by a dead writer): no guide
            unpublished = h + 1
            continue
        if f & FINAL and s < h:
            found.append((s, h))
        h = s - 1
    found.reverse()
    # indexed for good: below the lowest row stepped over, else up to the newest episode
    frontier = unpublished if unpublished is not None else found[-1][1] + 1 if found else stop
    return found, max(stop, frontier)


def any_transition(ring: Ring) -> bool:
    """Whether any published pair of rows is a transition (an exact scan; rare)."""
    lo, head = ring.window()
    lc = ring.lane_capacity
    for lane in range(ring.lanes):
        seq = np.arange(lo[lane], head[lane])
        slots = lane * lc + seq % lc
        ok = ring.stamps[slots] == published(seq)
        ep, fl = ring.arrays["_episode"][slots], ring.arrays["_flags"][slots]
        pair = ok[:-1] & ok[1:] & (ep[:-1] == ep[1:]) & ((fl[:-1] & FINAL) == 0)
        if pair.any():
            return True
    return False


def stamps(ring: Ring, lane: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """The stamps of rows ``seq`` of ``lane`` as read now (raw: a guide)."""
    return ring.stamps[lane * ring.lane_capacity + seq % ring.lane_capacity]


def bases(ring: Ring) -> list[int]:
    """Every lane's base (its first row since the last clear or restore)."""
    return ring.lane_table[:, LANE_BASE].tolist()

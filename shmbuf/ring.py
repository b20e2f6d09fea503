"""The ring: reserve slots, write them outside the lock, publish them with stamps.

The capacity is split into ``lanes`` equal rings (one by default). Each lane has a
``head``: how many rows were ever reserved in it. The row with lane sequence number
``s`` lives in slot ``s % lane_capacity``.

**Stamps.** Every slot has an int64 stamp that names the row it holds:

* ``0``         never written (or abandoned by a writer that failed half-way);
* ``2*s + 1``   row ``s`` is being written;
* ``2*s + 2``   row ``s`` is published: complete, and unchanged since.

A slot's stamp only ever grows (except the ``0`` of an abandoned write), so a reader
that sees ``2*s + 2`` both before and after copying a row copied exactly row ``s``
(a seqlock). "Is this window ``s .. s+L-1`` consecutive, in write order and
published?" is one vectorised comparison with ``2*(s + arange(L)) + 2``.

**Writing** (``Ring.reserve`` then ``Ring.write``):

1. Under the header lock: take an entry in the reservation table (who, lane, first
   sequence, count), then advance the lane's head. The head store is the commit:
   a writer killed before it reserved nothing; killed after it, its entry says which
   rows it owns.
2. Outside the lock: wait until every older row that lived in the same slots is
   finished (published, abandoned, or its writer is dead). This matters only when a
   tiny ring wraps onto a slow writer's rows. Waiting only ever goes to strictly older
   rows, so it cannot deadlock.
3. Stamp the slots odd, copy the data, stamp them even, free the entry.

**Memory ordering.** Stamps are written and read without the lock. This is correct
on x86-64 (total store order: stores become visible in program order, loads are not
reordered with loads) and relies on the compiler not moving memory accesses across
separate numpy calls, which it cannot see through. On weakly ordered CPUs (ARM64:
Graviton, Apple silicon) the torn-read check is best effort: the reservation itself is
still exact (it happens under the lock, whose system call is a full barrier).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import numpy as np

from . import procs
from .layout import (CONTROL_WORDS, LANE_BASE, LANE_CLAIM_CTIME, LANE_CLAIM_PID, LANE_HEAD,
                     RES_COUNT, RES_CTIME, RES_LANE, RES_PID, RES_START, TABLE_WIDTH, Layout)
from .lock import HeaderLock

HOOK: Callable[[str], None] | None = None
"""Test hook, called at "locked" (holding the lock, head advanced), "reserved" (lock
released, nothing written) and "writing" (slots stamped odd, data half copied)."""


_SUM_CHECK = 4096  # rows: int64 sums of stamps cannot overflow below ~1e15 rows written
_RAMP = np.arange(0, 2 * _SUM_CHECK, 2, dtype=np.int64)  # 0, 2, 4, ...: stamps of a run


def _stamp_run(stamps: np.ndarray, lo: int, hi: int, first_stamp: int) -> None:
    """stamps[lo:hi] = first_stamp, first_stamp + 2, ..."""
    if hi - lo <= _SUM_CHECK:
        np.add(_RAMP[:hi - lo], first_stamp, out=stamps[lo:hi])
    else:
        stamps[lo:hi] = np.arange(first_stamp, first_stamp + 2 * (hi - lo), 2)


class WriteTimeout(TimeoutError):
    """A write could not finish in time (another live writer holds the slots)."""


class Ring:
    """Typed views of one mapped layout, and the write protocol over them."""

    def __init__(self, layout: Layout, mem: Any, lock: HeaderLock) -> None:
        self.layout = layout
        self.lock = lock
        self.lane_capacity = layout.lane_capacity
        self.lanes = layout.lanes
        i8 = np.int64
        self.control = np.ndarray((CONTROL_WORDS,), i8, mem, layout.control_offset)
        self.lane_table = np.ndarray((layout.lanes, TABLE_WIDTH), i8, mem, layout.lanes_offset)
        self.lane_table_f = self.lane_table.view(np.float64)
        self.res = np.ndarray((layout.n_reservations, TABLE_WIDTH), i8, mem,
                              layout.reservations_offset)
        self.res_f = self.res.view(np.float64)
        self.res_pid = self.res[:, RES_PID]
        self.stamps = np.ndarray((layout.capacity,), i8, mem, layout.stamps_offset)
        self.arrays = {f.name: np.ndarray((layout.capacity,) + f.shape, f.dtype, mem, f.offset)
                       for f in layout.fields}
        self._hint = threading.local()

    # -- lane state ------------------------------------------------------------------

    def window(self) -> tuple[np.ndarray, np.ndarray]:
        """Per lane: ``(lo, head)``, the sequence numbers of the rows that count now."""
        head = self.lane_table[:, LANE_HEAD].copy()
        base = self.lane_table[:, LANE_BASE].copy()
        lo = np.maximum(np.minimum(base, head), head - self.lane_capacity)
        return lo, head

    def window1(self) -> tuple[int, int]:
        """:meth:`window` of a single-lane ring, as Python ints (the fast path)."""
        head, base = self.lane_table[0, LANE_HEAD:LANE_BASE + 1].tolist()
        return max(min(base, head), head - self.lane_capacity), head

    def size(self) -> int:
        lo, head = self.window()
        return int((head - lo).sum())

    # -- writing ---------------------------------------------------------------------

    def reserve(self, lane: int, n: int, timeout: float) -> tuple[int, int]:
        """Reserve ``n`` rows of ``lane``; returns (first sequence number, entry)."""
        pid, ctime = procs.identity()
        lock = self.lock
        lock.acquire(timeout)
        try:
            entry = self._free_entry()
            res = self.res
            head = int(self.lane_table[lane, LANE_HEAD])
            res[entry, RES_LANE] = lane
            res[entry, RES_START] = head
            res[entry, RES_COUNT] = n
            self.res_f[entry, RES_CTIME] = ctime
            res[entry, RES_PID] = pid  # the entry is valid from here
            self.lane_table[lane, LANE_HEAD] = head + n  # the reservation is committed here
            if HOOK is not None:
                HOOK("locked")
        finally:
            lock.release()
        return head, entry

    def write(self, lane: int, first: int, entry: int, sources: list[np.ndarray], n: int,
              timeout: float) -> None:
        """Copy ``sources`` (one array per field, in layout order: ``n`` rows each, or for
        ``n == 1`` one row without a row axis) into the reserved rows and publish them.
        Frees the entry whatever happens; waits at most ``timeout`` for older writers."""
        lc = self.lane_capacity
        base = lane * lc
        slot = first % lc
        k = min(n, lc - slot)  # rows before the end of the lane; the rest wrap to its start
        runs = [(base + slot, base + slot + k, 0)]
        if k < n:
            runs.append((base, base + n - k, k))
        stamps = self.stamps
        stamped = False
        try:
            if HOOK is not None:
                HOOK("reserved")
            if first + n > lc and not self._older_done(first, runs):
                self._wait_for_older(lane, first, n, entry, runs, time.monotonic() + timeout)
            if n == 1:
                row = base + slot
                stamps[row] = 2 * first + 1
                stamped = True
                for dest, src in zip(self.arrays.values(), sources):
                    dest[row] = src
                    if HOOK is not None:
                        HOOK("writing")
                stamps[row] = 2 * first + 2
            else:
                for lo, hi, off in runs:
                    _stamp_run(stamps, lo, hi, 2 * (first + off) + 1)
                stamped = True
                for dest, src in zip(self.arrays.values(), sources):
                    if k == n:  # no wrap: one copy of the whole source
                        dest[runs[0][0]:runs[0][1]] = src
                    else:
                        for lo, hi, off in runs:
                            dest[lo:hi] = src[off:off + hi - lo]
                    if HOOK is not None:
                        HOOK("writing")
                for lo, hi, off in runs:
                    _stamp_run(stamps, lo, hi, 2 * (first + off) + 2)
            stamped = False
        finally:
            if stamped:  # failed half-way: these rows will never be valid
                for lo, hi, _ in runs:
                    stamps[lo:hi] = 0
            self.res_pid[entry] = 0

    @staticmethod
    def _entry_alive(res: np.ndarray, i: int, cache: dict[tuple[int, float], bool]) -> bool:
        """Is the process that holds reservation entry ``i`` (of a copy ``res``) alive?"""
        who = (int(res[i, RES_PID]), float(res[i].view(np.float64)[RES_CTIME]))
        if who not in cache:
            cache[who] = procs.is_alive(*who)
        return cache[who]

    def _free_entry(self) -> int:
        """A free reservation entry (caller holds the lock)."""
        hint = getattr(self._hint, "entry", 0)
        if self.res_pid[hint] == 0:
            return hint
        free = np.flatnonzero(self.res_pid == 0)
        if len(free) == 0:  # reclaim entries of dead writers
            res, cache = self.res.copy(), {}
            for i in range(len(res)):
                if not self._entry_alive(res, i, cache):
                    self.res_pid[i] = 0
            free = np.flatnonzero(self.res_pid == 0)
            if len(free) == 0:
                raise RuntimeError(
                    f"more than {len(self.res_pid)} writes are in flight at once on this buffer; "
                    "use fewer writer threads/processes")
        self._hint.entry = int(free[0])
        return self._hint.entry

    def _older_done(self, first: int, runs: list[tuple[int, int, int]]) -> bool:
        """True if each slot holds the published row it held one lap before ours.

        A slot's stamp is never above that of the row it held a lap before ours (newer
        writers wait for older ones), so for runs of up to ``_SUM_CHECK`` rows "every
        stamp equals its expected value" is "the stamps add up to the expected sum":
        one reduction instead of building and comparing an array.
        """
        lc = self.lane_capacity
        stamps = self.stamps
        if len(runs) == 1 and runs[0][1] - runs[0][0] == 1:  # one row: a scalar check
            return first < lc or stamps[runs[0][0]] == 2 * (first - lc) + 2
        for lo, hi, off in runs:
            prev = first + off - lc
            if prev + (hi - lo) <= 0:
                continue  # first lap: nobody wrote these slots before
            if prev < 0:  # partly first lap
                lo, prev = lo - prev, 0
            m = hi - lo
            if m <= _SUM_CHECK:
                if int(stamps[lo:hi].sum()) != m * (2 * prev + 2) + m * (m - 1):
                    return False
            elif not np.array_equal(stamps[lo:hi], np.arange(2 * prev + 2, 2 * (prev + m) + 1, 2)):
                return False
        return True

    def _wait_for_older(self, lane: int, first: int, n: int, entry: int,
                        runs: list[tuple[int, int, int]], deadline: float) -> None:
        """Block until no live writer still owns a row older than ours in our slots.
        (The caller has seen that the fast check, :meth:`_older_done`, fails.)"""
        lc = self.lane_capacity
        lo_seq, hi_seq = first - lc, first + n - lc  # the rows our slots held a lap ago
        delay = 0.0
        alive: dict[tuple[int, float], bool] = {}
        while True:
            res = self.res.copy()
            older = ((res[:, RES_PID] != 0) & (res[:, RES_LANE] == lane) & (res[:, RES_START] < hi_seq)
                     & (res[:, RES_START] + res[:, RES_COUNT] > lo_seq))
            older[entry] = False
            blockers = [int(res[i, RES_PID]) for i in np.flatnonzero(older)
                        if self._entry_alive(res, i, alive)]
            if not blockers or self._older_done(first, runs):
                return
            if time.monotonic() >= deadline:
                raise WriteTimeout(
                    f"rows {first}..{first + n - 1} of lane {lane} could not be written: "
                    f"process(es) {sorted(set(blockers))} are still writing the rows these "
                    "slots held one lap ago (a ring this small wraps faster than they write). "
                    "Use a larger capacity, or pass a larger timeout=")
            time.sleep(delay)
            delay = min(max(delay * 2, 20e-6), 1e-3)

    def live_writers_in_flight(self) -> bool:
        """True if some live process has rows reserved and not yet published."""
        res, cache = self.res.copy(), {}
        return any(self._entry_alive(res, i, cache) for i in np.flatnonzero(res[:, RES_PID] != 0))

    # -- lanes -----------------------------------------------------------------------

    def claim(self, lane: int | None, timeout: float) -> int:
        """Claim a free lane (or the given one) for the calling process."""
        pid, ctime = procs.identity()
        table, table_f = self.lane_table, self.lane_table_f
        with self.lock.hold(timeout):
            candidates = range(self.lanes) if lane is None else [lane]
            for i in candidates:
                owner = int(table[i, LANE_CLAIM_PID])
                if owner == 0 or not procs.is_alive(owner, float(table_f[i, LANE_CLAIM_CTIME])):
                    table_f[i, LANE_CLAIM_CTIME] = ctime
                    table[i, LANE_CLAIM_PID] = pid
                    return i
        if lane is None:
            raise RuntimeError(
                f"all {self.lanes} lanes are claimed by live processes; create the buffer with "
                "more lanes, or release a lane (Buffer.release_lane) in a writer that is done")
        raise RuntimeError(f"lane {lane} is claimed by live process {int(table[lane, LANE_CLAIM_PID])}")

    def release(self, lane: int, timeout: float) -> None:
        with self.lock.hold(timeout):
            if int(self.lane_table[lane, LANE_CLAIM_PID]) == procs.identity()[0]:
                self.lane_table[lane, LANE_CLAIM_PID] = 0

    def clear(self, timeout: float) -> None:
        """Forget every row. Sequence numbers keep growing, so writers in flight stay safe."""
        with self.lock.hold(timeout):
            self.lane_table[:, LANE_BASE] = self.lane_table[:, LANE_HEAD]

"""Counters every handle keeps in the segment, readable from any process (``stats()``,
``shmbuf stat``/``watch``).

A region of the segment holds, besides a small head (``fold_seq``, and the staleness of
the rows sampled by version: rows, sum, max)::

    lanes    per lane: pid and start time of its last writer, time of its last write
    slots    NSLOTS x [pid, start time, batches sampled, rows sampled, torn-read
             retries, lock acquisitions, nanoseconds waited for the lock, writes,
             redraws (copies drawn again for a reason other than a torn read)]

Each process **claims a slot of its own** when its first handle opens (under the header
lock, once; its later handles share it), so its counters are plain stores that no other
process touches: no lock and no atomic operation on the hot path (a few nanoseconds in
C, about 0.1 us in Python). The slot stays the process's until it exits, however many
handles it opens and drops; then the next claimer folds its counts into slot 0 (the
retired counts) and reuses it. When all slots are taken by live processes, further
processes share slot 0, whose increments may then lose a count now and then
(documented: the counts are diagnostics). Threads of one process share its slot the same
way.
Rows inserted are the lanes' heads (exact, already there). Folding bumps ``fold_seq``
(odd while folding) so that a reader never counts a slot twice.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from shmbuf.core import procs

REGION = "stats"
NSLOTS = 64
HEAD_WORDS, LANE_WORDS, SLOT_WORDS = 8, 4, 9
H_FOLD, H_STALE_ROWS, H_STALE_SUM, H_STALE_MAX = 0, 1, 2, 3
L_PID, L_CTIME, L_TIME = 0, 1, 2
S_PID, S_CTIME, S_BATCHES, S_ROWS, S_RETRIES, S_LOCKS, S_LOCK_NS, S_WRITES, S_REDRAWS = range(9)
COUNTERS = {"batches_sampled": S_BATCHES, "rows_sampled": S_ROWS, "torn_read_retries": S_RETRIES,
            "lock_acquisitions": S_LOCKS, "lock_wait_ns": S_LOCK_NS, "writes": S_WRITES,
            "redraws": S_REDRAWS}


def region_bytes(lanes: int) -> int:
    return 8 * (HEAD_WORDS + LANE_WORDS * lanes + SLOT_WORDS * NSLOTS)


class Counters:
    """A handle's views on the stats region, and its own slot (``self.slot``: a private
    array until it claims one, or for a buffer made without the region)."""

    def __init__(self, layout: Any, mem: Any) -> None:
        off, size = layout.regions.get(REGION, (0, 0))
        self.present = size == region_bytes(layout.lanes)
        self.slot: Any = memoryview(np.zeros(SLOT_WORDS, np.int64))  # (a memoryview: cheap += from Python)
        self.index = -1  # the slot claimed (-1: none; 0: the shared one)
        self.offset = -1  # its byte offset in the segment (for the native path)
        if not self.present:
            return
        self.head = np.ndarray((HEAD_WORDS,), np.int64, mem, off)
        off += 8 * HEAD_WORDS
        self.lanes = np.ndarray((layout.lanes, LANE_WORDS), np.int64, mem, off)
        self.lanes_f = self.lanes.view(np.float64)
        self.lanes_offset = off
        off += 8 * LANE_WORDS * layout.lanes
        self.slots = np.ndarray((NSLOTS, SLOT_WORDS), np.int64, mem, off)
        self.slots_f = self.slots.view(np.float64)
        self.slots_offset = off

    def claim(self, lock: Any, timeout: float) -> None:
        """Take a free slot, or one whose process died (folding its counts into slot 0).
        The slot is chosen without the lock (liveness checks take time) and taken under
        it only if it is still as seen, so the lock is held for a few stores. Slot 0,
        shared, if none is free or the lock is not had within ``timeout``."""
        if not self.present:
            return
        pid, ctime = procs.identity()
        mine = np.flatnonzero(self.slots[1:, S_PID] == pid)
        for i in (mine + 1).tolist():  # this process has one already: its handles share it
            if abs(float(self.slots_f[i, S_CTIME]) - ctime) <= 0.005:
                self._use(i)
                return
        for _ in range(3):  # another process may take the chosen slot first
            seen = self._candidate()
            if seen is None:
                break
            i, owner, owner_ctime = seen
            try:
                with lock.hold(timeout):
                    if int(self.slots[i, S_PID]) != owner or float(self.slots_f[i, S_CTIME]) != owner_ctime:
                        continue
                    if owner:
                        self._fold(i)
                    self.slots[i, S_PID:] = 0
                    self.slots_f[i, S_CTIME] = ctime
                    self.slots[i, S_PID] = pid
                    self._use(i)
                    return
            except (TimeoutError, OSError, ValueError):
                break
        self._use(0)

    def _candidate(self) -> tuple[int, int, float] | None:
        """(slot, its pid, its start time) of a free slot, else of one whose process is
        dead; None if every slot is held by a live process. Read without the lock."""
        pids = self.slots[1:, S_PID].copy()
        free = np.flatnonzero(pids == 0)
        if len(free):
            return int(free[0]) + 1, 0, float(self.slots_f[int(free[0]) + 1, S_CTIME])
        for i in range(1, NSLOTS):
            owner, owner_ctime = int(self.slots[i, S_PID]), float(self.slots_f[i, S_CTIME])
            if owner and not procs.is_alive(owner, owner_ctime):
                return i, owner, owner_ctime
        return None

    def _use(self, i: int) -> None:
        self.index = i
        self.slot = memoryview(self.slots[i])
        self.offset = self.slots_offset + 8 * SLOT_WORDS * i

    def _fold(self, i: int) -> None:
        """Add slot ``i``'s counts to slot 0 and empty it (lock held)."""
        self.head[H_FOLD] += 1  # odd: readers retry
        self.slots[0, S_BATCHES:] += self.slots[i, S_BATCHES:]
        self.slots[i, S_BATCHES:] = 0
        self.slots[i, S_PID] = 0
        self.head[H_FOLD] += 1

    def release(self) -> None:
        """This handle stops counting. The slot stays its process's (other handles of
        the process may share it) until the process has exited; then the next claimer
        folds its counts into slot 0 and reuses it."""
        self.slot = memoryview(np.zeros(SLOT_WORDS, np.int64))
        self.index = self.offset = -1

    def sampled(self, n: int) -> None:
        s = self.slot
        s[S_BATCHES] += 1
        s[S_ROWS] += n

    def stale(self, newest: int, versions: np.ndarray) -> None:
        """Rows of these versions were sampled by version, staleness ``newest - version``
        (negative for a row newer than the version a sample counted from): shared
        words, stored without the lock, so processes that sample at the same instant may
        lose a count now and then (diagnostics, as the shared slot's)."""
        n = len(versions)
        if self.present and n:
            h = self.head
            h[H_STALE_ROWS] += n
            h[H_STALE_SUM] += n * newest - int(versions.sum())
            h[H_STALE_MAX] = max(int(h[H_STALE_MAX]), newest - int(versions.min()))

    def staleness(self) -> dict[str, Any] | None:
        """``{"rows", "mean", "max"}`` of the rows sampled by version (None: none yet)."""
        rows = int(self.head[H_STALE_ROWS]) if self.present else 0
        if not rows:
            return None
        return {"rows": rows, "mean": int(self.head[H_STALE_SUM]) / rows, "max": int(self.head[H_STALE_MAX])}

    def wrote(self, lane: int) -> None:
        """A write to ``lane`` was published (the Python path; the native one does the
        same in C)."""
        self.slot[S_WRITES] += 1
        if self.present:
            pid, ctime = procs.identity()
            row, rowf = self.lanes[lane], self.lanes_f[lane]
            row[L_PID] = pid
            rowf[L_CTIME] = ctime
            rowf[L_TIME] = time.time()

"""What a buffer in a file keeps across a restart of the machine: ``flush`` and recovery.

While the machine runs, a buffer file is exactly as safe as a ``/dev/shm`` segment:
its pages live in the page cache, which every process maps, so processes killed at any
instant lose nothing that was published, and the usual protocol (stamps, dead writers'
lanes, the priority trees' version) repairs the rest. What a **restart** (a power loss,
a kernel crash, a reboot) keeps is what had reached the disk, and the kernel writes
pages back in no particular order. So:

**flush** (:func:`flush`), a durability point:

1. Under the header lock, per lane, the *frontier*: the first row not yet published
   (the oldest row a live writer still holds, else the head). Every row below it is
   complete.
2. Write every changed page of the file to the disk and wait (``msync`` + ``fsync``).
3. Under the lock, record the frontiers in the lane table (``LANE_FLUSHED``) and count
   the flush; then write the header pages to the disk and wait again.

The record is on the disk only after the rows it vouches for.

**The horizon** (:class:`Horizon`). The kernel may write a row's pages back before the
head that reserved it, so after a power loss the head on the disk may not cover every
write whose bytes reached the disk. A buffer file therefore keeps per lane a *horizon*
``R`` (a region, two words: on the disk, usable), and no write reserves past the usable
one (both write paths check it where they check the head, and leave the rest to Python).
To move it, under the lock: the new value is stored in the first word, that page is
written to the disk and waited for (``msync``), and only then is it stored in the
second. So the ``R`` on the disk is past every row any write could have touched. It
moves to ``lane_capacity // 16`` rows past the write that needs it (more for a lane
written fast: see :class:`Horizon`): an ``msync`` of one page per sixteenth of a lane
written, or about every 10 ms at most.

**Recovery** (:func:`recover`), on the first open after the machine restarted (the
header keeps the boot id of the boot that last opened it): under the lock, each lane is
rolled back to its flush frontier ``F``. Rows from ``F`` on are dropped (their stamps
zeroed), and so are the rows whose slots later writes may have reused: those below
``max(H, R) - lane_capacity``, ``H`` and ``R`` the head and horizon on the disk. A
buffer with ragged fields keeps a second horizon per lane, in bytes of its arena, moved
the same way (:meth:`shmbuf.core.arena.Arena.reserve`): the rows whose records later
writes may have covered (``pos`` below that horizon on the disk, minus the lane's
arena) are dropped too, and the arena's head starts again from that horizon. What is
left are the rows the stamps show as published in ``[max(H, R) - lane_capacity, F)``:
each was whole on the disk at the flush, and nothing has touched its slot since. The
reservation table, lane claims and owners' writes in flight (all of processes of the
previous boot) are cleared. The price: besides the rows written after the flush and
those they overwrote, a restart loses up to the horizon's lead more of a lane's oldest
rows: a sixteenth of the lane, or what it wrote in about 10 to 20 ms if that is more (at
most half the lane).
"""

from __future__ import annotations

import fcntl
import time
import uuid

import numpy as np

from shmbuf.core import procs
from shmbuf.core.deadline import Deadline
from shmbuf.core.layout import (CTRL_BOOT, CTRL_FLUSHED_AT, CTRL_FLUSHES, LANE_BASE, LANE_CLAIM_CTIME, LANE_CLAIM_PID,
                     LANE_FLUSHED, LANE_HEAD, LANE_OWN_COUNT, LANE_OWN_START, MAX_SEQ, RES_CTIME, RES_LANE,
                     RES_PID, RES_START, Layout, published)
from shmbuf.core.segment import FormatError
from shmbuf.core.tables import QueueFull

REGION = "horizon"
"""The region of a buffer file that holds its lanes' horizons (int64 ``(lanes, 2)``)."""


def region_bytes(lanes: int) -> int:
    return 16 * lanes


def horizon(layout: Layout, mem, name: str) -> np.ndarray | None:
    """The ``(lanes, 2)`` horizon words of a buffer file (None for a segment): checked,
    since the file is untrusted (``0 <= usable <= on disk <= MAX_SEQ``)."""
    off, size = layout.regions.get(REGION, (0, -1))
    if size == -1:
        return None
    if size != region_bytes(layout.lanes) or off % 8:
        raise FormatError(f"buffer {name!r}: its horizon region ({size} bytes) is not the one its lanes need")
    h = np.ndarray((layout.lanes, 2), np.int64, mem, off)
    if not ((0 <= h[:, 1]) & (h[:, 1] <= h[:, 0]) & (h[:, 0] <= MAX_SEQ)).all():
        raise FormatError(f"buffer {name!r}: its horizon words {h.tolist()} are not ones shmbuf writes")
    return h


class Lead:
    """How far a horizon moves past the write that needs it, per lane: ``low``, doubled
    (up to ``high``) each time this process moves the same lane again within ``FAST``
    seconds, halved back otherwise: a fast writer pays an ``msync`` about every 10 ms."""

    FAST = 0.01  # seconds

    def __init__(self, low: int, high: int, lanes: int) -> None:
        self.low, self.high = low, high
        self.lead = [low] * lanes
        self.last = [-1.0] * lanes

    def next_lead(self, lane: int) -> tuple[int, float]:
        """The lead of this process's next move of ``lane``, and now (pass both to
        :meth:`moved` once it moved)."""
        now = time.monotonic()
        fast = now - self.last[lane] < self.FAST
        return (min(self.lead[lane] * 2, self.high) if fast else max(self.lead[lane] // 2, self.low)), now

    def moved(self, lane: int, lead: int, now: float) -> None:
        self.lead[lane], self.last[lane] = lead, now


class Horizon(Lead):
    """``ring.reach`` of a buffer file: moves a lane's horizon past a write of ``n`` rows
    at its head, on the disk first, then usable (see the module).

    The lead it gives is ``lane_capacity // 16`` rows, doubled (up to half a lane) each
    time this process moves the same lane again within 10 ms, halved back otherwise: a
    fast writer of a small lane pays an ``msync`` about every 10 ms, not every sixteenth
    of a lap."""

    def __init__(self, ring, seg) -> None:
        lc = ring.lane_capacity
        super().__init__(max(lc // 16, 1), max(lc // 2, 1), ring.lanes)
        self.ring, self.seg = ring, seg
        self.off = ring.layout.regions[REGION][0]

    def __call__(self, lane: int, n: int, timeout: float) -> None:
        ring, h = self.ring, self.ring.horizon
        lead, now = self.next_lead(lane)
        lock = ring.lock
        lock.acquire(timeout)
        try:
            need = int(ring.lane_table[lane, LANE_HEAD]) + n
            if int(h[lane, 1]) < need:
                top = MAX_SEQ
                if ring.bounded:  # a queue: never past its room (recovery drops rows below R - lc)
                    top = int(ring.lane_table[lane, LANE_BASE]) + ring.lane_capacity
                    if need > top:
                        raise QueueFull(lane)  # (the write waits for room, then comes back)
                advance(self.seg, h[lane], self.off + 16 * lane, min(need + lead, top))
                self.moved(lane, lead, now)
        finally:  # lock.release(), inlined: a Python call could take a Ctrl-C first (it is on
            try:  # the write path, where an interrupt storm must never leave the lock held)
                fcntl.flock(lock.held_fd, fcntl.LOCK_UN)
            finally:
                lock.busy[0] = 0
                lock.thread_lock.release()


def advance(seg, words: np.ndarray, offset: int, new: int) -> None:
    """Move a horizon (``words``: on the disk, usable; at byte ``offset`` of the file) to
    ``new``: stored in the first word, written to the disk and waited for, and only then
    stored in the second (caller holds the lock)."""
    words[0] = new
    seg.sync(offset, offset + 16)
    words[1] = new


_boot: int | None = None


def boot_id() -> int:
    """A nonzero int64 naming this boot of the machine (0 where it cannot be told)."""
    global _boot
    if _boot is None:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                _boot = int.from_bytes(uuid.UUID(f.read().strip()).bytes[:8], "little", signed=True) or 1
        except (OSError, ValueError):
            _boot = 0
    return _boot


def frontier(ring) -> np.ndarray:
    """Per lane, the first row not yet published (caller holds the lock). The head is
    read before the owners' words: an owner stores them before it moves the head."""
    lt = ring.lane_table
    front = lt[:, LANE_HEAD].copy()
    own = lt[:, [LANE_OWN_COUNT, LANE_OWN_START]].copy()
    busy = own[:, 0] > 0
    front[busy] = np.minimum(front[busy], own[busy, 1])
    res = ring.res.copy()
    alive = procs.Liveness()
    for i in np.flatnonzero(res[:, RES_PID] != 0).tolist():
        if alive(int(res[i, RES_PID]), float(ring.res_f[i, RES_CTIME])):
            lane = int(res[i, RES_LANE])
            front[lane] = min(front[lane], int(res[i, RES_START]))
    return front


def flush(ring, seg, timeout: float, keep=None) -> np.ndarray:
    """Make every row published before the call durable (see the module); returns the
    frontiers recorded. A no-op returning the heads for a ``/dev/shm`` segment.

    ``timeout`` bounds the two waits for the header lock, one deadline for both (the
    second gets what the first and the disk write left, at least ``LOCK_FLOOR``); the
    writes to the disk themselves are not interrupted. ``keep()``: called with the
    frontiers, under the lock (a queue's snapshot of its words, :mod:`shmbuf.queue.restart`)."""
    deadline = Deadline(timeout)
    with ring.lock.hold(deadline.left()):
        front = frontier(ring)
        if keep is not None:
            keep()
    if not seg.durable:
        return front
    seg.sync()
    with ring.lock.hold(deadline.left()):
        lt = ring.lane_table
        lt[:, LANE_FLUSHED] = front  # (a racing flush may record older frontiers: all on disk)
        ring.control[CTRL_FLUSHES] += 1
        ring.control.view(np.float64)[CTRL_FLUSHED_AT] = time.time()
    seg.sync(0, ring.layout.rows_offset)
    return front


def recover(ring, timeout: float, rolled_back=None) -> bool:
    """On the first open of a buffer file after a restart of the machine, roll it back to
    its last flush (see the module), then call ``rolled_back()`` under the same lock (a
    queue's words, :mod:`shmbuf.queue.restart`); True if it did."""
    boot = boot_id()
    control = ring.control
    if boot == 0 or int(control[CTRL_BOOT]) == boot:
        return False
    with ring.lock.hold(timeout):
        before = int(control[CTRL_BOOT])
        if before == boot:
            return False  # another process did it meanwhile
        if before != 0:  # 0: new, never opened before
            rollback(ring)
            if rolled_back is not None:
                rolled_back()
        control[CTRL_BOOT] = boot
    return before != 0


def rollback(ring) -> None:
    """Keep, per lane, only the rows the disk can vouch for (caller holds the lock)."""
    lt, lc, h = ring.lane_table, ring.lane_capacity, ring.horizon
    for lane in range(ring.lanes):
        head = int(lt[lane, LANE_HEAD])
        front = min(int(lt[lane, LANE_FLUSHED]), head)
        reach_ = head if h is None else max(head, int(h[lane, 0]))  # no write went past it
        oldest = max(reach_ - lc, 0)  # below it, later writes may have reused the slot
        if ring.records is not None:  # (ragged rows: and below this one, their records' bytes)
            oldest = ring.records.recover(lane, oldest, front)
        stamps = ring.stamps[lane * lc:(lane + 1) * lc]
        keep = (stamps % 2 == 0) & (stamps >= published(oldest)) & (stamps <= published(front - 1))
        stamps[np.flatnonzero(~keep)] = 0
        lt[lane, LANE_HEAD] = front
        lt[lane, LANE_BASE] = min(max(int(lt[lane, LANE_BASE]), oldest), front)
        lt[lane, LANE_FLUSHED] = front
        lt[lane, LANE_OWN_COUNT] = 0
        lt[lane, LANE_CLAIM_PID] = 0
        lt[lane, LANE_CLAIM_CTIME] = 0
        if h is not None:
            h[lane, 1] = h[lane, 0]
    ring.res[:, RES_PID] = 0

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
3. Under the lock, record the frontiers in the lane table (``LANE_FLUSHED``), count the flush, then write and wait for the header pages again.

The record is on the disk only after the rows it vouches for.

**Recovery** (:func:`recover`), on the first open after the machine restarted (the
header keeps the boot id of the boot that last opened it): under the lock, each lane is
rolled back to its flush frontier ``F``. Rows from ``F`` on are dropped (their stamps
zeroed). So are the rows whose slots the head on the disk, ``H``, says later writes
reused (rows below ``H - lane_capacity``). What is left are the rows the stamps on disk
show as published in ``[H - lane_capacity, F)``. The reservation table, lane claims and
owners' writes in flight (all of processes of the previous boot) are cleared.

**Limit.** A write after the flush that reused the slot of a flushed row, with the
power lost before the head that reserved it reached the disk, can leave that slot with
some pages new and its stamp old, and the recovery cannot see it. Only the oldest rows
of a lane that wrapped since the last flush are exposed; flushing more often narrows
that, it cannot close it. (A kill of processes, however many, never exposes anything:
the page cache survives it.)
"""

from __future__ import annotations

import time
import uuid

import numpy as np

from . import procs
from .layout import (CTRL_BOOT, CTRL_FLUSHED_AT, CTRL_FLUSHES, LANE_BASE, LANE_CLAIM_CTIME, LANE_CLAIM_PID,
                     LANE_FLUSHED, LANE_HEAD, LANE_OWN_COUNT, LANE_OWN_START, RES_CTIME, RES_LANE, RES_PID,
                     RES_START, published)

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


def flush(ring, seg, timeout: float) -> np.ndarray:
    """Make every row published before the call durable (see the module); returns the
    frontiers recorded. A no-op returning the heads for a ``/dev/shm`` segment."""
    with ring.lock.hold(timeout):
        front = frontier(ring)
    if not seg.durable:
        return front
    seg.sync()
    with ring.lock.hold(timeout):
        lt = ring.lane_table
        lt[:, LANE_FLUSHED] = front  # (a racing flush may record older frontiers: all on disk)
        ring.control[CTRL_FLUSHES] += 1
        ring.control.view(np.float64)[CTRL_FLUSHED_AT] = time.time()
    seg.sync(header=ring.layout.rows_offset)
    return front


def recover(ring, timeout: float) -> bool:
    """On the first open of a buffer file after a restart of the machine, roll it back to
    its last flush (see the module); True if it did."""
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
        control[CTRL_BOOT] = boot
    return before != 0


def rollback(ring) -> None:
    """Keep, per lane, only the rows the disk can vouch for (caller holds the lock)."""
    lt, lc = ring.lane_table, ring.lane_capacity
    for lane in range(ring.lanes):
        head = int(lt[lane, LANE_HEAD])
        front = min(int(lt[lane, LANE_FLUSHED]), head)
        oldest = max(head - lc, 0)  # below it, later writes reused the slot
        stamps = ring.stamps[lane * lc:(lane + 1) * lc]
        keep = (stamps % 2 == 0) & (stamps >= published(oldest)) & (stamps <= published(front - 1))
        stamps[np.flatnonzero(~keep)] = 0
        lt[lane, LANE_HEAD] = front
        lt[lane, LANE_BASE] = min(max(int(lt[lane, LANE_BASE]), oldest), front)
        lt[lane, LANE_FLUSHED] = front
        lt[lane, LANE_OWN_COUNT] = 0
        lt[lane, LANE_CLAIM_PID] = 0
        lt[lane, LANE_CLAIM_CTIME] = 0
    ring.res[:, RES_PID] = 0

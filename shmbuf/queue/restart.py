"""A queue in a buffer file across a restart of the machine (part of
:mod:`shmbuf.queue.protocol`; see :mod:`shmbuf.core.durable` for the rows).

The queue's words (its position per lane, its take table, its counts) and its redo
journal span several pages, and the kernel writes pages back in no order: after a power
loss the disk may hold the journal's count and word numbers of one change with the
values of an older one, or a lane's position without the entry of the take that moved
it. Replayed, such a journal writes values into the wrong words; a torn take table
loses the rows of a take in flight. So neither is trusted after a restart:

* **Each flush keeps a snapshot** of the words (:meth:`Kept.keep`), taken under the
  header lock with the flush's frontiers, in the older of two slots, each with a
  generation number and a checksum; the flush then writes it to the disk with the rows.
* **Recovery** (:func:`recover`, with the lanes rolled back) takes the newest slot whose
  checksum holds: one moment's words, the take table with the position it goes with. A
  slot newer than the frontiers on the disk (a flush cut short) is as safe as its own
  (its rows beyond them are dropped, its entries cut to what is left). The journal is
  dropped. Positions below a lane's base move up to it (the rows below it were delivered
  after the snapshot), entries are cut to the lane's rows from base to head, and takes in
  flight give their rows back. Rows a take delivered after the snapshot come again;
  stale rows it passed over after it come back not yet taken (a take with the same bound
  passes over them again; one of a lower bound, or none, delivers them).
* Without a slot that holds (a file made before this snapshot, or flushes cut short
  twice over), every lane starts again from its base: every row not yet taken is
  delivered, and so are rows taken above the base.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable

import numpy as np

from shmbuf.core.layout import LANE_BASE, LANE_HEAD
from shmbuf.queue.takes import E_COUNT, E_LANE, E_START, E_STATE, FREE, RETURNED, TAKING, words

REGION = "queue_flushed"
"""The region of a queue in a buffer file that holds the snapshots of its words."""


def region_bytes(lanes: int) -> int:
    """Two slots of the queue's words (:func:`~shmbuf.queue.takes.words`), each with a
    generation number and a checksum."""
    return 16 * (words(lanes) + 2)


def _checksum(slot: np.ndarray) -> int:
    return zlib.crc32(slot[0:1].tobytes() + slot[2:].tobytes())


class Kept:
    """The two snapshot slots (``[generation, checksum, words...]``) of a queue's words."""

    def __init__(self, mem: Any, region: tuple[int, int], lanes: int) -> None:
        off, size = region
        if size != region_bytes(lanes):
            from shmbuf.core.segment import FormatError
            raise FormatError(f"the queue's snapshot region holds {size} bytes, expected {region_bytes(lanes)}")
        self.slots = np.ndarray((2, words(lanes) + 2), np.int64, mem, off)

    def newest(self) -> int:
        """The slot of the newest whole snapshot, or -1."""
        whole = [i for i in (0, 1) if self.slots[i, 0] > 0 and self.slots[i, 1] == _checksum(self.slots[i])]
        return max(whole, key=lambda i: int(self.slots[i, 0]), default=-1)

    def keep(self, words: np.ndarray) -> None:
        """(Under the lock) a snapshot of ``words``, over the older slot."""
        i = self.newest()
        gen = 1 if i < 0 else int(self.slots[i, 0]) + 1
        slot = self.slots[0 if i < 0 else 1 - i]
        slot[2:] = words
        slot[0] = gen
        slot[1] = _checksum(slot)


def recover(kept: Kept | None, live: Any, journal: np.ndarray, ring: Any,
            give_back: Callable[[Any, np.ndarray], None]) -> None:
    """(Under the lock, the lanes rolled back) the queue's words ``live`` (a
    :class:`~shmbuf.queue.protocol.Words`) from the newest snapshot, fitted to the rows left
    (see the module); ``give_back(live, entries)`` gives back the takes in flight."""
    journal[0] = 0  # (its pages may hold parts of different changes)
    lt = ring.lane_table
    base, head = lt[:, LANE_BASE].copy(), lt[:, LANE_HEAD].copy()
    i = -1 if kept is None else kept.newest()
    t = live.table
    if i < 0:
        t[:, E_STATE] = FREE
        live.next[:] = base
        return
    live.w[:] = kept.slots[i, 2:]
    for e in np.flatnonzero(t[:, E_STATE] != FREE).tolist():
        lane = int(t[e, E_LANE])
        if not (0 <= lane < len(base)) or int(t[e, E_STATE]) not in (TAKING, RETURNED):
            t[e, E_STATE] = FREE
            continue
        start = max(int(t[e, E_START]), int(base[lane]))
        end = min(int(t[e, E_START] + t[e, E_COUNT]), int(head[lane]))
        if end > start:
            t[e, E_START], t[e, E_COUNT] = start, end - start
        else:
            t[e, E_STATE] = FREE
    live.next[:] = np.clip(live.next, base, head)
    give_back(live, np.flatnonzero(t[:, E_STATE] == TAKING))

"""Records: the values of a row's ragged fields, in a byte arena per lane beside the ring.

A buffer with ragged fields (:mod:`shmbuf.ragged`) keeps each row's fixed part in the
ring as every buffer does, plus one hidden fixed field, its **record word**
``(lane, pos, length of each ragged dimension...)``, and the values of its ragged fields
in one **record**: the fields one after the other, each padded to 8 bytes, at byte
``pos`` of its lane's arena stream. ``pos`` only grows (bytes ever reserved in the
lane); the record lives at ``pos % A`` of the lane's arena of ``A`` bytes and never
crosses its end. The region (``REGION``) holds::

    heads   per lane 8 words: H, the lane's bytes ever reserved (the arena head); a buffer
            file's arena horizon (on the disk, usable); spare
    table   per slot: the pos of the row the slot holds (the writers' copy, for eviction
            and a queue's room; readers never trust it)
    arenas  lanes x A bytes

**Writing** is the ring's protocol (:meth:`shmbuf.core.ring.Ring.put`) with three
steps added, all under the header lock the reservation takes (a lane's owner takes it
too when its buffer keeps records):

1. :meth:`Arena.reserve`, before the ring's head moves (the commit): the write's
   records are placed at ``H`` (or, if they would cross the arena's end, at the next
   start of it), contiguously. In a replay buffer the rows whose records the new bytes
   will cover are *evicted first*: the lane's ``base`` moves past them (draws stop
   finding them, and the checked gather refuses a copy drawn before). In a queue, a
   write that would cover a record not yet taken is refused (``QueueFull``: it waits
   for room, in bytes as in rows). Then ``H`` moves: from here on any reader that
   checks a record the new bytes cover refuses it.
2. :meth:`Arena.committed`, after the commit: the slot table learns the rows' pos.
3. :meth:`Arena.write`, outside the lock, after the ring's wait for older writers and
   :meth:`Arena.wait` for live writers still writing rows out of the window (evicted by
   this write or an earlier one: their late bytes could land in our records), with the
   slots stamped odd: the records' bytes are copied.

A writer killed at any point leaves bytes nobody references, or a row never
published: it costs its own rows only.

**In a buffer file** (:mod:`shmbuf.core.durable`) a row's record is written before the
row is published, so the flush that vouches for the row (its frontier past it) writes
the record to the disk with it. What a power loss can break is the other way round:
the bytes of records written *after* the flush may reach the disk over the records of
rows it vouched for, while the heads, the base and the stamps on the disk are the
flush's. So each lane has an *arena horizon* (two words beside ``H``: on the disk,
usable), moved as the rows' horizon is: :meth:`Arena.reserve` never places a record
past the usable one; to move it, under the lock, the new value is stored in the first
word, that page is written to the disk and waited for, and only then is it stored in
the second. It moves to a sixteenth of the lane's arena past the write that needs it
(doubled for a lane written fast, up to half; see :class:`shmbuf.core.durable.Lead`),
and a queue's never passes its room (the record of its oldest row not yet taken, plus
``A``). The recovery after a restart (:meth:`Arena.recover`) drops the rows whose
records a write up to the horizon on the disk may have covered (``pos`` below it minus
``A``) and starts ``H`` again from it: every row kept comes back with its record as the
flush wrote it.

**Reading** (:meth:`Arena.read`) comes after the checked gather of the fixed rows,
which proves each row's record word: the record bytes are copied, then ``H`` of each
lane is read again; a row whose ``pos < H - A`` may have been covered while it was
copied and is refused (the caller draws again), exactly as a stamp that changed. On
x86-64 the stores of a writer (``H``, then the bytes) and the loads of a reader (the
bytes, then ``H``) keep program order, which is all this seqlock needs. The copies are
C's (``csrc/records.c``, with an acquire fence after the read's copies) on the native
path and numpy's on the pure one: the same bytes.

**Restoring** a state (:meth:`Arena.restore`, under the restore's lock, its rows not
yet published) places every lane's records anew from two laps past ``H``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Sequence

import numpy as np

from shmbuf.core import durable, procs
from shmbuf.core.layout import LANE_BASE, MAX_SEQ, RES_COUNT, RES_CTIME, RES_LANE, RES_PID, RES_START, published
from shmbuf.core.segment import FormatError
from shmbuf.core.tables import QueueFull

REGION = "ragged"
HOOK: Any = None
"""Test hook, called as ``HOOK(point)``: in :meth:`Arena.write` at "record" (after the
first ragged field's bytes of each row were copied: a writer stopped there leaves a
record half-written), in :meth:`Arena.read` at "reading" (the rows' record words proved,
no byte copied yet) and "copied" (the records' bytes copied, before the check). Never set
outside tests."""
FAULTS = 0
"""Test switch: bit 1 turns :meth:`Arena.read`'s check off (tests prove with it that they
would see covered records). Never set outside tests."""
HEAD_WORDS = 8
PAD = 8  # each field's values start on an 8-byte boundary of the record


def pad(n: Any) -> Any:
    """``n`` bytes rounded up to :data:`PAD`."""
    return -(-n // PAD) * PAD


def lane_bytes(total: int, lanes: int) -> int:
    """A lane's arena: ``total`` bytes split over ``lanes``, rounded up to 64."""
    return -(-(-(-total // lanes)) // 64) * 64


def record_bytes(lengths: np.ndarray, dims: np.ndarray, element: np.ndarray) -> np.ndarray:
    """Record bytes of rows whose dimension lengths are ``lengths`` (``(n, dims)``), for
    ragged fields (record order) of dimensions ``dims`` (their indices in ``lengths``,
    intp) and ``element`` bytes per element (int64)."""
    b = lengths[:, dims] * element
    b += PAD - 1
    b &= -PAD
    return b.sum(1)


def region_bytes(capacity: int, lanes: int, lane_arena: int) -> int:
    return 8 * HEAD_WORDS * lanes + (-(-8 * capacity // 64) * 64) + lanes * lane_arena


class Arena:
    """The records of one handle's ring (see the module).

    ``field``: the name of the hidden record-word field; ``dims``: for each ragged
    field (in record order), the index of its dimension in the record word's lengths,
    and its bytes per element (``prod(trailing) * itemsize``). ``seg``: the segment, whose
    ``durable`` one (a buffer file) gets an arena horizon (see the module)."""

    def __init__(self, ring: Any, mem: Any, region: tuple[int, int], lane_arena: int, field: str,
                 dims: Sequence[tuple[int, int]], seg: Any = None) -> None:
        offset, _ = region
        lanes, cap = ring.lanes, ring.layout.capacity
        self.ring, self.A, self.field = ring, lane_arena, field
        self.dims = [(int(d), int(e)) for d, e in dims]
        self._d = np.array([d for d, _ in self.dims], np.intp)  # (sizes: every field at once)
        self._e = np.array([e for _, e in self.dims], np.int64)
        self.heads = np.ndarray((lanes, HEAD_WORDS), np.int64, mem, offset)
        self.heads_at = offset
        self.seg = seg if seg is not None and seg.durable else None
        if self.seg is not None:  # (the file is untrusted: H <= usable <= on the disk)
            h = self.heads[:, :3]
            if not ((0 <= h[:, 0]) & (h[:, 0] <= h[:, 2]) & (h[:, 2] <= h[:, 1]) & (h[:, 1] <= MAX_SEQ)).all():
                raise FormatError(f"buffer {seg.name!r}: its arena heads and horizons {h.tolist()} are not ones "
                                  "shmbuf writes")
            self.lead = durable.Lead(max(lane_arena // 16, PAD), max(lane_arena // 2, PAD), lanes)
        at = offset + 8 * HEAD_WORDS * lanes
        self.table = np.ndarray((cap,), np.int64, mem, at)
        at += -(-8 * cap // 64) * 64
        self.data = np.ndarray((lanes, lane_arena), np.uint8, mem, at)
        self.index = ring.index[field]
        self.staged = threading.local()  # this thread's write in flight: the values (see stage)
        # the copies: the C ring's (the arenas named by their offset in the segment), or the loops below
        c = ring.native
        self._read = read_python if c is None else c.records_read
        self._write = write_python if c is None else c.records_write
        self._arenas = self.data if c is None else at
        self._lanes = [self.data[i] if c is None else at + i * lane_arena for i in range(lanes)]

    # -- sizes -----------------------------------------------------------------------

    def sizes(self, lengths: np.ndarray) -> np.ndarray:
        """Record bytes of rows whose dimension lengths are ``lengths`` (``(n, dims)``)."""
        return record_bytes(lengths, self._d, self._e)

    # -- writing ---------------------------------------------------------------------

    def stage(self, values: list[list[np.ndarray]] | None) -> None:
        """The values of the next write of this thread: per ragged field (record order),
        one C-contiguous array per row (None: none staged)."""
        self.staged.values = values

    def reserve(self, lane: int, first: int, n: int, sources: list[Any], bounded: bool) -> int:
        """(Under the header lock, before the commit) place the records of rows ``first
        .. first + n - 1`` of ``lane``, writing their pos into the record words of
        ``sources``; evict (replay) or refuse (``QueueFull``, a queue) what they would
        cover; move ``H``. Returns the lane's base after the eviction."""
        words = sources[self.index]
        w = words.reshape(-1, words.shape[-1])  # (a view: the pos go into the write's words)
        sizes = self.sizes(w[:, 2:])
        total = int(sizes.sum())
        A = self.A
        if total > A:
            raise ValueError(f"the ragged values of these {n} rows take {total:,} bytes, more than a lane's "
                             f"arena ({A:,} bytes); nothing was written. Write fewer rows per call, or create "
                             "the buffer with a larger arena=")
        H = int(self.heads[lane, 0])
        start = H if H % A + total <= A else (H // A + 1) * A  # (never across the arena's end)
        end = start + total
        lt, lc = self.ring.lane_table, self.ring.lane_capacity
        base = int(lt[lane, LANE_BASE])
        if bounded:  # a queue: the oldest row not yet taken keeps its record
            if base < first and end - A > int(self.table[lane * lc + base % lc]):
                raise QueueFull(lane, f"its arena of {A:,} bytes has no room for these rows' {total:,} bytes of "
                                      "ragged values beside the rows not yet taken")
            keep = base
        else:  # replay: rows whose records the new bytes cover leave the window first
            floor = max(base, first + n - lc)  # (rows before floor: left the ring already, base kept)
            keep = self.first_from(lane, floor, first, end - A)
        if self.seg is not None and end > int(self.heads[lane, 2]):  # (its msync before any change: an
            self._reach(lane, first, base, start, end, bounded)        # interrupt there changes nothing)
        if not bounded:
            if keep > floor:  # (the base says where a lane's rows start: moved for rows the ring still held only)
                lt[lane, LANE_BASE] = keep
            base = keep  # (every row evicted, by the ring or by these bytes: their late writers are waited for)
        w[:, 0] = lane
        w[:, 1] = start + np.cumsum(sizes) - sizes
        self.heads[lane, 0] = end  # (from here, a reader refuses what the new bytes cover)
        return base

    def _reach(self, lane: int, first: int, base: int, start: int, end: int, bounded: bool) -> None:
        """(A buffer file, under the lock) move the lane's arena horizon past ``end``, on
        the disk first (see the module). A queue's stops at its room: the record of its
        oldest row not yet taken (``base``; if every row was taken, the new records'
        ``start``), plus ``A``: a restart never drops a row not yet taken for its bytes."""
        lead, now = self.lead.next_lead(lane)
        top = end + lead
        if bounded:
            lc = self.ring.lane_capacity
            top = min(top, (int(self.table[lane * lc + base % lc]) if base < first else start) + self.A)
        durable.advance(self.seg, self.heads[lane, 1:3], self.heads_at + 8 * (HEAD_WORDS * lane + 1), top)
        self.lead.moved(lane, lead, now)

    def recover(self, lane: int, lo: int, hi: int) -> int:
        """(A buffer file's first open after a restart of the machine, under the lock;
        :func:`shmbuf.core.durable.rollback`) the first row of ``lane`` from ``lo`` on
        (``hi`` if none below ``hi``, the lane's flush frontier) whose record no write
        up to the arena horizon on the disk can have covered; the lane's ``H`` and
        horizon start again from that horizon (the records below it are no row's)."""
        h = self.heads[lane]
        top = max(int(h[0]), int(h[1]), int(h[2]))
        lo = self.first_from(lane, lo, hi, top - self.A)  # (the slots below hi hold the flush's pos)
        h[0] = h[1] = h[2] = top
        return lo

    def first_from(self, lane: int, lo: int, hi: int, pos: int) -> int:
        """The first row of ``lane`` in ``lo .. hi - 1`` whose record starts at ``pos`` or
        later, by the slot table (``hi`` if none): pos grows with the sequence number."""
        lc = self.ring.lane_capacity
        while lo < hi:
            mid = (lo + hi) // 2
            if self.table[lane * lc + mid % lc] >= pos:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def committed(self, lane: int, first: int, n: int, sources: list[Any]) -> None:
        """(Under the lock, after the commit) the slot table learns the rows' pos."""
        w = sources[self.index].reshape(-1, sources[self.index].shape[-1])
        lc = self.ring.lane_capacity
        self.table[lane * lc + (first + np.arange(n)) % lc] = w[:, 1]

    def wait(self, lane: int, first: int, base: int, entry: int, deadline: float) -> None:
        """Wait until no live writer of this lane still writes a row below ``base``:
        rows out of the window, whose records these rows' bytes may cover. Not only the
        rows this write evicted: a row evicted by an earlier write (whose writer waits for
        it) may have its record's rest under this write's bytes, and its late bytes would
        land there all the same."""
        alive, delay, res = procs.Liveness(), 0.0, self.ring.res
        while True:
            r = res.copy()
            older = (r[:, RES_PID] != 0) & (r[:, RES_LANE] == lane) & (r[:, RES_START] < base)
            if entry >= 0:
                older[entry] = False
            if not older.any():
                return  # (the common case: one copy of the small table, no liveness check)
            older &= ~self.ring.leftovers(r)
            ctimes = r.view(np.float64)[:, RES_CTIME]
            blockers = sorted({int(r[i, RES_PID]) for i in np.flatnonzero(older).tolist()
                               if not self._published(lane, int(r[i, RES_START]), int(r[i, RES_COUNT]))
                               and alive(int(r[i, RES_PID]), float(ctimes[i]))})
            if not blockers:
                return
            if time.monotonic() >= deadline:
                raise self.ring.write_timeout(
                    f"rows {first}.. of lane {lane} could not be written: live process(es) {blockers} are "
                    "still writing rows whose records these rows' values will cover (an arena this small "
                    "wraps faster than they write). Use a larger arena=, or pass a larger timeout=")
            time.sleep(delay)
            delay = min(max(delay * 2, 20e-6), 1e-3)

    def _published(self, lane: int, start: int, count: int) -> bool:
        """True if rows ``start .. start + count - 1`` of ``lane`` are published (their
        writer wrote their records before it published them; it only frees its entry)."""
        lc = self.ring.lane_capacity
        seq = np.arange(start, start + max(0, min(count, lc)))
        return bool((self.ring.stamps[lane * lc + seq % lc] == published(seq)).all())

    def write(self, lane: int, sources: list[Any]) -> None:
        """(Slots stamped odd) copy the staged values into the records placed for them."""
        values = getattr(self.staged, "values", None)
        words = sources[self.index]
        w = np.ascontiguousarray(words.reshape(-1, words.shape[-1]))
        if values is None or any(len(v) < len(w) for v in values):
            raise RuntimeError("a write of ragged rows without their values staged")
        skip = len(values[0]) - len(w)  # (a write truncated to its last rows: theirs)
        self._write(w, w.shape[1], self._lanes[lane], self.A, self.dims, values, skip, HOOK)

    # -- reading ---------------------------------------------------------------------

    def read(self, words: np.ndarray, outs: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray | None:
        """Copy the records of rows whose (checked) record words are ``words`` (int64,
        C-contiguous) into ``outs`` (per ragged field, record order: its ``values``, and
        the ``offsets`` of each row in them, in elements); None if every record was
        intact, else the mask of the intact rows (the others were covered meanwhile: draw
        them again)."""
        if HOOK is not None:
            HOOK("reading")
        self._read(words, words.shape[1], self._arenas, self.A, self.dims, outs)
        if HOOK is not None:
            HOOK("copied")
        heads = self.heads[:, 0].copy()  # (after the copies: the seqlock's second read)
        ok = words[:, 1] >= heads[words[:, 0]] - self.A if len(words) else np.ones(0, bool)
        if FAULTS & 1:
            ok[:] = True
        return None if ok.all() else ok

    def restore(self, slots: np.ndarray, row: np.ndarray, values: Sequence[Any], seq: np.ndarray) -> None:
        """(A restore, under the lock, every row unpublished) place the records of the
        rows restored into ``slots`` (whose record words hold their lengths), row
        ``row[i]`` of each ragged field's ``values`` (Jagged), each lane's in the order of
        their sequence numbers ``seq``, from two laps past its arena head (every record
        placed before fails a reader's check from the moment the head moves)."""
        lc, A, words = self.ring.lane_capacity, self.A, self.ring.arrays[self.field]
        for lane in np.unique(slots // lc).tolist():
            mine = np.flatnonzero(slots // lc == lane)
            mine = mine[np.argsort(seq[mine], kind="stable")] if len(mine) > 1 else mine
            sizes = self.sizes(words[slots[mine], 2:])
            start = (int(self.heads[lane, 0]) // A + 2) * A
            pos = start + np.cumsum(sizes) - sizes
            self.heads[lane, 0] = start + int(sizes.sum())  # (before any byte: old records fail from here)
            if self.seg is not None:  # (a buffer file's restore is flushed before it vouches for a row)
                self.heads[lane, 1] = self.heads[lane, 2] = max(int(self.heads[lane, 1]), int(self.heads[lane, 0]))
            data = self.data[lane]
            for k, i in enumerate(mine.tolist()):
                at, r = int(pos[k]) % A, int(row[i])
                for (d, e), j in zip(self.dims, values):
                    chunk = j[r].reshape(-1).view(np.uint8)
                    data[at:at + len(chunk)] = chunk
                    at += pad(len(chunk))
            words[slots[mine], 0] = lane
            words[slots[mine], 1] = pos
            self.table[slots[mine]] = pos


# -- the copies, in pure Python (the native path's: csrc/records.c; the same bytes) ---------

def read_python(words: np.ndarray, width: int, data: np.ndarray, A: int, dims: Sequence[tuple[int, int]],
                outs: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
    """Copy the records of ``words`` (``(n, width)``) out of ``data`` (``(lanes, A)``
    bytes) into ``outs`` (per field: values, offsets in elements); see :meth:`Arena.read`."""
    bufs = [(values.reshape(-1).view(np.uint8), offsets.tolist()) for values, offsets in outs]
    for i, (lane, pos, lengths) in enumerate(zip(words[:, 0].tolist(), words[:, 1].tolist(),
                                                 words[:, 2:].tolist())):
        at = pos % A
        src = data[lane]
        for (d, e), (buf, offsets) in zip(dims, bufs):
            nbytes = lengths[d] * e
            if nbytes:
                o = offsets[i] * e
                buf[o:o + nbytes] = src[at:at + nbytes]
            at += -(-nbytes // PAD) * PAD


def write_python(words: np.ndarray, width: int, data: np.ndarray, A: int, dims: Sequence[tuple[int, int]],
                 values: list[list[np.ndarray]], skip: int, hook: Any) -> None:
    """Copy ``values`` (per field, the rows from ``skip`` on) into the records of
    ``words`` in one lane's arena ``data`` (``A`` bytes), calling ``hook("record")`` (if
    not None) after the first field of each record; see :meth:`Arena.write`."""
    for i, (pos, lengths) in enumerate(zip(words[:, 1].tolist(), words[:, 2:].tolist())):
        at = pos % A
        for j, ((d, e), rows) in enumerate(zip(dims, values)):
            nbytes = lengths[d] * e
            if nbytes:
                data[at:at + nbytes] = rows[skip + i].reshape(-1).view(np.uint8)
            at += -(-nbytes // PAD) * PAD
            if hook is not None and j == 0:
                hook("record")

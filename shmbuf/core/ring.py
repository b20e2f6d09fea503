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

**Writing** (:meth:`Ring.put`):

1. Under the header lock: take an entry in the reservation table (who, a token
   unique to this write, lane, first sequence, count), then advance the lane's head.
   The head store is the commit: a writer killed before it reserved nothing; killed
   after it, its entry says which rows it owns.
2. Outside the lock: wait until no live writer of an older reservation, on any lap,
   still owns rows in our slots. A slot holding the published row of one lap ago
   proves it at once (that row's writer waited the same way before publishing); only
   a tiny ring that wraps onto a slow, dead or timed-out writer's rows needs the table
   scan. Waiting only ever goes to strictly older rows, so it cannot deadlock; a
   waiter re-checks every few milliseconds whether the writers it waits for died.
3. Stamp the slots odd, copy the data, stamp them even, free the entry.

Any exception on the way (a timeout, ``KeyboardInterrupt`` from Ctrl-C at any
instant) abandons the write: stamps already made odd are zeroed and the entry is
freed, so a live process never keeps rows that nobody will finish.

**Memory ordering.** Stamps are written and read without the lock. This is correct
on x86-64 (total store order: stores become visible in program order, loads are not
reordered with loads) and relies on the compiler not moving memory accesses across
separate numpy calls, which it cannot see through. On weakly ordered CPUs (ARM64:
Graviton, Apple silicon) the torn-read check is best effort: the reservation itself is
still exact (it happens under the lock, whose system call is a full barrier).
"""

from __future__ import annotations

import fcntl
import itertools
from contextlib import nullcontext
import threading
import time
from typing import Any, Callable

import numpy as np

from shmbuf.core import native, procs, yielding
from shmbuf.core.claims import Claims
from shmbuf.core.interrupts import Deferred
from shmbuf.core.layout import (CONTROL_WORDS, LANE_BASE, LANE_CLAIM_PID, LANE_HEAD, LANE_OWN_COUNT,
                     LANE_OWN_START, RES_COUNT, RES_CTIME, RES_LANE, RES_PID, RES_START, RES_TOKEN, TABLE_WIDTH,
                     Layout, c_strides, published)
from shmbuf.core.lock import HeaderLock, owner_lock
from shmbuf.core.tables import QueueFull, check_head, owners  # noqa: F401 (QueueFull: for the queue)

_TOKENS = itertools.count(1)  # next() is atomic under the GIL: unique per write in a process
# The token of each thread's latest shared write. A KeyboardInterrupt can land inside a
# write's cleanup (a SIGINT storm, a notebook) and leave its entry in the table; an
# entry of this process whose token no thread is writing under any more is such a
# leftover, never a writer to wait for (see _leftover).
_WRITING: dict[int, int] = {}


class _Published(threading.local):
    rows = 0  # rows this thread has published on the Python path


_MINE = _Published()


def rows_published() -> int:
    """Rows this thread has published, on either path, since it started: a call that
    writes several rows (``Engine.write_each``) tells by the difference how many of them
    an exception (Ctrl-C at any instant) left written. A row counts once its stamps say
    published and the write cannot take them back."""
    return _MINE.rows + native.published()


HOOK: Callable[[str], None] | None = None
"""Test hook, called at "locked" (holding the lock, head advanced), "reserved" (lock
released, nothing written), "writing" (slots stamped odd, a field copied) and
"published" (the rows published and counted: an exception there leaves them written).
Set it with :func:`set_hook`, which sets the native path's too."""


def set_hook(hook: Callable[[str], None] | None) -> None:
    """Call ``hook(point)`` at the protocol points of every write of this process, on
    both paths (tests stop, kill or interrupt a writer there)."""
    global HOOK
    HOOK = hook
    if native.available():
        native.extension().set_hook(hook)


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


class Ring(Claims):
    """Typed views of one mapped layout, and the write protocol over them.

    ``native`` is the C implementation of the hot paths over the same memory (see
    :mod:`shmbuf.core.native`), or None for pure Python; :meth:`put` uses it when present.
    """

    write_timeout = WriteTimeout

    def __init__(self, layout: Layout, mem: Any, lock: HeaderLock, native: Any, counters: Any,
                 horizon: Any = None) -> None:
        """``counters``: the handle's :class:`~shmbuf.core.counters.Counters`;
        ``horizon``: a buffer file's horizon words (:func:`shmbuf.core.durable.horizon`),
        whose mover the engine sets as :attr:`reach`. ``bounded`` (set True by a queue's
        write part as it opens): never reserve past a lane's base plus its capacity."""
        self.layout = layout
        self.lock = lock
        self.native = native
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
        self.stamps = np.ndarray((layout.capacity,), i8, mem, layout.rows_offset,
                                 (layout.row_stride,))
        self.arrays = {f.name: np.ndarray((layout.capacity,) + f.shape, f.dtype, mem, f.offset,
                                          (f.stride,) + c_strides(f))
                       for f in layout.fields}
        self.rows = np.ndarray((layout.capacity, layout.row_stride), np.uint8, mem, layout.rows_offset)
        self.index = {f.name: i for i, f in enumerate(layout.fields)}  # field name -> position
        self.scratch = threading.local()  # per-thread scratch space of the samplers
        self._hint = threading.local()
        self._own_lock = owner_lock(lock)
        self.counters, self.horizon = counters, horizon
        self.bounded = False  # (a queue's part sets it: see below)
        self.yielding = yielding.part(self.control, sum(f.row_bytes for f in layout.fields))  # writers wait for a learner's large gather
        self.records: Any = None  # a buffer with ragged fields: its shmbuf.core.arena.Arena (set as it opens)
        self.reach: Callable[[int, int, float], None] = lambda lane, n, timeout: None  # (a file's: durable.Horizon)

    # -- lane state ------------------------------------------------------------------

    def window(self) -> tuple[np.ndarray, np.ndarray]:
        """Per lane: ``(lo, head)``, the sequence numbers of the rows that count now.

        The base is read before the head: heads only grow, and whoever moves both
        (a restore) stores the head first, so a reader never pairs a new base with an
        old head (an empty window that never existed)."""
        base = self.lane_table[:, LANE_BASE].copy()
        head = self.lane_table[:, LANE_HEAD].copy()
        lo = np.maximum(np.minimum(base, head), head - self.lane_capacity)
        return lo, head

    def window_lists(self) -> tuple[list[int], list[int]]:
        """:meth:`window` as lists of Python ints (cheaper for a few lanes)."""
        base = self.lane_table[:, LANE_BASE].tolist()
        head = self.lane_table[:, LANE_HEAD].tolist()
        lc = self.lane_capacity
        return [max(min(b, h), h - lc) for b, h in zip(base, head)], head

    def size(self) -> int:
        lo, head = self.window()
        return int((head - lo).sum())

    # -- writing ---------------------------------------------------------------------

    def put(self, lane: int, n: int, sources: list[np.ndarray], timeout: float) -> None:
        """Reserve ``n`` rows of ``lane``, copy ``sources`` into them and publish them.

        ``sources`` holds one array per field, in layout order: ``n`` rows each, or for
        ``n == 1`` one row without a row axis (of the field's dtype, C-contiguous, when
        the native path is used). Waits at most ``timeout`` for the lock and for older
        writers. Whatever happens, the reservation is released: published, or abandoned
        (never sampled) if anything raised.
        """
        deadline = time.monotonic() + timeout  # (one deadline, whatever the write waits for)
        if self.native is not None and not self.bounded and self.records is None:  # (a queue's writes check room here)
            rows = [np.ascontiguousarray(a, f.dtype) for a, f in zip(sources, self.layout.fields)]
            left = timeout
            while self.native.put(lane, n, rows, left) is False:
                self.reach(lane, n, max(0.0, deadline - time.monotonic()))
                self._make_way(lane, max(0.0, deadline - time.monotonic()))
                left = max(0.0, deadline - time.monotonic())
            return
        self.yielding.wait(deadline)  # (the native path waits in write_rows)
        pid = procs.identity()[0]
        while True:
            left = max(0.0, deadline - time.monotonic())
            if int(self.lane_table[lane, LANE_CLAIM_PID]) == pid:
                lk = self._own_lock
                try:
                    if not lk.acquire(False) and not lk.acquire(timeout=min(left, 1e9)):
                        raise WriteTimeout(f"lane {lane}: another thread of this process is still "
                                           f"writing to it after {timeout:g} s")
                    self._put(lane, n, sources, max(0.0, deadline - time.monotonic()), True)
                    return
                finally:
                    if lk.is_owned():
                        lk.release()
            if self._put(lane, n, sources, left, False):
                return

    def _put(self, lane: int, n: int, sources: list[np.ndarray], timeout: float, owner: bool) -> bool:
        """One write, as the lane's owner (no lock: nobody else moves its head) or as
        one of its shared writers (reserving under the lock). False, with nothing done,
        if the lane turned out to be claimed by this process meanwhile."""
        deadline = time.monotonic() + timeout  # (the lock's wait and the older writers' share it)
        pid, ctime = procs.identity()
        token = -next(_TOKENS)  # negative: a Python-path write (the native path's are positive)
        _WRITING[threading.get_ident()] = token  # (before any reservation of ours)
        entry = -1  # -1: the owner's entry, in the lane table
        runs: list[tuple[int, int, int]] = []
        stamped = False
        mine = _MINE
        before = mine.rows
        stamps = self.stamps
        lt = self.lane_table
        records = self.records
        base = 0
        try:
            # 1. reserve: the entry first, then the head (the commit)
            if owner:
                # (a lane's owner reserves alone; with records it takes the lock too: it evicts)
                with self.lock.hold(timeout) if records is not None else nullcontext():
                    first = int(lt[lane, LANE_HEAD])
                    check_head(lane, first, n, self.horizon)
                    if self.bounded and first + n > lt[lane, LANE_BASE] + self.lane_capacity:
                        raise QueueFull(lane)
                    if records is not None:
                        base = records.reserve(lane, first, n, sources, self.bounded)
                    lt[lane, LANE_OWN_START] = first
                    lt[lane, LANE_OWN_COUNT] = n
                    lt[lane, LANE_HEAD] = first + n  # the reservation is committed here
                    if records is not None:
                        records.committed(lane, first, n, sources)
                    if HOOK is not None:
                        HOOK("locked")
            else:
                lock = self.lock
                # (with records, Ctrl-C waits until the lock is free, as lock.hold's does: the
                # eviction and the head's commit are one change, whole or not made)
                held = Deferred().__enter__() if records is not None else None
                try:
                    lock.acquire(timeout)
                except BaseException:
                    if held is not None:
                        held.__exit__(None, None, None)
                    raise
                try:
                    if not self._may_share(lane, pid):
                        return False
                    first = int(lt[lane, LANE_HEAD])
                    check_head(lane, first, n, self.horizon)
                    if self.bounded and first + n > lt[lane, LANE_BASE] + self.lane_capacity:
                        raise QueueFull(lane)
                    if records is not None:  # (before the entry: it may refuse)
                        base = records.reserve(lane, first, n, sources, self.bounded)
                    entry = self._free_entry()
                    res = self.res
                    res[entry, RES_LANE] = lane
                    res[entry, RES_START] = first
                    res[entry, RES_COUNT] = n
                    res[entry, RES_TOKEN] = token
                    self.res_f[entry, RES_CTIME] = ctime
                    res[entry, RES_PID] = pid  # the entry is valid from here
                    lt[lane, LANE_HEAD] = first + n  # the reservation is committed here
                    if records is not None:
                        records.committed(lane, first, n, sources)
                    if HOOK is not None:
                        HOOK("locked")
                finally:  # lock.release(), inlined: a Python call could take an interrupt first
                    try:
                        fcntl.flock(lock.held_fd, fcntl.LOCK_UN)
                    finally:
                        lock.busy[0] = 0
                        lock.thread_lock.release()
                        if held is not None:
                            held.__exit__(None, None, None)
            if HOOK is not None:
                HOOK("reserved")
            lc = self.lane_capacity
            at = lane * lc
            slot = first % lc
            k = min(n, lc - slot)  # rows before the end of the lane; the rest wrap to its start
            runs.append((at + slot, at + slot + k, 0))
            if k < n:
                runs.append((at, at + n - k, k))
            # 2. wait for older writers of our slots
            if first + n > lc and not self._older_done(first, runs):
                self._wait_for_older(lane, first, n, entry, runs, deadline)
            if records is not None:  # (and for the writers of the rows our records evicted)
                records.wait(lane, first, base, entry, deadline)
            # 3. stamp odd, copy, stamp even
            stamped = True
            if n == 1:
                row = at + slot
                stamps[row] = 2 * first + 1
                if records is not None:
                    records.write(lane, sources)
                for dest, src in zip(self.arrays.values(), sources):
                    dest[row] = src
                    if HOOK is not None:
                        HOOK("writing")
                stamps[row] = published(first)
            else:
                for lo, hi, off in runs:
                    _stamp_run(stamps, lo, hi, 2 * (first + off) + 1)
                if records is not None:
                    records.write(lane, sources)
                for dest, src in zip(self.arrays.values(), sources):
                    if k == n:  # no wrap: one copy of the whole source
                        dest[runs[0][0]:runs[0][1]] = src
                    else:
                        for lo, hi, off in runs:
                            dest[lo:hi] = src[off:off + hi - lo]
                    if HOOK is not None:
                        HOOK("writing")
                for lo, hi, off in runs:
                    _stamp_run(stamps, lo, hi, published(first + off))
            mine.rows = before + n  # the write is done (one store: its rows are counted as it is decided)
            if HOOK is not None:
                HOOK("published")
        finally:
            if mine.rows != before:
                if owner:
                    lt[lane, LANE_OWN_COUNT] = 0
                else:
                    self.res_pid[entry] = 0
            elif owner:
                self._abandon_runs(runs if stamped else [])
                lt[lane, LANE_OWN_COUNT] = 0
            else:
                self._abandon(pid, token, runs if stamped else [])
        self.counters.wrote(lane)
        return True

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
        """Block until no live writer of an older reservation, on any lap, still owns
        rows in our slots. (The caller has seen the fast check, :meth:`_older_done`, fail.)

        Any lap, not just the previous one: if the writer one lap back died or gave up,
        a writer two laps back may still be copying into the same slot.
        """
        lc = self.lane_capacity
        alive = procs.Liveness()
        delay = 0.0
        while True:
            res = self.res.copy()
            start, count = res[:, RES_START], res[:, RES_COUNT]
            older = (res[:, RES_PID] != 0) & (res[:, RES_LANE] == lane) & (start < first)
            # their slots and ours, as arcs of the lane's circle, intersect
            older &= ((first - start) % lc < count) | ((start - first) % lc < n)
            if entry >= 0:
                older[entry] = False
            older &= ~self._leftover(res)
            blockers = sorted({pid for pid, ct in owners(res, np.flatnonzero(older)) if alive(pid, ct)})
            if not blockers or self._older_done(first, runs):
                return
            if time.monotonic() >= deadline:
                raise WriteTimeout(
                    f"rows {first}..{first + n - 1} of lane {lane} could not be written: "
                    f"live process(es) {blockers} are still writing older rows into the same "
                    "slots (a ring this small wraps faster than they write). Use a larger "
                    "capacity, or pass a larger timeout=")
            time.sleep(delay)
            delay = min(max(delay * 2, 20e-6), 1e-3)

    def leftovers(self, res: np.ndarray) -> np.ndarray:
        """:meth:`_leftover`, for the waits of the records (:mod:`shmbuf.core.arena`)."""
        return self._leftover(res)

    def _leftover(self, res: np.ndarray) -> np.ndarray:
        """Entries of a reservation-table copy left by this process's interrupted
        Python-path writes (negative tokens that are nobody's write in flight here; a
        native write cannot be interrupted halfway): freed, and a mask of them."""
        mine = np.flatnonzero((res[:, RES_PID] == procs.identity()[0]) & (res[:, RES_TOKEN] < 0))
        gone = np.zeros(len(res), bool)
        if len(mine):
            writing = set(_WRITING.values())
            for i in mine.tolist():
                if int(res[i, RES_TOKEN]) not in writing:
                    gone[i] = True
                    # (only this process frees its live entries: the match is stable)
                    if self.res_pid[i] == res[i, RES_PID] and self.res[i, RES_TOKEN] == res[i, RES_TOKEN]:
                        self.res_pid[i] = 0
        return gone

    def trim(self, lane: int, seq: int, timeout: float) -> None:
        """Forget the rows of ``lane`` before ``seq`` (never back, nor past the head):
        draws stop finding them; they stay intact until overwritten."""
        with self.lock.hold(timeout):
            t = self.lane_table
            t[lane, LANE_BASE] = max(int(t[lane, LANE_BASE]), min(int(seq), int(t[lane, LANE_HEAD])))

    def clear(self, timeout: float) -> None:
        """Forget every row. Sequence numbers keep growing, so writers in flight stay safe."""
        with self.lock.hold(timeout):
            self.lane_table[:, LANE_BASE] = self.lane_table[:, LANE_HEAD]

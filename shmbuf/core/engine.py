"""The engine: one handle's parts on one segment, wired once.

An :class:`Engine` owns what a handle needs to speak the protocol: the mapped
:class:`~shmbuf.core.segment.Segment` and its :class:`~shmbuf.core.layout.Layout`, the
header lock, the :class:`~shmbuf.core.ring.Ring` (and the C ring of the native path),
the handle's stats slot, its random generator, its default timeout, its lane claim and
the rate gate. ``Buffer`` and ``EpisodeBuffer`` are facades over one; every capability
(priorities, episodes, HER, persistence, stats, weights, torch, the facades of other
libraries, Ray) works through the attributes and methods below and nothing else.

What a capability may use:

* ``layout``, ``fields``, ``schema``, ``seg``, ``name``: what the segment holds;
* ``ring`` (lane table, stamps, arrays, ``put``, ``window``), ``native``, ``lock``;
* ``rng``, ``seconds(timeout)``, ``counters``, and the parts a capability replaces
  (:mod:`shmbuf.core.plain`): ``writes`` (rows into the ring, or a queue's),
  ``priorities``, ``gate`` (the rate limit);
* ``write(arrays, n, lane, timeout)``: rows through the rate gate into a lane;
  ``write_each(arrays, lanes, timeout)``: a row into each of several lanes, all or none;
* the read path: :mod:`shmbuf.core.read` with this engine.

Examples:
    >>> import shmbuf
    >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 4)
    >>> e = buf.engine
    >>> e.write([np.arange(2)], 2, None, None); e.ring.size()
    2
    >>> buf.close()
"""

from __future__ import annotations

import os
import time
import weakref
from typing import Any, Callable, TypeVar

import numpy as np

from shmbuf.core import durable, gather, native, procs, storage, validate
from shmbuf.core.counters import Counters
from shmbuf.core.deadline import Deadline, note, rest
from shmbuf.core.layout import CTRL_FLUSHES, CTRL_LOCK_HOLDER, LANE_BASE, LANE_HEAD, Layout, published
from shmbuf.core.lock import HeaderLock
from shmbuf.core.plain import OPEN, NoPriorities, NoRecords, Replay
from shmbuf.core.ring import Ring, WriteTimeout, rows_published
from shmbuf.core.read import Sampler, read
from shmbuf.core.segment import NotReadyError, Segment
from shmbuf.core.tables import check_tables

T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0
"""Seconds any blocking call waits before it raises ``TimeoutError`` (per-call ``timeout=``)."""
_engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for engine in list(_engines):
        engine.forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Closed:
    """Stands in for the ring of a closed handle: any use says so clearly."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        raise ValueError(f"this handle of buffer {self.name!r} is closed; "
                         f"attach again with shmbuf.Buffer.attach({self.name!r})")


def _finalize(seg: Segment, owner_pid: int | None, c_ring: Any) -> None:
    """Close a handle; the creating process (not a forked copy of it) also destroys it."""
    if c_ring is not None:
        c_ring.close()  # calls after this raise; its memory stays mapped while it lives
    if owner_pid is not None and owner_pid == os.getpid():
        seg.unlink()  # only if the name is still ours; drops the tracker entry either way
    seg.close()


def open_segment(name: str, timeout: float) -> tuple[Segment, Layout]:
    """Map the segment ``name`` and read its layout, waiting up to ``timeout`` seconds for
    a buffer that is still being created. The caller owns the segment returned."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            seg = storage.of(name).attach(name)
        except NotReadyError:
            seg = None
        if seg is not None:
            try:
                layout = Layout.read(seg.mmap, name)
                break
            except NotReadyError:
                seg.close()
            except BaseException:
                seg.close()
                raise
        if time.monotonic() >= deadline:
            raise NotReadyError(
                f"shared-memory segment {name!r} did not become a complete buffer within "
                f"{timeout:g} s: its creator is still creating it, or died doing so (then "
                f"remove it with `shmbuf rm {name}`)")
        time.sleep(delay)
        delay = min(2 * delay, 0.05)
    try:
        seg.ensure_allocated()
        check_tables(layout, seg.mmap, name)
    except BaseException:
        seg.close()
        raise
    return seg, layout


class Engine:
    """One handle's parts on a mapped, validated segment (see the module's docstring).

    The caller keeps ``seg`` until this returns; from then on the engine owns it (closes
    it, and unlinks it if ``owner``). ``counted``: claim a slot of the stats region (not
    for a mere observer such as ``shmbuf ls``). ``deadline``: of the waits of opening
    (an attach's, which waited for the segment first; default: ``timeout`` from now).
    """

    def __init__(self, seg: Segment, layout: Layout, *, owner: bool, rng: np.random.Generator,
                 timeout: float, counted: bool = True, deadline: Deadline | None = None,
                 parts: Callable[["Engine"], Any] | None = None) -> None:
        self.seg = seg
        self.name = seg.name
        self.layout = layout
        self.fields = layout.fields
        self.schema = validate.Schema(layout.fields)
        self.rng = rng
        self._timeout = timeout
        ctrl = np.ndarray((1,), np.int64, seg.mmap, layout.control_offset + 8 * CTRL_LOCK_HOLDER)

        def note(pid: int) -> None:
            ctrl[0] = pid

        def describe() -> str:
            pid = int(ctrl[0])
            return f"last taken by pid {pid}" if pid else "holder unknown"

        self.lock = HeaderLock(lambda: seg.fd, note, describe)
        self.prefaulted = bytearray(layout.lanes)  # 1: this handle has mapped the lane's pages
        self.native = native.make_ring(layout, seg.mmap, self.lock.busy, self.prefaulted,
                                       procs.is_alive, WriteTimeout, self.lock.timeout_error)
        self.counters = self.lock.stats = Counters(layout, seg.mmap)
        self.ring: Any = Ring(layout, seg.mmap, self.lock, self.native, self.counters,
                              durable.horizon(layout, seg.mmap, self.name))
        if self.ring.horizon is not None:  # a buffer file: its horizon moves ahead of its writes
            self.ring.reach = durable.Horizon(self.ring, seg)
        wait = (deadline or Deadline(timeout)).left  # (one deadline for the waits of opening)
        # the parts (shmbuf.parts), opened once, each in the role it plays; the plain
        # ones (shmbuf.core.plain) where none does
        roles = dict(parts(self)) if parts is not None else {}
        self.writes: Any = roles.get("writes") or Replay(self.ring)
        self.gate: Any = roles.get("gate") or OPEN
        self.priorities: Any = roles.get("priorities") or NoPriorities()
        self.records: Any = roles.get("records") or NoRecords()
        if seg.durable:  # (a queue's takes in flight at a restart give their rows back)
            durable.recover(self.ring, wait(), self.writes.rolled_back)
        if counted:
            self.counters.claim(self.lock, min(wait(), 1.0))
        self._rows = self.native if not self.ring.bounded else None  # (write_each's one call: not a queue's)
        self._names = [f.name for f in layout.fields]
        self._lane: int | None = None  # the lane this handle claimed
        self._lane_pid = 0
        self.configure()
        self.owner_pid = os.getpid() if owner else None
        self._finalizer = weakref.finalize(self, _finalize, seg, self.owner_pid, self.native)
        _engines.add(self)

    # -- defaults --------------------------------------------------------------------

    @property
    def timeout(self) -> float:
        """The handle's default timeout of blocking calls, in seconds."""
        return self._timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._timeout = validate.timeout(value)
        self.configure()

    def seconds(self, timeout: float | None) -> float:
        """``timeout`` checked, or the handle's default for None."""
        return self._timeout if timeout is None else validate.timeout(timeout)

    def configure(self) -> None:
        """Tell the native path this handle's defaults (its lane, its timeout)."""
        if self.native is not None:
            c = self.counters
            native.configure(self.native, self.seg.fd, 0 if self.layout.lanes == 1 else self.lane,
                             self._timeout, c.offset, c.lanes_offset if c.present else -1,
                             self.layout.regions.get(durable.REGION, (-1, 0))[0])

    def forked(self) -> None:
        """In a forked child: nothing of the parent's process-bound state is ours."""
        self.prefaulted[:] = bytes(len(self.prefaulted))  # fork copies no page-table entries
        if not self.closed:
            self.counters.slot = memoryview(bytearray(self.counters.slot)).cast("q")  # the parent's is the parent's
            self.counters.claim(self.lock, 0.0)  # one of our own (or the shared one), never waiting
            self.configure()  # a new pid and descriptor, and no lane claim (lane is None)

    # -- writing ---------------------------------------------------------------------

    def write(self, arrays: list[np.ndarray], n: int, lane: int | None, timeout: float | None) -> None:
        """Write ``n`` checked rows (one array per stored field, in field order; without
        the row axis for ``n == 1``) into ``lane`` (None: the claimed one), through the
        rate gate, all within ``timeout``."""
        timeout = self.seconds(timeout)
        left = self.gate.before_insert(n, timeout)
        deadline = time.monotonic() + rest(left, timeout)
        claims = lane is None and self.layout.lanes > 1 and self.lane is None  # claimed by this write
        try:
            lane = 0 if lane is None and self.layout.lanes == 1 else \
                self.resolve_lane(lane, max(0.0, deadline - time.monotonic()))
            if not self.prefaulted[lane]:
                self.prefault(lane)
            return self.writes.put(lane, n, arrays, max(0.0, deadline - time.monotonic()))
        except BaseException as exc:
            if claims and self.lane is not None:  # a failed first write keeps no lane
                self.release_lane(0.0)
            note(exc, timeout, left)
            raise

    def write_each(self, arrays: list[np.ndarray], lanes: np.ndarray, timeout: float | None) -> None:
        """Write row ``i`` of ``arrays`` (checked: one array per stored field, a row per
        lane) into lane ``lanes[i]`` (a checked int64 array), all within ``timeout``.
        All or nothing, as far as this process decides it: a lane that another live
        process claims, the rate gate (passed once, for all the rows) and a queue's room
        (in every lane) are settled before any row is written. What an error that could
        only come later (a claim, a full queue, a lock or a lane's write held past the
        timeout: another process's doing meanwhile, or another thread's of this one), or
        a Ctrl-C, left written is in its ``rows_written`` (rows ``0 .. rows_written - 1``
        were written, in order, the others not; counted as they are published:
        :func:`shmbuf.core.ring.rows_published`) and its message (a KeyboardInterrupt's note)."""
        timeout = self.seconds(timeout)
        n, left, mark = len(lanes), timeout, rows_published()
        try:
            self.ring.refuse_theirs(lanes)
            left = self.gate.before_insert(n, timeout)
            deadline = time.monotonic() + rest(left, timeout)
            self.writes.room(lanes, max(0.0, deadline - time.monotonic()))
            self.ring.refuse_theirs(lanes)  # (again, after the waits)
            for lane in set(lanes.tolist()):
                if not self.prefaulted[lane]:
                    self.prefault(lane)
            if self._rows is not None and self._rows.put_rows(  # (every lane this process's: one call)
                    lanes, dict(zip(self._names, arrays)), {}, max(0.0, deadline - time.monotonic())) is None:
                return
            for i, lane in enumerate(lanes.tolist()):
                self.writes.put(lane, 1, [a[i] for a in arrays], max(0.0, deadline - time.monotonic()))
        except BaseException as exc:
            written = exc.rows_written = rows_published() - mark  # (this thread's: the rows of this call)
            note(exc, timeout, left, f"none of the {n} rows was written" if not written else
                 f"all {n} rows were written" if written == n else
                 f"rows 0..{written - 1} of the {n} (into lanes {lanes[:written].tolist()}) were written before "
                 f"this error, rows {written}..{n - 1} were not")
            raise

    def extend(self, batch: Any, lane: int, timeout: float | None) -> None:
        """Check and write rows of every stored field, hidden ones included (for the
        capabilities that keep fields of their own: episodes, priorities)."""
        arrays, n = self.schema.check_rows(batch, single=False)
        self.write([a[0] for a in arrays] if n == 1 else arrays, n, lane, timeout)

    def prefault(self, lane: int | None = None) -> None:
        """Map the pages of one lane (or all) into this process now."""
        layout = self.layout
        lanes = range(layout.lanes) if lane is None else [lane]
        lc = layout.lane_capacity
        ranges = [(layout.rows_offset + layout.row_stride * i * lc, layout.row_stride * lc) for i in lanes]
        ranges += [(f.offset + f.row_bytes * i * lc, f.row_bytes * lc) for f in self.fields
                   for i in lanes if not f.packed]
        self.seg.populate(ranges)
        for i in lanes:
            self.prefaulted[i] = 1

    def flush(self, timeout: float | None) -> None:
        """A durability point of a buffer file (see :mod:`shmbuf.core.durable`)."""
        durable.flush(self.ring, self.seg, self.seconds(timeout), self.writes.flushing)

    # -- reading ---------------------------------------------------------------------

    def sample(self, n: int, rows: int, timeout: float | None, read: Callable[[float], T]) -> T:
        """``read(seconds)`` (a sampler's call into the read path) for ``n`` items of
        ``rows`` rows in all, after the rate gate lets ``n`` samples through, with what
        the gate left of ``timeout``; counted in the stats. Every sampler of every
        capability is called this way."""
        timeout = self.seconds(timeout)
        counted, left = [0], timeout
        try:
            left = self.gate.before_sample(n, timeout, counted)
            got = read(rest(left, timeout))
        except BaseException as exc:
            if counted[0]:  # (a sample counts when it is returned: the gate's count given back)
                self.gate.give_back(counted[0], exc)
            note(exc, timeout, left)
            raise
        self.counters.sampled(rows)
        return got

    def read(self, sampler: Sampler, n: int, rows: int, timeout: float | None, out: Any = None) -> Any:
        """``n`` items of ``sampler`` (``rows`` rows in all) through the one read path
        (:func:`shmbuf.core.read.read`), after the rate gate lets ``n`` samples through;
        counted in the stats. The way in for a sampler outside the core."""
        self.writes.check_sample()
        return self.sample(n, rows, timeout, lambda left: read(sampler, n, left, out))

    def window(self) -> tuple[np.ndarray, np.ndarray]:
        """Per lane: ``(lo, head)``, the sequence numbers of the rows that count now (a
        sampler's draw looks here; whatever it draws is proven by :meth:`gather`)."""
        return self.ring.window()

    def rows_at(self, lane: Any, position: Any, window: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """The sequence number of the row each slot ``(lane, position)`` holds (its lane's
        newest row at that position, by ``window``, default :meth:`window`); a slot that
        holds no row gives one below its lane's ``lo``. A guide: :meth:`gather` proves it."""
        lo, head = self.window() if window is None else window
        last = head[lane] - 1
        return last - (last - np.asarray(position)) % self.layout.lane_capacity

    def heads(self) -> np.ndarray:
        """Every lane's head: the rows ever written to it (a copy; heads only grow)."""
        return self.ring.lane_table[:, LANE_HEAD].copy()

    def bases(self) -> np.ndarray:
        """Every lane's base: its first row since the last clear or restore (a copy)."""
        return self.ring.lane_table[:, LANE_BASE].copy()

    def view(self, field: str) -> np.ndarray:
        """Field ``field`` of every slot (``(capacity, *shape)``, lane after lane),
        read-only and unchecked: what a facade shows as its library does, or a guide
        that the checked gather then proves."""
        v = self.ring.arrays[field].view()
        v.flags.writeable = False
        return v

    def column(self, field: str) -> np.ndarray:
        """Field ``field`` of every slot, writable: for a part that keeps a value of its
        own per row beside the rows' data (``max_times_sampled``'s counts), which it
        changes under the header lock, on published rows only, checking their stamps
        (:meth:`published`) before and after."""
        return self.ring.arrays[field]

    def published(self, lanes: Any, seqs: np.ndarray) -> np.ndarray:
        """Which rows ``(lanes, seqs)`` carry their published stamp now (unchecked: a
        guide, as :meth:`view`)."""
        lc = self.layout.lane_capacity
        return self.ring.stamps[np.asarray(lanes) * lc + seqs % lc] == published(seqs)

    @property
    def flushes(self) -> int:
        """How many durability points a buffer file has had (0 for ``/dev/shm``)."""
        return int(self.ring.control[CTRL_FLUSHES])

    def writing(self) -> bool:
        """Whether a live writer has rows reserved and not yet published (the rows a
        sampler found unpublished may then still come)."""
        return self.ring.live_writers_in_flight()

    def gather(self, lane: Any, first: np.ndarray, length: int, out: list[Any], **filters: Any) -> np.ndarray | None:
        """The checked gather (:func:`shmbuf.core.gather.copy_windows`) of the windows
        ``(lane, first)`` of ``length`` rows into ``out`` (one array or None per field,
        in field order): None if all are intact, else the mask of the intact ones."""
        return gather.copy_windows(self.ring, lane, first, length, None, out, **filters)

    def sample_windows(self, n: int, length: int, arrays: list[np.ndarray], timeout: float | None,
                       lane: int | None = None, index: np.ndarray | None = None) -> None:
        """Fill ``arrays`` (one per stored field, ``(n * length, *shape)``) with ``n``
        intact windows drawn uniformly (of ``lane`` only, if given); ``index`` (int64
        ``(n,)``, if given) gets the slot of each window's first row."""
        self.writes.check_sample()
        if lane is not None:
            lane = self.resolve_lane(lane, 0)
        self.sample(n, n * length, timeout,
                    lambda left: gather.sample_windows(self.ring, self.rng, n, length, arrays, left, lane, index))

    # -- lanes -----------------------------------------------------------------------

    @property
    def lane(self) -> int | None:
        """The lane this handle has claimed (None: none, or claimed by the parent of a fork)."""
        return self._lane if self._lane_pid == os.getpid() else None

    def resolve_lane(self, lane: int | None, timeout: float) -> int:
        """``lane`` checked; for None the claimed lane (claimed now if there is none)."""
        lanes = self.layout.lanes
        if lane is None:
            if lanes == 1:
                return 0
            if self.lane is None:
                self.claim_lane(None, timeout)
            return self._lane  # type: ignore[return-value]
        if isinstance(lane, bool) or not isinstance(lane, (int, np.integer)) or not 0 <= lane < lanes:
            raise ValueError(f"lane must be an int in [0, {lanes}), got {lane!r}")
        return int(lane)

    def claim_lane(self, lane: int | None, timeout: float) -> int:
        """Claim ``lane`` (None: any free one) for this handle; see ``Buffer.claim_lane``."""
        if self.lane is not None:
            if lane is None or lane == self._lane:
                return self._lane  # type: ignore[return-value]
            raise RuntimeError(f"this handle already claimed lane {self._lane}; release_lane() first")
        if lane is not None:
            lane = self.resolve_lane(lane, 0)
        got = self.ring.claim(lane, timeout)
        self._lane, self._lane_pid = got, os.getpid()
        self.configure()
        return got

    def release_lane(self, timeout: float) -> None:
        """Give up this handle's lane claim (no-op without one)."""
        if self.lane is not None:
            self.ring.release(self._lane, timeout)
        self._lane = None
        if not self.closed:
            self.configure()

    # -- lifetime --------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Release the lane and the stats slot, then unmap (and unlink, for the owner)."""
        if self.closed:
            return
        try:
            self.release_lane(1.0)
        except (TimeoutError, OSError, ValueError):
            pass  # the kernel and the liveness check free it anyway
        self.counters.release()
        self.ring = self.writes = self.priorities = self.gate = self.records = Closed(self.name)  # (any use says so)
        self.native = self._rows = None  # calls go to the ring, which says it is closed
        self._finalizer()

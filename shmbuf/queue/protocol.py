"""Queue mode: rows consumed in order, each delivered to exactly one ``take``.

A queue is a ring whose writers never overwrite a row that was not taken: a lane's
``base`` (see :mod:`shmbuf.core.ring`) is its *delivered* frontier, and a reservation
that would reach past ``base + lane_capacity`` is refused (``QueueFull``) and waits,
backing off, until takers free room. A region of the segment holds::

    head    rows taken, rows given back, takes, rows skipped (dead writers'), ns takers
            waited for rows, ns writers waited for room, rows passed over as stale, a spare word
    next    per lane: the first row no take has claimed yet
    takes   T entries: state (0 free, 1 taking, 2 given back), pid, start time, lane,
            start, count, time of the oldest row, token

**Taking** (:meth:`Queue.take`):

1. Under the header lock: entries of takers that died (or of this process's takes
   that no thread runs any more, after a Ctrl-C) are *given back* (state 2). Then the
   rows are chosen: given-back ranges first, oldest first; then, per lane, the rows
   from ``next`` up to the first row a live writer still holds (rows of writers that
   died, and with a take's ``skip`` its stale rows, are passed over), merged across
   lanes by the monotonic time each write began. The chosen rows of a lane are always a
   prefix of its rows. ``next`` moves past them (and the rows passed over); an entry of
   ours spans our rows of a range, the stale ones between them unpublished
   (:func:`~shmbuf.queue.takes.unpublish`); until the change commits, nothing else changed.
2. Outside the lock: copy the rows through the read path's checked gather. They cannot
   change meanwhile (writers wait for ``base``, which our entries hold back).
3. Under the lock, with Ctrl-C held off (:mod:`shmbuf.core.interrupts`): free our
   entries and count the rows delivered (one commit: from here on the rows are
   delivered), and move each lane's ``base`` to its oldest row still claimed or not
   yet taken.

A taker SIGKILLed before step 3's commit leaves entries with a dead pid: the next take
gives them back and delivers them before newer rows. An exception (Ctrl-C) before the
commit gives them back at once; a Ctrl-C that lands after it is raised once step 3 is
done, and the rows, already delivered, are kept for this handle's next take, which
returns them first and goes on past them. A writer killed mid-write leaves rows that are
never published: takes skip them once no live writer holds them. A queue in a file takes
up its words from its last flush after a restart (:mod:`shmbuf.queue.restart`).
"""

from __future__ import annotations

import itertools
import time
from contextlib import contextmanager, suppress
from typing import Any, Callable, Iterator

import numpy as np

from shmbuf.core import procs
from shmbuf.core.interrupts import Deferred
from shmbuf.core.layout import LANE_BASE, LANE_HEAD
from shmbuf.core.lock import HeaderLock, LockTimeout
from shmbuf.core.read import SampleTimeout, read
from shmbuf.core.ring import QueueFull, WriteTimeout
from shmbuf.core.tables import BeyondHorizon
from shmbuf.queue import restart, takes
from shmbuf.queue.takes import (E_COUNT, E_CTIME, E_LANE, E_PID, E_START, E_STATE, E_TOKEN, FIELD, FREE,  # noqa: F401
                    H_RETURNED, H_SKIPPED, H_STALE, H_TAKE_WAIT, H_TAKEN, H_TAKES, H_WRITE_WAIT, HEAD_WORDS,
                    RETURNED, TAKING, WIDTH)

REGION = "queue"
HOOK: Callable[[str, Any], None] | None = None
"""Test hook, called as ``HOOK(point, rows)`` in a take at "claimed" (rows claimed, lock
released, nothing copied; rows None), "copied" (the rows copied, not yet delivered),
"delivering" (the lock held and Ctrl-C held off for the delivery, not yet committed) and
"delivered" (the rows delivered, not yet returned), and in every change at "commit"
(journal committed, words not yet written). Never set outside tests."""
GIVE_BACK = True
"""Test switch: False drops a dead taker's rows instead of giving them back (the storm
test proves with it that it would see rows lost). Never set outside tests."""

_TOKENS = itertools.count(1)
_TAKING: set[int] = set()  # tokens of this process's takes in flight


def region_bytes(lanes: int) -> int:
    """The words (:func:`~shmbuf.queue.takes.words`), then the journal."""
    return 8 * (takes.words(lanes) + 1 + 2 * takes.words(lanes))


LOCK_FLOOR = 0.05
"""Seconds a take still waits for the header lock at its deadline (to settle what it holds)."""


class Words:
    """Views of the queue's words: the live ones, or a copy being edited."""

    def __init__(self, w: np.ndarray, lanes: int) -> None:
        self.w = w
        self.head = w[:HEAD_WORDS]
        self.next = w[HEAD_WORDS:HEAD_WORDS + lanes]
        self.table = w[HEAD_WORDS + lanes:].reshape(-1, WIDTH)
        self.table_f = self.table.view(np.float64)


class Queue:
    """A queue's take protocol and room wait over one engine's ring (see the module).

    **Every change is all or nothing.** A change (a claim, a delivery, a give-back) is
    made on a copy of the words under the header lock, then committed through a redo
    journal: the changed words and their new values are written, then their count (one
    store: the commit), then the words themselves, then the count is zeroed. Whoever
    takes the lock next and finds a count applies the journal again (a holder killed
    mid-change), so a SIGKILL at any instant leaves the change made or not made.
    """

    def __init__(self, ring: Any, lock: HeaderLock, region: tuple[int, int], mem: Any,
                 kept: tuple[int, int] | None = None) -> None:
        off, size = region
        lanes = ring.lanes
        if size != region_bytes(lanes):
            from shmbuf.core.segment import FormatError
            raise FormatError(f"the queue region holds {size} bytes, expected {region_bytes(lanes)}")
        self.ring, self.lock, self.lanes = ring, lock, lanes
        ring.bounded = True  # (its writes never pass a lane's room)
        self.n = takes.words(lanes)
        words = np.ndarray((size // 8,), np.int64, mem, off)
        self.live = Words(words[:self.n], lanes)
        self.journal = words[self.n:]
        self.head, self.next, self.table = self.live.head, self.live.next, self.live.table
        self.names = [f.name for f in ring.layout.fields]
        self._kept = takes.Kept()  # rows delivered to this handle's takes, not returned (a Ctrl-C)
        self.finish: Callable[[Any, float, float, Any], Any] = lambda b, deadline, timeout, reuse: b  # (ragged: its part's)
        self.kept = None if kept is None else restart.Kept(mem, kept, lanes)  # (a queue in a file's)

    # -- changes ---------------------------------------------------------------------

    @contextmanager
    def _edit(self, timeout: float) -> Iterator[Words]:
        """Hold the lock; yield a copy of the words; commit it if the body returns."""
        with self.lock.hold(timeout):
            self._replay()
            edit = Words(self.live.w.copy(), self.lanes)
            self._reap(edit)
            yield edit
            self._commit(edit.w)

    def _commit(self, w: np.ndarray) -> None:
        changed = np.flatnonzero(w != self.live.w)
        k = len(changed)
        if k:
            j = self.journal
            j[1:1 + k], j[1 + self.n:1 + self.n + k] = changed, w[changed]
            j[0] = k  # the commit
            if HOOK is not None:
                HOOK("commit", None)
            self.live.w[changed] = w[changed]
            j[0] = 0
        self._settle()

    def _replay(self) -> None:
        """(Under the lock) finish a change whose maker died halfway."""
        j = self.journal
        k = int(j[0])
        if k:
            if 0 < k <= self.n:
                at, values = j[1:1 + k], j[1 + self.n:1 + self.n + k]
                ok = (at >= 0) & (at < self.n)
                self.live.w[at[ok]] = values[ok]
            j[0] = 0
        self._settle()

    def _settle(self) -> None:
        """(Under the lock) move each lane's base to its oldest row still claimed or
        given back, or not yet claimed: the rows below it are delivered, their slots free."""
        t, lt = self.table.copy(), self.ring.lane_table
        heads = lt[:, LANE_HEAD].copy()
        low = np.minimum(self.next, heads)
        used = (t[:, E_STATE] != FREE) & (t[:, E_LANE] >= 0) & (t[:, E_LANE] < self.lanes)
        np.minimum.at(low, t[used, E_LANE], t[used, E_START])
        lt[:, LANE_BASE] = np.maximum(lt[:, LANE_BASE], low)

    # -- writing ---------------------------------------------------------------------

    stamp = staticmethod(takes.stamp)

    def put(self, lane: int, n: int, arrays: list[np.ndarray], timeout: float) -> None:
        """Write ``n`` rows into ``lane``, waiting (backing off) while it is full."""
        start = time.monotonic()
        deadline, delay = start + timeout, 0.0
        while True:
            try:
                try:
                    self.ring.put(lane, n, arrays, max(0.0, deadline - time.monotonic()))
                    break
                except BeyondHorizon:  # (a queue in a file: QueueFull if it would pass the room)
                    self.ring.reach(lane, n, max(0.0, deadline - time.monotonic()))
                    continue
            except QueueFull as exc:
                if time.monotonic() >= deadline:
                    raise WriteTimeout(takes.full(self.ring, self.table.copy(), lane, n, timeout, exc.args)) from None
                delay = takes.backoff(delay)
        if delay:  # (counted if the lock comes within the call's time: the rows are in)
            with suppress(LockTimeout), self._edit(max(LOCK_FLOOR, deadline - time.monotonic())) as s:
                s.head[H_WRITE_WAIT] += int((time.monotonic() - start) * 1e9)

    def room(self, lanes: np.ndarray, timeout: float) -> None:
        """Wait until each of ``lanes`` (a lane per row) has room for its rows (else WriteTimeout)."""
        need, lt = np.bincount(lanes, minlength=self.lanes), self.ring.lane_table
        deadline, delay = time.monotonic() + timeout, 0.0
        while len(short := np.flatnonzero(lt[:, LANE_HEAD] + need > lt[:, LANE_BASE] + self.ring.lane_capacity)):
            if time.monotonic() >= deadline:
                raise WriteTimeout(takes.full(self.ring, self.table.copy(), int(short[0]), int(need[short[0]]), timeout))
            delay = takes.backoff(delay)

    # -- taking ----------------------------------------------------------------------

    def depth(self) -> int:
        """Rows not yet taken: published or being written, plus rows given back or held
        by dead takers (given back at the next change), plus rows kept for this handle."""
        lt = self.ring.lane_table
        nxt = np.clip(self.next, lt[:, LANE_BASE], lt[:, LANE_HEAD])
        t = self.table.copy()
        alive = procs.Liveness()  # (a dead taker's rows are given back at the next change)
        tf = t.view(np.float64)
        dead = [i for i in np.flatnonzero(t[:, E_STATE] == TAKING).tolist()
                if not alive(int(t[i, E_PID]), float(tf[i, E_CTIME]))]
        back = takes.waiting(self.ring, t, np.flatnonzero(t[:, E_STATE] == RETURNED).tolist() + dead)
        return int((lt[:, LANE_HEAD] - nxt).sum()) + back + len(self._kept)

    def take(self, n: int, partial: bool, timeout: float, skip: Any = None, fit: Any = None,
             reuse: Any = None) -> dict[str, Any]:
        """The ``n`` oldest rows (fewer, at least 1, with ``partial``), each delivered
        to this call only; waits up to ``timeout`` for them (see the module). ``skip=(field,
        bound, newest)``: rows whose ``field`` is below ``bound`` are passed over, counted
        as stale, and never delivered (see :func:`shmbuf.queue.takes.usable`); the rows
        delivered count their staleness from ``newest`` (``stats()["sampled_staleness"]``).
        ``fit``: a token budget's (see :func:`shmbuf.queue.takes.claim`); ``reuse``: a
        batch whose ragged values' memory the rows are read into (``take(out=)``).

        Rows kept for this handle come first, then, if fewer than ``n``, a take for
        the rest (partial: of what is there, without waiting), each lane's rows in order
        (:class:`~shmbuf.queue.takes.Kept`; one with ``skip`` passes over those below its
        bound). An exception (Ctrl-C) after delivery keeps them all for the next take."""
        kept = more = None
        if self._kept and skip is not None:  # (kept rows stale by now: passed over, as any stale row)
            self._kept.pass_over(skip, lambda: self._edit(timeout))
        try:
            if self._kept:  # (a budget's take: as many of them as fit it, alone)
                kept = self._kept.out(n if fit is None else min(n, fit.kept(takes.merged(*self._kept.parts)[0])))
                if len(kept[1]) == n or fit is not None:
                    return kept[0]
            try:
                more = self._take(n if kept is None else n - len(kept[1]), partial,
                                  0.0 if kept is not None and partial else timeout, skip, fit, reuse)
            except SampleTimeout:
                if kept is not None and partial:
                    return kept[0]
                raise
            if HOOK is not None:
                HOOK("delivered", None)
            return more[0] if kept is None else takes.merged(kept, more)[0]
        except BaseException:  # (rows delivered to this call and not returned: kept, in order)
            self._kept.back(kept, more)
            raise

    def _take(self, n: int, partial: bool, timeout: float, skip: Any, fit: Any = None,
              reuse: Any = None) -> takes.Rows:
        """A take from the queue's words (the rows kept for this handle aside): the rows,
        and their lanes and sequence numbers."""
        token = next(_TOKENS)
        pid, ctime = procs.identity()
        start = time.monotonic()
        deadline, delay = start + timeout, 0.0
        _TAKING.add(token)
        try:
            while True:
                last = time.monotonic() >= deadline  # (decided before the try: a failed last try raises)
                # (the lock is held for microseconds: a last try after the deadline may wait for it)
                try:
                    with self._edit(max(LOCK_FLOOR, deadline - time.monotonic())) as s:
                        got = takes.claim(self.ring, s, n, partial, pid, ctime, token, skip, fit)
                        if got is None and last:  # (the wait is counted as the call ends)
                            s.head[H_TAKE_WAIT] += int((time.monotonic() - start) * 1e9)
                except LockTimeout:  # (kept busy all this try, as a loaded machine can: no rows this try)
                    got = None
                if got is not None:
                    break
                if last:
                    raise SampleTimeout(
                        f"could not take {n if not partial else 'any'} row(s) within {timeout:g} s: the "
                        f"queue holds {self.depth()} row(s) not yet taken"
                        + ("" if skip is None else f" (rows of {skip[0]} < {skip[1]} are passed over)")
                        + ("" if partial else "; pass partial=True to take fewer"))
                delay = takes.backoff(delay)
            lanes, seqs = got
            if HOOK is not None:
                HOOK("claimed", None)
            # (through the read path: held rows cannot change, so its first copy passes)
            out = read(takes.Taken(self.ring, lanes, seqs), len(seqs), timeout,
                       deadline=max(deadline, time.monotonic() + LOCK_FLOOR))
            out = self.finish(out, max(deadline, time.monotonic() + LOCK_FLOOR), timeout, reuse)  # (ragged values)
            if HOOK is not None:
                HOOK("copied", out)
            return self._deliver((out, lanes, seqs), pid, token, start, deadline, skip)  # (it ends our take)
        except BaseException:  # (the error raised is this one; rows a give-back that cannot get the
            # lock leaves claimed go back at this process's next take, or when it dies)
            try:
                with suppress(LockTimeout), self._edit(max(LOCK_FLOOR, deadline - time.monotonic())) as s:
                    self._give_back(s, self._mine(s, pid, token))
            finally:
                _TAKING.discard(token)
            raise

    def _deliver(self, got: takes.Rows, pid: int, token: int, start: float, deadline: float,
                 skip: tuple[str, int, int] | None) -> takes.Rows:
        """Step 3 of a take: deliver the rows copied (``got``: them, their lanes and
        sequence numbers) and end the take, with Ctrl-C held off
        (:mod:`shmbuf.core.interrupts`). An interrupt that landed before the commit gives
        the rows back; one that lands after it keeps them for this handle's next take."""
        k = len(got[1])
        d = Deferred()
        delivered = False
        try:
            d.__enter__()
            with self._edit(max(LOCK_FLOOR, deadline - time.monotonic())) as s:
                mine = self._mine(s, pid, token)
                if HOOK is not None:
                    HOOK("delivering", None)
                if d.pending:  # interrupted before the commit: given back (raised on exit)
                    self._give_back(s, mine)
                else:
                    s.table[mine, E_STATE] = FREE  # delivered, once committed
                    s.head[H_TAKEN] += k
                    s.head[H_TAKES] += 1
                    s.head[H_TAKE_WAIT] += int((time.monotonic() - start) * 1e9)
                    delivered = True
            _TAKING.discard(token)
            if delivered:
                self.ring.counters.sampled(k)
                if skip is not None:
                    self.ring.counters.stale(skip[2], got[0][skip[0]])
            d.__exit__()
        except BaseException:
            if delivered:  # (the rows are ours alone now: kept for the next take)
                self._kept.back(got)
            d.__exit__()
            raise
        return got

    @staticmethod
    def _mine(s: Words, pid: int, token: int) -> np.ndarray:
        t = s.table
        return np.flatnonzero((t[:, E_STATE] == TAKING) & (t[:, E_PID] == pid) & (t[:, E_TOKEN] == token))

    def _give_back(self, s: Words, which: np.ndarray) -> None:
        """Entries whose taker will never return them: given back (counted: the rows
        in them a later take may deliver)."""
        if len(which):
            if GIVE_BACK:
                s.table[which, E_STATE] = RETURNED
                s.head[H_RETURNED] += takes.waiting(self.ring, s.table, which)
            else:
                s.table[which, E_STATE] = FREE

    def _reap(self, s: Words) -> None:
        """Give back the entries of dead takers and of this process's takes that no
        thread runs any more; free entries that cannot be right."""
        t = s.table
        lt = self.ring.lane_table
        state = t[:, E_STATE]
        bad = (state < FREE) | (state > RETURNED)
        used = np.flatnonzero(~bad & (state != FREE))
        if len(used):
            lane = t[used, E_LANE]
            ok = (lane >= 0) & (lane < self.lanes)
            ln = np.where(ok, lane, 0)
            ok &= (t[used, E_COUNT] >= 0) & (t[used, E_START] >= lt[ln, LANE_BASE]) \
                & (t[used, E_START] + t[used, E_COUNT] <= np.minimum(s.next[ln], lt[ln, LANE_HEAD]))
            bad[used[~ok]] = True
        t[bad, E_STATE] = FREE
        me = procs.identity()[0]
        alive = procs.Liveness()
        gone = [i for i in np.flatnonzero(t[:, E_STATE] == TAKING).tolist()
                if (int(t[i, E_TOKEN]) not in _TAKING if int(t[i, E_PID]) == me
                    else not alive(int(t[i, E_PID]), float(s.table_f[i, E_CTIME])))]
        self._give_back(s, np.array(gone, np.int64))

    # -- whole-queue operations ------------------------------------------------------

    @contextmanager
    def quiet(self, timeout: float) -> Iterator[np.ndarray]:
        """Hold the lock with no take in flight (dead takers' rows given back):
        yields every lane's ``[head, base, 0]``; the rows from base to head are exactly
        the rows not yet taken, and stay so while this is held."""
        deadline, delay = time.monotonic() + timeout, 0.0
        while True:
            with self._edit(max(0.0, deadline - time.monotonic())):
                pass  # (a dead taker's rows given back, committed)
            with self.lock.hold(max(0.0, deadline - time.monotonic())):
                self._replay()
                if not (self.table[:, E_STATE] == TAKING).any():
                    lt = self.ring.lane_table
                    yield np.stack([lt[:, LANE_HEAD], lt[:, LANE_BASE], 0 * lt[:, LANE_BASE]], 1)
                    return
            if time.monotonic() >= deadline:
                raise WriteTimeout(f"takes were still in flight after {timeout:g} s")
            delay = takes.backoff(delay)

    def delivered(self, stamps: np.ndarray) -> np.ndarray:
        """(Under :meth:`quiet`) which of ``stamps`` name rows already delivered (see
        :func:`shmbuf.queue.takes.delivered`): a snapshot leaves them out."""
        return takes.delivered(self.live, self.ring.lane_capacity, stamps)

    def reset(self, timeout: float) -> None:
        """After a restore: every row from base to head is untaken, no entry."""
        with self._edit(timeout) as s:
            s.table[:, E_STATE] = FREE
            s.next[:] = self.ring.lane_table[:, LANE_BASE]

    def flushing(self) -> None:
        """(Under the lock, at a flush) a snapshot of the words (:mod:`shmbuf.queue.restart`)."""
        if self.kept is not None:
            self._replay()
            self.kept.keep(self.live.w)

    def rolled_back(self) -> None:
        """(Under the lock, the lanes rolled back at a restart) the words of the newest
        snapshot, fitted to the rows left; takes in flight then give their rows back."""
        restart.recover(self.kept, self.live, self.journal, self.ring, self._give_back)

    def clear(self, timeout: float) -> None:
        """Drop every row not yet taken (takes in flight still deliver theirs)."""
        with self._edit(timeout) as s:
            s.table[s.table[:, E_STATE] == RETURNED, E_STATE] = FREE
            s.next[:] = self.ring.lane_table[:, LANE_HEAD]

    size = depth

    def check_take(self) -> None:
        pass

    @staticmethod
    def check_rows(arrays: dict[str, np.ndarray], kept: np.ndarray) -> None:
        """Raise the ``ValueError`` of a state dict with rows this part refuses (none)."""

    def check_truncate(self) -> None:
        raise ValueError("a queue never drops rows: truncate_ok= is for replay buffers")

    def check_sample(self) -> None:
        raise ValueError("this buffer is a queue (mode='queue'): its rows are consumed in order with "
                         "take(n), not sampled; create a replay buffer (the default mode) to sample")

    def stats(self) -> dict[str, Any]:
        h = self.head
        return {"queue_depth": self.depth(), "rows_taken": int(h[H_TAKEN]), "takes": int(h[H_TAKES]),
                "rows_given_back": int(h[H_RETURNED]), "rows_skipped": int(h[H_SKIPPED]), "rows_stale": int(h[H_STALE]),
                "take_wait_s": int(h[H_TAKE_WAIT]) / 1e9, "write_wait_s": int(h[H_WRITE_WAIT]) / 1e9}


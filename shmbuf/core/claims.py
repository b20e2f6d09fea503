"""Who holds what: lane claims (a process that claims a lane alone writes it, without
the lock; a dead claimer's lane is free again) and the rows live writers have
reserved and not finished. Part of :class:`shmbuf.core.ring.Ring`."""

from __future__ import annotations

import fcntl
import time
from typing import Any

import numpy as np

from shmbuf.core import procs
from shmbuf.core.layout import (LANE_CLAIM_CTIME, LANE_CLAIM_PID, LANE_OWN_COUNT, LANE_OWN_START, RES_COUNT, RES_LANE,
                     RES_PID, RES_START, RES_TOKEN)
from shmbuf.core.tables import owners


class NoFreeLane(RuntimeError):
    """Every lane of the buffer is claimed by a live process (nothing was claimed)."""


class Claims:
    """Lane claims and live reservations, over a ring's tables."""

    lanes: int
    lane_table: np.ndarray
    lane_table_f: np.ndarray
    res: np.ndarray
    res_pid: np.ndarray
    lock: Any
    stamps: np.ndarray
    _hint: Any  # (a threading.local: the entry this thread used last)
    write_timeout: type  # WriteTimeout (of ring.py)

    def live_claims(self) -> dict[int, int]:
        """``{lane: pid}`` of the lanes claimed by live processes."""
        lt = self.lane_table.copy()
        ctimes = lt.view(np.float64)[:, LANE_CLAIM_CTIME]
        return {int(i): int(lt[i, LANE_CLAIM_PID]) for i in np.flatnonzero(lt[:, LANE_CLAIM_PID])
                if procs.is_alive(int(lt[i, LANE_CLAIM_PID]), float(ctimes[i]))}

    def claim(self, lane: int | None, timeout: float) -> int:
        """Claim a free lane (or the given one) for the calling process: from now on it
        alone writes that lane, without the lock. A dead claimer's lane is free; what it
        left half-written keeps stamps that no sampler accepts."""
        pid, ctime = procs.identity()
        table, table_f = self.lane_table, self.lane_table_f
        with self.lock.hold(timeout):
            candidates = range(self.lanes) if lane is None else [lane]
            for i in candidates:
                owner = int(table[i, LANE_CLAIM_PID])
                if owner == 0 or not procs.is_alive(owner, float(table_f[i, LANE_CLAIM_CTIME])):
                    table[i, LANE_OWN_COUNT] = 0  # a dead owner's write in flight is dead
                    table_f[i, LANE_CLAIM_CTIME] = ctime
                    table[i, LANE_CLAIM_PID] = pid
                    return i
        if lane is None:
            raise NoFreeLane(
                f"all {self.lanes} lanes are claimed by live processes; create the buffer with "
                "more lanes, or release a lane (Buffer.release_lane) in a writer that is done")
        raise RuntimeError(f"lane {lane} is claimed by live process {int(table[lane, LANE_CLAIM_PID])}")

    def claim_many(self, n: int, timeout: float) -> list[int]:
        """Claim ``n`` free lanes (a writer's envs, one each) within ``timeout`` in all:
        all or none, the ones already claimed given back if one cannot be."""
        got: list[int] = []
        deadline = time.monotonic() + timeout
        try:
            for _ in range(n):
                got.append(self.claim(None, max(0.0, deadline - time.monotonic())))
        except BaseException:
            deadline = max(deadline, time.monotonic() + 0.05)  # (a moment to give them back, at least)
            for lane in got:
                self.release(lane, max(0.0, deadline - time.monotonic()))
            raise
        return got

    def release(self, lane: int, timeout: float) -> None:
        """Give up this process's claim of ``lane`` once its write in flight there (of
        another thread) is published: writers that come next reserve after it."""
        deadline = time.monotonic() + timeout
        with self.lock.hold(timeout):
            if int(self.lane_table[lane, LANE_CLAIM_PID]) != procs.identity()[0]:
                return
            delay = 20e-6
            while self.lane_table[lane, LANE_OWN_COUNT] != 0:
                if time.monotonic() >= deadline:
                    raise self.write_timeout(f"release_lane: a write of this process to lane {lane} is "
                                       f"still in flight after {timeout:g} s")
                time.sleep(delay)
                delay = min(2 * delay, 1e-3)
            self.lane_table[lane, LANE_CLAIM_PID] = 0

    def _make_way(self, lane: int, timeout: float) -> None:
        """For the native path, which leaves these to Python: drop a dead process's claim
        of ``lane`` (an error if a live one claims it), and free the entries of dead
        writers if the reservation table is full."""
        lock = self.lock
        lock.acquire(timeout)
        try:
            if self._may_share(lane, procs.identity()[0]):
                self._free_entry()
        finally:  # lock.release(), inlined: on the write path an interrupt must never fall
            try:  # between taking the lock and giving it back (a `with`'s __exit__ is a call,
                fcntl.flock(lock.held_fd, fcntl.LOCK_UN)  # which a Ctrl-C can precede)
            finally:
                lock.busy[0] = 0
                lock.thread_lock.release()

    def refuse_theirs(self, lanes: np.ndarray) -> None:
        """Raise the ``RuntimeError`` of a write to one of ``lanes`` (an int64 array) that
        another live process claims (only it may write there); nothing is changed."""
        claims = self.lane_table[lanes, LANE_CLAIM_PID]
        pid = procs.identity()[0]
        for i in np.flatnonzero((claims != 0) & (claims != pid)).tolist():  # (rare: a lane of another)
            lane, owner = int(lanes[i]), int(claims[i])
            if procs.is_alive(owner, float(self.lane_table_f[lane, LANE_CLAIM_CTIME])):
                raise RuntimeError(_theirs(lane, owner))

    def _may_share(self, lane: int, pid: int) -> bool:
        """Under the lock: may this process reserve rows of ``lane`` as a shared writer?
        True if nobody claims it (a dead claimer's claim is dropped here); False if this
        process claims it (then it writes as the owner); an error if another live
        process does (owners write without the lock, so nobody else may)."""
        lt = self.lane_table
        owner = int(lt[lane, LANE_CLAIM_PID])
        if owner == 0:
            return True
        if owner == pid:
            return False
        if procs.is_alive(owner, float(self.lane_table_f[lane, LANE_CLAIM_CTIME])):
            raise RuntimeError(_theirs(lane, owner))
        lt[lane, LANE_OWN_COUNT] = 0  # the dead owner's write in flight, if any, is dead
        lt[lane, LANE_CLAIM_PID] = 0
        return True

    def live_writers_in_flight(self) -> bool:
        """True if some live process has rows reserved and not yet published."""
        res = self.res.copy()
        live = np.flatnonzero((res[:, RES_PID] != 0) & ~self._leftover(res))
        if any(procs.is_alive(pid, ct) for pid, ct in owners(res, live)):
            return True
        return any(self.lane_table[i, LANE_OWN_COUNT] != 0 for i in self.live_claims())

    def held(self, lane: np.ndarray, seq: np.ndarray) -> np.ndarray:
        """Which rows ``(lane, seq)`` a live writer has reserved and not yet finished
        (published, or abandoned): the only unpublished rows that may still be
        published. Read the rows' stamps again after this: a row finished between
        that read and this one is published by then, or never will be."""
        held = np.zeros(len(seq), bool)
        res = self.res.copy()
        live = np.flatnonzero((res[:, RES_PID] != 0) & ~self._leftover(res))
        alive = procs.Liveness()
        for i, (pid, ct) in zip(live.tolist(), owners(res, live)):
            if alive(pid, ct):
                start = res[i, RES_START]
                held |= (lane == res[i, RES_LANE]) & (seq >= start) & (seq < start + res[i, RES_COUNT])
        lt = self.lane_table.copy()
        for i in self.live_claims():
            start = lt[i, LANE_OWN_START]
            held |= (lane == i) & (seq >= start) & (seq < start + lt[i, LANE_OWN_COUNT])
        return held


    # -- reservations ------------------------------------------------------------------

    def _abandon_runs(self, runs: list[tuple[int, int, int]]) -> None:
        for lo, hi, _ in runs:
            self.stamps[lo:hi] = 0

    def _abandon(self, pid: int, token: int, runs: list[tuple[int, int, int]]) -> None:
        """Undo a shared write that raised: its rows will never be valid, its entry is freed.

        The entry is found by (pid, token), not by a local variable, so an interrupt
        that fell anywhere, even between the commit and the next bytecode, is covered;
        a live writer's entry is only ever freed by that writer, so the match is stable.
        """
        self._abandon_runs(runs)
        mine = np.flatnonzero((self.res_pid == pid) & (self.res[:, RES_TOKEN] == token))
        self.res_pid[mine] = 0

    def _free_entry(self) -> int:
        """A free reservation entry (caller holds the lock)."""
        hint = getattr(self._hint, "entry", 0)
        if self.res_pid[hint] == 0:
            return hint
        free = np.flatnonzero(self.res_pid == 0)
        if len(free) == 0:  # reclaim entries of dead writers
            res, alive = self.res.copy(), procs.Liveness()
            for i, (pid, ct) in zip(range(len(res)), owners(res, range(len(res)))):
                if not alive(pid, ct):
                    self.res_pid[i] = 0
            free = np.flatnonzero(self.res_pid == 0)
            if len(free) == 0:
                raise RuntimeError(
                    f"more than {len(self.res_pid)} writes are in flight at once on this buffer; "
                    "use fewer writer threads/processes")
        self._hint.entry = int(free[0])
        return self._hint.entry


def _theirs(lane: int, owner: int) -> str:
    return (f"lane {lane} is claimed by live process {owner}, which writes it without the lock: only "
            "that process may write to it. Write to a lane of your own (claim_lane(), or add() without "
            "lane= on a multi-lane buffer)")

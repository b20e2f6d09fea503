"""Rows sampled at most ``k`` times (``Buffer.create(..., max_times_sampled=k)``), across
every process: Reverb's ``max_times_sampled``, TorchRL's ``consume_after_n_samples``.

Each row keeps its count in the field ``times_sampled`` (written as 0 with the row by
the write part, :class:`shmbuf.limited.counted.Counted`). A sample draws rows uniformly over
the published ones, then, under the header lock, *counts* them: a drawn row is granted
if its stamp names it before and after the count and it has been returned fewer than
``k`` times (the same row twice in a batch counts twice). Only then is it copied, by
the checked gather of the same row (its sequence number, not its slot): a row
overwritten after its count is drawn again, never returned uncounted. Rows with ``k``
samples are skipped from then on (they stay in their slots until writers overwrite
them); when every row held is used up, a sample waits for new rows and raises
``SampleTimeout`` at its deadline, saying so. A sample returns each row's count, this
sample included, as ``times_sampled``.

A sample that raises (its timeout, a Ctrl-C) gives back the counts of the rows it took
so far. What a sampler SIGKILLed mid-call costs: the rows it had counted (at most the
``n`` of that call, one sample each), which stay counted. Counts only ever err that way: a row is never
returned more than ``k`` times. A count written to a slot that a writer is overwriting
at that instant may land on the new row (which is then sampled fewer times, never
more). In a buffer file the counts are in the file like the rows; a power loss may
bring back counts not yet flushed (a process that crashes loses none).

Examples:
    >>> import numpy as np, shmbuf
    >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 8, max_times_sampled=1, seed=0)
    >>> buf.extend({"x": np.arange(4)})
    >>> sorted(buf.sample(4)["x"].tolist())
    [0, 1, 2, 3]
    >>> buf.sample(1, timeout=0.05)
    Traceback (most recent call last):
    ...
    shmbuf.core.read.SampleTimeout: could not copy 1 intact rows within 0.05 s: every row the buffer holds (4) was sampled max_times_sampled=1 times
    >>> buf.close()
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import numpy as np

from shmbuf.core.engine import Engine
from shmbuf.core import pool
from shmbuf.core.lock import LockTimeout
from shmbuf.limited.counted import TIMES
from shmbuf.core.read import Sampler, read
from shmbuf.core.gather import draw_in
from shmbuf.samplers.uniform import Uniform

LOCK_FLOOR = 0.05  # seconds a count waits for the header lock, even at its deadline
HOOK: Callable[[str], None] | None = None
"""Test hook, called as ``HOOK(point)`` in a count: "counted" (under the lock, the counts
written) and "released" (the lock released, nothing copied yet); and in a give-back at
"giving back" (under the lock, the rows still in their slots found, not yet counted down)."""


class Limited(Uniform):
    """The sampler of a buffer created with ``max_times_sampled=k`` (see the module)."""


    def sample(self, n: int, out: Any, timeout: float | None, beta: Any) -> Any:
        if beta is not None:
            raise ValueError("beta= is for a prioritized buffer: create it with priority=<exponent>")
        out, _ = self.outputs.prepare(out, (n,))
        return self.engine.sample(n, n, timeout, lambda t: Counts(self.engine, t).read(n, out))


class Counts(Sampler):
    """Rows drawn uniformly, counted under the lock, then gathered (see the module)."""

    def __init__(self, engine: Engine, timeout: float) -> None:
        self.engine, self.timeout = engine, timeout
        self.k = engine.writes.k  # (the write part of such a buffer: shmbuf.limited.counted)
        self.fields, self.lc = engine.fields, engine.layout.lane_capacity
        self.times = engine.column(TIMES)
        self.delay, self.deadline = 0.0, 0.0
        self.kept: list[tuple[np.ndarray, np.ndarray]] = []  # the rows this call counted

    def read(self, n: int, out: Any) -> Any:
        """``n`` rows through the read path; if it raises (a timeout, Ctrl-C), the rows
        counted for it are given back first."""
        try:
            return read(self, n, self.timeout, out)
        except BaseException:
            self.give_back()
            raise

    def give_back(self) -> None:
        """Count down the rows this call counted (it returns none), those still in
        their slots, and only those: under the lock (no other sampler counts
        meanwhile), each counted row's slot is checked to still hold that row (its
        stamp), counted down, then checked again. Writers take no lock, so one may
        overwrite a slot between the two checks and the count down may land on its new
        row (written with 0 before or after it): such a slot is counted up again,
        which leaves the new row counted too high (returned fewer times), never too low.
        (A writer stamps a slot odd before it writes the row's count, so a count down
        that read the new row's count sees the new stamp in the second check.)"""
        if not self.kept:
            return
        lane, seq = (np.concatenate(a) for a in zip(*self.kept))
        try:
            with self.engine.lock.hold(max(LOCK_FLOOR, self.deadline - time.monotonic())):
                here = self.engine.published(lane, seq)
                lane, seq = lane[here], seq[here]
                slot = lane * self.lc + seq % self.lc
                if HOOK is not None:
                    HOOK("giving back")
                np.subtract.at(self.times, slot, 1)
                np.add.at(self.times, slot[~self.engine.published(lane, seq)], 1)  # (overwritten meanwhile)
        except LockTimeout:
            pass  # (they stay counted: returned fewer times, never more)

    def empty(self, m: int) -> dict[str, np.ndarray]:
        return pool.batch(self.fields, m)

    def rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows the buffer holds (lanes, seqs) and which are not used up (a scan of
        the counts: a guide, read without the lock)."""
        lo, head = self.engine.window()
        lanes = np.repeat(np.arange(len(lo)), head - lo)
        seqs = np.concatenate([np.arange(a, b) for a, b in zip(lo.tolist(), head.tolist())] + [np.zeros(0, np.int64)])
        return lanes, seqs, self.times[lanes * self.lc + seqs % self.lc] < self.k

    @property
    def hint(self) -> str:  # (read when a timeout is raised: what is true then)
        lanes, _, live = self.rows()
        if not len(lanes) or live.any():
            return ""
        mine = sum(len(k[0]) for k in self.kept)
        return (f": every row the buffer holds ({len(lanes)}) was sampled max_times_sampled={self.k} times"
                + (f", counting the {mine} this sample took (given back now)" if mine else ""))

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> Any:
        self.deadline = deadline
        lo, head = self.engine.window()
        sizes = head - lo
        if int(sizes.sum()) == 0:
            raise ValueError("cannot sample from an empty buffer: add rows first")
        m = len(todo)
        if rounds < 2:  # uniform over the window (rows used up are turned down by the count)
            return draw_in(self.engine.rng, m, lo.tolist(), sizes.tolist())
        # many turned down: draw from the rows not used up
        lanes, seqs, live = self.rows()
        if not live.any():
            time.sleep(self.delay)
            self.delay = min(max(self.delay * 2, 50e-6), 2e-3)
            return None
        pick = np.flatnonzero(live)[self.engine.rng.integers(0, int(live.sum()), m)]
        return lanes[pick], seqs[pick]

    def count(self, lane: np.ndarray, seq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Under the header lock: which of the rows ``(lane, seq)`` are granted, and the
        count each granted one then has (see the module)."""
        slot = lane * self.lc + seq % self.lc
        order = np.argsort(slot, kind="stable")
        s = slot[order]
        first = np.concatenate(([True], s[1:] != s[:-1]))
        rank = np.arange(len(s)) - np.maximum.accumulate(np.where(first, np.arange(len(s)), 0))
        engine, times = self.engine, self.times
        try:
            with engine.lock.hold(max(LOCK_FLOOR, self.deadline - time.monotonic())):
                before = engine.published(lane, seq)[order]
                now = times[s] + rank  # this one's count before it
                grant = before & (now < self.k)
                ends = np.flatnonzero(np.concatenate((s[1:] != s[:-1], [True])))
                g = np.add.reduceat(grant.astype(np.int64), np.flatnonzero(first))
                times[s[ends]] += g  # (one store per row)
                if HOOK is not None:
                    HOOK("counted")
                grant &= engine.published(lane, seq)[order]  # (overwritten meanwhile: not counted for it)
                self.kept.append((lane[order][grant], seq[order][grant]))  # (to give back if this call fails)
        except LockTimeout:
            return np.zeros(len(slot), bool), np.zeros(len(slot), np.int64)
        if HOOK is not None:
            HOOK("released")
        ok, counts = np.empty(len(slot), bool), np.empty(len(slot), np.int64)
        ok[order], counts[order] = grant, now + 1
        return ok, counts

    def gather(self, drawn: Any, out: dict[str, np.ndarray]) -> np.ndarray | None:
        m = len(out[TIMES])
        if drawn is None:
            return np.zeros(m, bool)
        lane, seq = drawn
        granted, counts = self.count(lane, seq)
        ok = self.engine.gather(lane, seq, 1, [out[f.name] for f in self.fields])
        out[TIMES][:] = counts
        return granted if ok is None else granted & ok

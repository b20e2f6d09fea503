"""Writers yield to a learner copying a large batch, so unthrottled writers never starve it.

Writers of large rows (atari frames) that write as fast as they can take the cores and
the memory bandwidth a learner's gather needs: on two cores, two writers and a learner
each get two thirds of a core. ``cpprb`` locks writers out while its learner samples. Here
a learner about to copy a batch of at least :data:`LARGE` bytes whose last such copy ran
more than :data:`STARVED` times slower than its fastest stores *until when* writers
should wait (``CTRL_YIELD``: ``CLOCK_MONOTONIC`` nanoseconds, twice what its fastest copy
of that size would take, at most :data:`LONGEST`) and clears it when its copy is done.
So a learner that writers slow down gets every other copy to itself, and one that runs
at its speed (writers idle, or cores and bandwidth to spare) asks nobody to wait.
A writer that finds it set waits, before it reserves any row (the native one also between
the fields it copies), until it is cleared or passes (or its own deadline comes), at most
:data:`LONGEST` in all a write, so writers always get a write in
between a learner's samples, and a learner killed while it copies holds them up once,
for at most :data:`LONGEST` seconds. Both paths: the pure-Python writer waits in
:meth:`shmbuf.core.ring.Ring.put`, the native one in ``write_rows`` (csrc/write.c).

The knob: ``Buffer.create(..., writers_yield=False)`` stores ``CTRL_NO_YIELD``; every
handle then opens with :class:`NoYield` and no learner asks writers to wait.

Examples:
    >>> import numpy as np, shmbuf
    >>> buf = shmbuf.Buffer.create({"frame": ((84, 84), np.uint8)}, 1024, seed=0)
    >>> type(buf.engine.ring.yielding).__name__
    'Yield'
    >>> buf.close()
    >>> buf = shmbuf.Buffer.create({"frame": ((84, 84), np.uint8)}, 1024, writers_yield=False)
    >>> type(buf.engine.ring.yielding).__name__
    'NoYield'
    >>> buf.close()
"""

from __future__ import annotations

import time
from typing import Any

from shmbuf.core.layout import CTRL_NO_YIELD, CTRL_YIELD

LARGE = 1 << 20
"""Bytes a gather copies at least before writers are asked to wait for it."""

LONGEST = 0.02
"""Seconds a writer waits at most for one gather."""

STARVED = 1.5
"""A learner asks writers to wait only while its last large copy took more than this
many times its fastest: writers then yield to a learner they slow down, and to nobody
on a machine with bandwidth and cores to spare."""

_STEP = 50e-6  # seconds between a waiting writer's looks


class Yield:
    """A handle's side of the yielding: as a learner (:meth:`begin`, :meth:`end` around a
    gather) and as a writer (:meth:`wait`)."""

    def __init__(self, control: Any, row_bytes: int) -> None:
        self.control, self.row_bytes = control, row_bytes
        self.per_byte = 0.5e-9  # seconds a byte of this process's last large gather took (first guess: 2 GB/s)
        self.best = float("inf")  # the fastest of them, slowly forgotten

    def begin(self, rows: int) -> tuple[int, int, int] | None:
        """Before a gather of ``rows`` rows: ask writers to wait if it is large; what
        :meth:`end` takes."""
        nbytes = rows * self.row_bytes
        if nbytes < LARGE:
            return None
        t0 = time.monotonic_ns()
        if self.per_byte <= STARVED * self.best:  # (the last copy ran at speed: writers need not wait)
            return 0, t0, nbytes
        until = t0 + int(min(2 * self.best * nbytes, LONGEST) * 1e9)
        self.control[CTRL_YIELD] = until
        return until, t0, nbytes

    def end(self, mark: tuple[int, int, int] | None) -> None:
        """After the gather :meth:`begin` marked: writers go on (unless another learner
        asked them to wait since), and the next estimate learns from this one."""
        if mark is None:
            return
        until, t0, nbytes = mark
        if until and int(self.control[CTRL_YIELD]) == until:
            self.control[CTRL_YIELD] = 0
        self.per_byte = 1e-9 * (time.monotonic_ns() - t0) / nbytes
        self.best = min(self.best * 1.01, self.per_byte)

    def wait(self, deadline: float) -> None:
        """A writer, before it reserves: wait while a learner's gather asks it to, at
        most until that gather's mark passes or ``deadline`` (``time.monotonic()``)."""
        until = int(self.control[CTRL_YIELD])
        if until == 0:
            return
        end = min(until, time.monotonic_ns() + int(LONGEST * 1e9))
        if deadline * 1e9 < end:  # (compared as floats: a deadline may be inf)
            end = int(deadline * 1e9)
        while int(self.control[CTRL_YIELD]) == until and time.monotonic_ns() < end:  # (this copy only)
            time.sleep(_STEP)


class NoYield:
    """A buffer made with ``writers_yield=False``: nobody waits for anybody."""

    def begin(self, rows: int) -> None:
        return None

    def end(self, mark: Any) -> None:
        pass

    def wait(self, deadline: float) -> None:
        pass


def part(control: Any, row_bytes: int) -> Yield | NoYield:
    """The yielding a handle opens with, as the segment says (``row_bytes``: the bytes of
    a row's fields)."""
    return NoYield() if int(control[CTRL_NO_YIELD]) else Yield(control, row_bytes)

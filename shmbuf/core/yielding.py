"""Writers yield to a learner copying a large batch, so unthrottled writers never starve it.

Writers of large rows (atari frames) that write as fast as they can take the cores and
the memory bandwidth a learner's gather needs: on two cores, two writers and a learner
each get two thirds of a core. ``cpprb`` locks writers out while its learner samples. Here
a learner about to copy a batch of at least :data:`LARGE` bytes stores *until when* writers
should wait (``CTRL_YIELD``: ``CLOCK_MONOTONIC`` nanoseconds, about twice what its last
gather of that size took, at most :data:`LONGEST`) and clears it when its copy is done.
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

_STEP = 50e-6  # seconds between a waiting writer's looks


class Yield:
    """A handle's side of the yielding: as a learner (:meth:`begin`, :meth:`end` around a
    gather) and as a writer (:meth:`wait`)."""

    def __init__(self, control: Any, row_bytes: int) -> None:
        self.control, self.row_bytes = control, row_bytes
        self.per_byte = 0.5e-9  # seconds a byte of this process's gathers took (first guess: 2 GB/s)

    def begin(self, rows: int) -> tuple[int, int, int] | None:
        """Before a gather of ``rows`` rows: ask writers to wait if it is large; what
        :meth:`end` takes."""
        nbytes = rows * self.row_bytes
        if nbytes < LARGE:
            return None
        t0 = time.monotonic_ns()
        until = t0 + int(min(2 * self.per_byte * nbytes, LONGEST) * 1e9)
        self.control[CTRL_YIELD] = until
        return until, t0, nbytes

    def end(self, mark: tuple[int, int, int] | None) -> None:
        """After the gather :meth:`begin` marked: writers go on (unless another learner
        asked them to wait since), and the next estimate learns from this one."""
        if mark is None:
            return
        until, t0, nbytes = mark
        if int(self.control[CTRL_YIELD]) == until:
            self.control[CTRL_YIELD] = 0
        self.per_byte = 0.5 * self.per_byte + 0.5e-9 * (time.monotonic_ns() - t0) / nbytes

    def wait(self, deadline: float) -> None:
        """A writer, before it reserves: wait while a learner's gather asks it to, at
        most until that gather's mark passes or ``deadline`` (``time.monotonic()``)."""
        until = int(self.control[CTRL_YIELD])
        if until == 0:
            return
        end = min(until, time.monotonic_ns() + int(LONGEST * 1e9))
        if deadline * 1e9 < end:  # (compared as floats: a deadline may be inf)
            end = int(deadline * 1e9)
        while int(self.control[CTRL_YIELD]) != 0 and time.monotonic_ns() < end:
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

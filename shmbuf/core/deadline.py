"""One deadline per call: a blocking call of several stages (the rate gate, then a read;
a lock, then another; a data copy or a write to the disk, then a lock) ends its waits
within its one ``timeout``, not within the sum of its stages'.

A call makes a :class:`Deadline` as it starts and gives each stage :meth:`Deadline.left`:
what is left of the timeout, but at least :data:`LOCK_FLOOR`. The header lock is held
for microseconds, so a stage that comes after the deadline (after a disk write that took
longer, say) still gets a moment to take it rather than failing a call that did its
work. A call so ends within its timeout, plus the floor of the stage that found the lock
held, plus what the stages that cannot be interrupted took (copies, ``fsync``).

Examples:
    >>> d = Deadline(2.0)
    >>> 1.9 < d.left() <= 2.0
    True
    >>> Deadline(0.0).left()            # (no floor beyond the timeout itself)
    0.0
    >>> Deadline(1.0, at=0.0).left()    # (past the deadline: the floor)
    0.05
"""

from __future__ import annotations

import time

LOCK_FLOOR = 0.05
"""Seconds a stage after the deadline still waits for the header lock (if the call's
timeout is at least that): a holder keeps it for microseconds."""


class Deadline:
    """The deadline of one call given ``timeout`` seconds (``at``: its monotonic time,
    default now + ``timeout``)."""

    __slots__ = ("timeout", "at")

    def __init__(self, timeout: float, at: float | None = None) -> None:
        self.timeout = timeout
        self.at = time.monotonic() + timeout if at is None else at

    def left(self) -> float:
        """Seconds the next stage may wait: what is left, at least ``LOCK_FLOOR`` (or the
        timeout, if smaller)."""
        return max(self.at - time.monotonic(), min(self.timeout, LOCK_FLOOR))

    def spent(self) -> float:
        """Seconds of the timeout gone so far."""
        return self.timeout - (self.at - time.monotonic())


def note(exc: BaseException, timeout: float, left: float, what: str = "") -> None:
    """Add to the message of ``exc``, raised after the rate gate of a call given
    ``timeout`` seconds left ``left`` of them: what the call wrote (``what``), and for a
    timeout, how much of it the gate's wait took. A ``KeyboardInterrupt`` (no message
    of its own) gets ``what`` as a note (``add_note``; before Python 3.11, as its message)."""
    if left < timeout and isinstance(exc, TimeoutError):
        what = f"{timeout - left:.3g} s of timeout={timeout:g} s went to the rate limit's wait before it" \
            + (f"; {what}" if what else "")
    if what and isinstance(exc, Exception) and exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]} ({what})",) + exc.args[1:]
    elif what and isinstance(exc, KeyboardInterrupt):
        if hasattr(exc, "add_note"):
            exc.add_note(what)
        elif not exc.args:
            exc.args = (what,)


def rest(left: float, timeout: float) -> float:
    """The seconds the stages after the rate gate get of a call's ``timeout``: the
    ``left`` the gate's wait left, but at least :data:`LOCK_FLOOR` (if ``timeout`` is), as the gate's own look at the counts gets: a gate that opened
    at the deadline still lets a write take a lock held for microseconds, a read copy
    its rows. A call so ends within its timeout plus that floor, at most."""
    return max(left, min(timeout, LOCK_FLOOR))

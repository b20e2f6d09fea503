"""Rate limiting across processes: Reverb's ``SampleToInsertRatio`` without a server.

Two counters live in the segment's header, so every writer and learner of a buffer sees
the same limit: rows ever inserted (the lanes' heads) and items ever sampled (a
``sample(256)`` counts 256, a ``sample_sequences(8, 20)`` counts 8). With ``spi`` the
samples per insert wanted, ``diff = inserted * spi - sampled`` must stay within
``spi * min_size -/+ error_buffer``:

* a sample of ``n`` waits until ``min_size`` rows were inserted and ``diff - n`` stays at or
  above ``spi * min_size - error_buffer`` (the learner is ahead: wait for writers);
* an insert of ``k`` rows waits while ``diff + k * spi`` would pass ``spi * min_size +
  error_buffer`` (the writers are ahead: wait for the learner).

Samples take the header lock for the check and the count (a few microseconds), so two
learners never both take the last allowance. Writers check without it: concurrent
writers may pass the upper bound by one write each. Waits back off from 50 us to 5 ms
(no busy loop) and end at the call's timeout with :class:`RateLimitTimeout`, which names
the counters; a dead writer or learner therefore holds nobody past their timeout. The
wait is the first stage of the call's one timeout: the gate returns the seconds left,
and the read or the write that follows gets only those.

A sample counts when it is returned (Reverb's): a sample whose read raises after the
gate counted it (a timeout, Ctrl-C, a ``ValueError``) gives its count back, under the
header lock as it was counted (:meth:`Limiter.give_back`), so a learner whose samples
fail does not let the writers run further ahead than the limit allows.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from shmbuf.core.deadline import LOCK_FLOOR, note
from shmbuf.core.layout import CTRL_SAMPLED, LANE_HEAD
from shmbuf.core.lock import LockTimeout
from shmbuf.core.ring import Ring, WriteTimeout
from shmbuf.core.read import SampleTimeout


class RateLimitTimeout(SampleTimeout, WriteTimeout):
    """A sample or an insert waited for the rate limit until its timeout (a
    :class:`~shmbuf.SampleTimeout` for samples' callers, a :class:`~shmbuf.WriteTimeout`
    for writers')."""


@dataclass(frozen=True)
class RateLimit:
    """Hold samples per insert near ``samples_per_insert``, within ``error_buffer``
    samples, once ``min_size`` rows were inserted (Reverb's ``SampleToInsertRatio``).

    Examples:
        >>> import shmbuf
        >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 100, seed=0,
        ...                            rate=shmbuf.RateLimit(min_size=4, samples_per_insert=2, error_buffer=8))
        >>> buf.extend({"x": [0, 1, 2, 3]})
        >>> buf.sample(8)["x"].shape            # 4 rows in: up to 4 * 2 + 8 - 2 * 4 = 8 samples
        (8,)
        >>> buf.sample(1, timeout=0.01)
        Traceback (most recent call last):
        ...
        shmbuf.rate.limit.RateLimitTimeout: ...
        >>> buf.close()
    """

    min_size: int = 1
    samples_per_insert: float = 1.0
    error_buffer: float = 100.0

    def __post_init__(self) -> None:
        m, spi, eb = self.min_size, self.samples_per_insert, self.error_buffer
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"min_size must be an int >= 1 (rows inserted before anyone samples), got {m!r}")
        for what, v in (("samples_per_insert", spi), ("error_buffer", eb)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{what} must be a finite number >= 0, got {v!r}")
        if spi <= 0:
            raise ValueError(f"samples_per_insert must be > 0, got {spi!r}")
        if eb < max(spi, 1):
            raise ValueError(f"error_buffer={eb!r} is smaller than samples_per_insert={spi!r} (or 1): an insert "
                             "could never be followed by a sample; use error_buffer >= samples_per_insert, "
                             "and at least half the largest batch you sample")

    @property
    def bounds(self) -> tuple[float, float]:
        """(lowest, highest) allowed ``inserted * samples_per_insert - sampled``."""
        mid = self.samples_per_insert * self.min_size
        return mid - self.error_buffer, mid + self.error_buffer

    def to_meta(self) -> dict[str, Any]:
        return {"min_size": self.min_size, "samples_per_insert": self.samples_per_insert,
                "error_buffer": self.error_buffer}

    @classmethod
    def from_meta(cls, meta: Any) -> "RateLimit":
        try:
            return cls(int(meta["min_size"]), float(meta["samples_per_insert"]), float(meta["error_buffer"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"the buffer's rate limit is unreadable ({meta!r}): {exc}") from None


def sampled(ring: Ring) -> int:
    """Items ever sampled under a rate limit (0 without one): what a save keeps."""
    return int(ring.control[CTRL_SAMPLED])


def restore_sampled(ring: Ring, count: int, timeout: float) -> None:
    """Set the count of items sampled (a load restores what the save kept)."""
    with ring.lock.hold(timeout):
        ring.control[CTRL_SAMPLED] = count


HOOK: Callable[[str, float], None] | None = None
"""Test hook, called as ``HOOK(what, left)`` each time a wait of the gate goes on
(``what``: "sample <n>" or "insert <k> rows"; ``left``: the seconds left). Never set
outside tests."""

class Limiter:
    """A handle's view of a buffer's rate limit: waits before samples and inserts."""

    limited = True

    def __init__(self, limit: RateLimit, ring: Ring) -> None:
        self.limit = limit
        self.ring = ring
        self.low, self.high = limit.bounds

    def counts(self) -> tuple[int, int]:
        """(rows inserted, items sampled), as read now."""
        ring = self.ring
        return int(ring.lane_table[:, LANE_HEAD].sum()), int(ring.control[CTRL_SAMPLED])

    def before_sample(self, n: int, timeout: float, counted: list[int]) -> float:
        """Wait until ``n`` items may be sampled, and count them (and ``counted[0] = n``,
        under the same hold off of Ctrl-C: the caller knows whether to :meth:`give_back`);
        the seconds left of ``timeout`` (for the read that follows: one deadline for the
        whole call)."""
        if n > 2 * self.limit.error_buffer:
            raise ValueError(f"a batch of {n} can never be sampled under {self.limit}: the ratio's window is "
                             f"2 * error_buffer = {2 * self.limit.error_buffer:g} samples wide; sample fewer "
                             "at a time or create the buffer with a larger error_buffer")
        spi, lock = self.limit.samples_per_insert, self.ring.lock
        deadline = time.monotonic() + timeout
        delay = 50e-6
        while True:
            # (at the deadline too: a holder keeps it for microseconds, so a look at the
            # counts is never refused for that)
            with lock.hold(max(LOCK_FLOOR, deadline - time.monotonic())):
                inserted, sampled = self.counts()
                if inserted >= self.limit.min_size and inserted * spi - sampled - n >= self.low:
                    self.ring.control[CTRL_SAMPLED] = sampled + n
                    counted[0] = n
                    return max(0.0, deadline - time.monotonic())
            delay = self._wait(deadline, delay, timeout, f"sample {n}")

    def give_back(self, n: int, exc: BaseException) -> None:
        """Uncount ``n`` samples that :meth:`before_sample` counted and whose read raised
        ``exc`` (a sample counts when it is returned), under the header lock, waited for
        :data:`LOCK_FLOOR` at most; if it stays held, ``exc`` says the samples stay counted."""
        try:
            with self.ring.lock.hold(LOCK_FLOOR):
                control = self.ring.control
                control[CTRL_SAMPLED] = max(int(control[CTRL_SAMPLED]) - n, 0)
        except LockTimeout:
            note(exc, 0.0, 0.0, f"its {n} samples stay counted by the rate limit: the header lock was not "
                                f"free within {LOCK_FLOOR:g} s to count them back")

    def before_insert(self, k: int, timeout: float) -> float:
        """Wait until ``k`` rows may be inserted (they are counted by the write itself);
        the seconds left of ``timeout`` (for the write that follows)."""
        spi = self.limit.samples_per_insert
        deadline = time.monotonic() + timeout
        delay = 50e-6
        while True:
            inserted, sampled = self.counts()
            if (inserted + k) * spi - sampled <= self.high or inserted == 0 and k * spi > self.high:
                # (a first write larger than the window goes through: nothing could ever free it)
                return max(0.0, deadline - time.monotonic())
            delay = self._wait(deadline, delay, timeout, f"insert {k} rows")

    def _wait(self, deadline: float, delay: float, timeout: float, what: str) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            inserted, sampled = self.counts()
            lim = self.limit
            raise RateLimitTimeout(
                f"could not {what} within {timeout:g} s under the rate limit: {inserted} rows inserted, "
                f"{sampled} sampled (samples_per_insert={lim.samples_per_insert:g}, min_size={lim.min_size}, "
                f"error_buffer={lim.error_buffer:g}); "
                + ("the writers are ahead: a learner must sample" if what.startswith("insert")
                   else "the learners are ahead: writers must insert"))
        if HOOK is not None:
            HOOK(what, left)
        time.sleep(min(delay, left))
        return min(delay * 2, 5e-3)

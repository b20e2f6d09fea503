"""The parts of an engine that a capability replaces, in their plain form.

An :class:`~shmbuf.core.engine.Engine` holds one of each, chosen once when the handle
opens (from the segment's metadata), and calls it without asking which it is:

* the **write part** (``engine.writes``): :class:`Replay`, rows straight into the ring,
  which overwrites the oldest; :class:`~shmbuf.limited.counted.Counted`
  (``max_times_sampled=``) in its place starts each row's count of samples at 0 and lets
  only its sampler read; a queue's :class:`~shmbuf.queue.protocol.Queue` stamps each row,
  waits for room and hands rows out once;
* the **priorities** (``engine.priorities``): :class:`NoPriorities`; a prioritized
  buffer's :class:`~shmbuf.priority.trees.Trees` in their place;
* the **records** (``engine.records``): :class:`NoRecords`; the ragged fields'
  :class:`~shmbuf.ragged.rows.Rows` in their place;
* the **rate gate** (``engine.gate``): :data:`OPEN`, or a
  :class:`~shmbuf.rate.limit.Limiter`.

A write goes through them in this order (the order is the protocol: a write that waits
for room must not move a buffer file's horizon first): the gate (before anything), the
write part's stamp and the priorities' field (the row's values), the write part's room
check (a queue's), the storage's durable horizon (a buffer file's), then the ring's
reserve, copy and publish, and the handle's counters.

Examples:
    >>> import shmbuf
    >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 4)
    >>> type(buf.engine.writes).__name__, type(buf.engine.priorities).__name__
    ('Replay', 'NoPriorities')
    >>> buf.close()
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any, ContextManager

import numpy as np

from shmbuf.core.tables import BeyondHorizon


class Replay:
    """The write part of a replay buffer (see the module)."""

    adds = False  # whether stamp() adds a field to every row (the C ring's whole writes cannot)

    def __init__(self, ring: Any) -> None:
        self.ring = ring

    def stamp(self, data: Any, single: bool) -> Any:
        """``data`` with what this part adds to each row (nothing)."""
        return data

    def put(self, lane: int, n: int, arrays: list[np.ndarray], timeout: float) -> None:
        """Write ``n`` rows into ``lane`` (a buffer file's horizon moved first, if need be),
        within ``timeout`` in all."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.ring.put(lane, n, arrays, timeout)
            except BeyondHorizon:  # (a buffer file's Python-path write: nothing was reserved)
                self.ring.reach(lane, n, max(0.0, deadline - time.monotonic()))
                timeout = max(0.0, deadline - time.monotonic())

    def room(self, lanes: np.ndarray, timeout: float) -> None:
        """Wait until each of ``lanes`` (one entry per row to write there) has room for
        its rows now: a queue's wait (a replay buffer always has room)."""

    def check_truncate(self) -> None:
        """Raise the ``ValueError`` of a buffer that never drops rows (never: this one may)."""

    def size(self) -> int:
        """Rows held: written, or reserved by a writer still writing them."""
        return self.ring.size()

    def check_take(self) -> None:
        """Raise the ``ValueError`` of a buffer that is not taken from (this one)."""
        raise ValueError("take() is for a queue: create the buffer with mode='queue' (a replay buffer "
                         "is sampled, with sample())")

    def check_sample(self) -> None:
        """Raise the ``ValueError`` of a buffer that is not sampled (never: this one is)."""

    @staticmethod
    def check_rows(arrays: dict[str, np.ndarray], kept: np.ndarray) -> None:
        """Raise the ``ValueError`` of a state dict whose rows (``arrays``, the slots
        ``kept`` restored) hold values of this part's own field that it never writes
        (nothing to check: this part keeps no field)."""

    def clear(self, timeout: float) -> None:
        self.ring.clear(timeout)

    def stats(self) -> dict[str, Any]:
        """What this part counts, for ``Buffer.stats()`` (nothing)."""
        return {}

    def quiet(self, timeout: float) -> ContextManager[Any]:
        """Held while a save copies the rows (nothing to hold)."""
        return nullcontext(None)

    def delivered(self, stamps: np.ndarray) -> np.ndarray:
        """Which of ``stamps`` name rows a save leaves out (none)."""
        return np.zeros(len(stamps), bool)

    def reset(self, timeout: float) -> None:
        """After a restore: every row restored is one to use (nothing to do)."""

    def flushing(self) -> None:
        """(Under the lock, at a flush) what to keep for a restart (nothing)."""

    def rolled_back(self) -> None:
        """(Under the lock, a buffer file's lanes rolled back at a restart) nothing to do."""


class NoPriorities:
    """The priorities of a buffer created without ``priority=`` (see the module)."""

    def stamp(self, data: Any, priority: Any, axis: int | None) -> Any:
        """``data`` with its rows' priorities (none: ``priority=`` is refused)."""
        if priority is not None:
            raise ValueError("priority= is for a prioritized buffer: create it with priority=<exponent>")
        return data

    def update(self, index: Any, priorities: Any, timeout: float) -> int:
        raise ValueError("update_priorities is for a prioritized buffer: create it with priority=<exponent>")

    def snapshot(self, timeout: float) -> None:
        """The leaves a save keeps (none)."""
        return None


class NoRecords:
    """The records of a buffer without ragged fields (a ragged one's are
    :class:`shmbuf.ragged.rows.Rows`): rows pass as they are."""

    fields: dict = {}

    def stamp(self, data: Any, single: bool) -> Any:
        return data

    def done(self) -> None:
        pass

    def fixed(self, out: Any, n: int) -> Any:
        return out

    def finish(self, batch: Any, redraw: Any, deadline: float, timeout: float, drop: bool = False,
               reuse: Any = None) -> Any:
        return batch

    def fit(self, max_tokens: Any, length: Any, groups: bool = False) -> Any:
        raise ValueError("max_tokens=, length= and groups= are for a buffer with ragged fields")

    def groups(self, n: int, timeout: Any) -> Any:
        raise ValueError("groups= is for a buffer with ragged fields (each extend's rows a group)")

    def describe(self, stats: dict) -> None:
        """Add what the records use to ``stats()`` (nothing)."""

    def check_each(self) -> None:
        """Raise the ``ValueError`` of an ``add_each`` these rows cannot take (none)."""

    def snapshot(self, state: dict) -> dict:
        return state

    def check_state(self, state: Any, checked: dict) -> dict:
        return checked

    def check_copy(self, what: str) -> None:
        """Raise the ``ValueError`` of a copy of the rows (``what``: ``"state_dict"``,
        ``"save"``...) that cannot hold these records (none: there are none)."""


class Open:
    """The gate of a buffer without a rate limit: lets every sample and insert through
    (at once: all of their ``timeout`` is left for what follows)."""

    limited = False

    def before_sample(self, n: int, timeout: float, counted: list[int]) -> float:
        return timeout

    def give_back(self, n: int, exc: BaseException) -> None:
        pass

    def before_insert(self, n: int, timeout: float) -> float:
        return timeout


OPEN = Open()

"""Queue mode for :class:`shmbuf.Buffer`: what ``create(..., mode="queue")`` adds, and
``take``. The protocol is :mod:`shmbuf.queue.protocol`'s."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from shmbuf.core import durable, validate
from shmbuf.core.batch import count, as_out
from shmbuf.core.engine import Engine
from shmbuf.queue import protocol, restart
from shmbuf.versions.recent import FIELD

Batch = dict[str, np.ndarray]


class Queues:
    """``Buffer.take`` (see :class:`shmbuf.Buffer`)."""

    engine: Engine
    capacity: int
    _versions: Any

    def take(self, n: int, *, timeout: float | None = None, partial: bool = False,
             max_staleness: int | None = None, min_version: int | None = None, version: int | None = None,
             max_tokens: int | None = None, length: str | None = None, groups: bool = False,
             out: Batch | None = None) -> Batch:
        """Take the ``n`` oldest rows of a queue (``mode="queue"``): each row is
        delivered to exactly one ``take`` of any process; waits up to ``timeout`` for
        them (``SampleTimeout``), or with ``partial=True`` returns as soon as there is at
        least one (up to ``n``). Per lane, rows come in the order they were written;
        across lanes, by the time their writes began. A taker killed before its take
        returned gives its rows back: a later take delivers them before newer rows.
        A Ctrl-C (``KeyboardInterrupt``) during a take loses no row: it gives the rows
        back, or, if it landed after their delivery was committed, this handle's next
        take returns them first. ``n`` may be larger than the queue with ``partial=True``
        ("whatever is there", e.g. ``sys.maxsize``); ``rows_sampled`` counts the rows
        delivered.

        In a queue created with ``versions=True``, ``max_staleness=k`` (Sample
        Factory's ``max_policy_lag``) passes over the rows more than ``k`` versions older
        than the newest (``version=``, else the bound ``Weights``' latest, else the
        newest row's), and ``min_version=v`` those below ``v``: they are counted in
        ``stats()["rows_stale"]`` and never delivered, to this take or a later one;
        every other row is still delivered exactly once.

        In a queue with ragged fields, ``max_tokens=T`` with ``length="R"`` (a ragged
        field or its length's name) takes the oldest rows up to ``n`` whose values of
        that length add up to at most ``T`` (at least one row, whatever its length); a
        budget that the next row would pass completes the take (it returns without
        waiting for ``n`` rows). The budget reads the rows' fixed part only. With
        ``groups=True`` a take never splits the rows of one ``extend`` (a GRPO group):
        it ends before a write whose rows pass ``n`` or the budget, and takes at least
        the first write's rows whole (more than ``n`` if it holds more).

        ``out``: a batch an earlier take returned, refilled in place and returned (the hot
        loop's: ``b = q.take(..., out=b)``): its ragged fields' values are read into the
        memory of ``out``'s (a larger block replaces it when they do not fit, with room
        to spare); its other fields are new arrays (a take's row count varies). Any
        array or view of the earlier batch sees the new rows.

        Examples:
            >>> import shmbuf
            >>> q = shmbuf.Buffer.create({"x": ((), "int64")}, 8, mode="queue")
            >>> q.extend({"x": [1, 2, 3]})
            >>> q.take(2)["x"].tolist(), q.take(5, partial=True)["x"].tolist(), len(q)
            ([1, 2], [3], 0)
            >>> q.close()
        """
        queue = self.engine.writes
        queue.check_take()
        n = count(n, "n", 1)
        partial = validate.flag(partial, "partial")
        if n > self.capacity and not partial:
            raise ValueError(f"cannot take {n} rows at once from a queue of capacity {self.capacity}; "
                             "take fewer, or pass partial=True")
        if out is not None and not isinstance(out, dict):
            raise ValueError(f"out must be a dict (a batch an earlier take returned), got {type(out).__name__}")
        groups = validate.flag(groups, "groups")
        fit = None if max_tokens is None and length is None and not groups else \
            self.engine.records.fit(max_tokens, length, groups)
        if max_staleness is None and min_version is None and version is None:
            # (not through engine.sample: a queue has no rate gate, and the take counts the
            # rows it delivered itself, as it commits them)
            return as_out(out, queue.take(n, partial, self.engine.seconds(timeout), None, fit, out))
        engine = self.engine
        bound, newest = self._versions.bound(engine, engine.window(), min_version, max_staleness, version)
        return as_out(out, queue.take(n, partial, self.engine.seconds(timeout), (FIELD, bound, newest), fit, out))


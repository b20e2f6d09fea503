"""Lanes: which lane a handle writes, and writers bound to one. A part of
:class:`shmbuf.Buffer` (it uses the handle's engine only)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from shmbuf.core.engine import Engine

_INT64 = np.dtype(np.int64)


class Lanes:
    """``Buffer``'s lane operations (see :class:`shmbuf.Buffer`)."""

    engine: Engine
    _plain: Any  # the C ring when rows are written as they are (see Buffer._open)
    add: Any

    @property
    def lane(self) -> int | None:
        """The lane this handle has claimed, if any."""
        return self.engine.lane

    def lane_sizes(self) -> list[int]:
        """Rows currently held in each lane."""
        lo, head = self.engine.ring.window()
        return [int(x) for x in head - lo]

    def prefault(self, lane: int | None = None) -> None:
        """Map the buffer's pages (one lane's, or all) into this process now.

        A process touching shared pages for the first time page-faults on each 4 kB
        page; for large rows that triggers a 3x slow-down until every page was touched
        once. A handle's first write to a lane does this for that lane by itself
        (about 0.25 s per GB, once); call it for the whole buffer in a learner that
        wants full sampling speed from its first batch. A no-op where unsupported.
        """
        self.engine.prefault(lane)

    def claim_lane(self, lane: int | None = None, *, timeout: float | None = None) -> int:
        """Claim a lane for this handle; writes without ``lane=`` then go there.

        Claims are advisory (``add(lane=i)`` writes anywhere) and owned by the
        process: a lane whose claimer died can be claimed again. Without arguments,
        a multi-lane buffer's first write claims a lane by itself.

        Examples:
            >>> import numpy as np, shmbuf
            >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 4, lanes=2)
            >>> buf.claim_lane()
            0
            >>> import numpy as np, shmbuf
            >>> buf.close()
        """
        return self.engine.claim_lane(lane, self.engine.seconds(timeout))

    def release_lane(self, *, timeout: float | None = None) -> None:
        """Give up this handle's lane claim (no-op without one)."""
        self.engine.release_lane(self.engine.seconds(timeout))

    def add_each(self, batch: Mapping[str, Any], lanes: Any, *, timeout: float | None = None,
                 priority: Any = None, version: int | None = None) -> None:
        """Add one transition to each of ``lanes``: row ``i`` of every field of ``batch``
        (``{name: (n, *shape)}``) into ``lanes[i]`` (``n`` ints), as the ``n`` envs of a
        vector env step, each into its own lane. ``priority`` and ``version`` as
        :meth:`extend`'s (one for all rows; ``priority`` also one per row). In one native
        call when this process has claimed every one of those lanes.

        All rows or none: every row is checked, and a lane that another live process
        claims, the rate limit (for all ``n`` rows at once) and a queue's room in every
        lane are settled, before any row is written; an error raised then says that
        none was written. Only what another process (or another thread of this one) does
        meanwhile (claiming one of the lanes, filling a shared lane of a queue, holding
        the header lock or a lane's write past the timeout) can stop the write halfway:
        the error then names the rows written.

        Examples:
            >>> import numpy as np, shmbuf
            >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 6, lanes=3)
            >>> buf.add_each({"x": np.array([10, 20])}, [0, 2])
            >>> buf.lane_sizes()
            [1, 0, 1]
            >>> buf.close()
        """
        engine = self.engine
        given = lanes
        if type(lanes) is not np.ndarray or lanes.dtype is not _INT64 or lanes.ndim != 1:
            lanes = lanes_of(lanes, engine.layout.lanes)
        plain = self._plain
        if plain is not None and priority is None and version is None and type(batch) is dict \
                and plain.put_rows(lanes, batch, {}, timeout) is None:
            return  # (every lane this process's: checked, lanes too, and written in C, all or nothing)
        if lanes is given:
            lanes = lanes_of(lanes, engine.layout.lanes)  # (an int64 array: its lanes' range)
        n = len(lanes)
        engine.records.check_each()
        if isinstance(batch, Mapping):  # (else the stamps below say what is wrong)
            for k, v in batch.items():
                if np.ndim(v) == 0 or len(v) != n:
                    raise ValueError(f"field {k!r}: expected {n} rows, one per lane, got shape {np.shape(v)}")
        batch = self._versions.stamp(batch, version, False)  # (the parts that add, as extend's)
        try:
            batch = engine.priorities.stamp(engine.writes.stamp(batch, False), priority, 0)
            arrays, _ = engine.schema.check_rows(batch, single=False)
            engine.write_each(arrays, lanes, timeout)
        finally:
            self._versions.done()  # (the floor: the rows written, also by a write stopped halfway)

    def writer(self, lane: int | None = None) -> "LaneWriter":
        """A context manager that claims a lane, writes to it, and releases it.

        Examples:
            >>> import numpy as np, shmbuf
            >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 4, lanes=2)
            >>> with buf.writer() as w:
            ...     w.add({"x": 1}); w.lane
            0
            >>> import numpy as np, shmbuf
            >>> buf.close()
        """
        return LaneWriter(self, lane)


class LaneWriter:
    """Writes to one claimed lane of a buffer; see :meth:`Buffer.writer`."""

    def __init__(self, buffer: Any, lane: int | None) -> None:
        self.buffer = buffer
        self._claimed = buffer.lane is None
        self.lane = buffer.claim_lane(lane)

    def add(self, transition: Mapping[str, Any], **kwargs: Any) -> None:
        """The handle's :meth:`~shmbuf.Buffer.add` into this lane (its keywords: ``timeout``,
        ``priority``, ``version``)."""
        self.buffer.add(transition, lane=self.lane, **kwargs)

    def extend(self, batch: Mapping[str, Any], **kwargs: Any) -> None:
        """The handle's :meth:`~shmbuf.Buffer.extend` into this lane (its keywords:
        ``truncate_ok``, ``timeout``, ``priority``, ``version``)."""
        self.buffer.extend(batch, lane=self.lane, **kwargs)

    def close(self) -> None:
        if self._claimed:
            self.buffer.release_lane()
            self._claimed = False

    def __enter__(self) -> "LaneWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lanes_of(lanes: Any, count: int) -> np.ndarray:
    """``lanes`` (a sequence of ints, each in ``[0, count)``) as an int64 array, checked:
    a float, bool or string lane is refused, not rounded."""
    got = np.asarray(lanes) if not isinstance(lanes, (str, bytes)) else np.asarray([lanes])
    if got.ndim != 1 or got.dtype.kind not in "iu" and not (got.dtype == object and all(
            isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in got.tolist())):
        if got.ndim == 1 and got.size == 0 and got.dtype.kind == "f":  # ([]: no lanes, no rows)
            return np.zeros(0, np.int64)
        raise TypeError(f"lanes must be a sequence of ints, one lane per row, got {lanes!r}"
                        + (f" (of {got.dtype})" if got.ndim == 1 else ""))
    if len(got) and (got.min() < 0 or got.max() >= count):
        raise ValueError(f"lanes must be in [0, {count}): this buffer has {count} lanes; got {got.tolist()}")
    return got.astype(np.int64)

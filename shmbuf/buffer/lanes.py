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

    def add_each(self, batch: Mapping[str, Any], lanes: Any, *, timeout: float | None = None) -> None:
        """Add one transition to each of ``lanes``: row ``i`` of every field of ``batch``
        (``{name: (n, *shape)}``) into ``lanes[i]``, as the ``n`` envs of a vector env
        step, each into its own lane. In one native call when this process has
        claimed every one of those lanes (else, or on the pure-Python path, row by row,
        as :meth:`add`). Every row is checked before any is written: on an error the
        buffer is unchanged.

        Examples:
            >>> import numpy as np, shmbuf
            >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 6, lanes=3)
            >>> buf.add_each({"x": np.array([10, 20])}, [0, 2])
            >>> buf.lane_sizes()
            [1, 0, 1]
            >>> buf.close()
        """
        if type(lanes) is not np.ndarray or lanes.dtype is not _INT64 or lanes.ndim != 1:
            lanes = np.asarray(lanes, np.int64).reshape(-1)
        plain = self._plain
        if plain is not None and isinstance(batch, dict) and plain.put_rows(lanes, batch, {}, timeout) is None:
            return  # (every lane this process's: checked and written in C, all or nothing)
        n, count = len(lanes), self.engine.layout.lanes
        if n and (lanes.min() < 0 or lanes.max() >= count):
            raise ValueError(f"lanes must be in [0, {count}): this buffer has {count} lanes; got {lanes.tolist()}")
        for k, v in batch.items():
            if np.ndim(v) == 0 or len(v) != n:
                raise ValueError(f"field {k!r}: expected {n} rows, one per lane, got {np.shape(v)}")
        rows = [{k: v[i] for k, v in batch.items()} for i in range(n)]
        for row in rows:
            self.engine.schema.check_rows(row, single=True)
        for row, lane in zip(rows, lanes.tolist()):
            self.add(row, lane=lane, timeout=timeout)

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

    def add(self, transition: Mapping[str, Any], *, timeout: float | None = None) -> None:
        self.buffer.add(transition, lane=self.lane, timeout=timeout)

    def extend(self, batch: Mapping[str, Any], *, truncate_ok: bool = False,
               timeout: float | None = None) -> None:
        self.buffer.extend(batch, lane=self.lane, truncate_ok=truncate_ok, timeout=timeout)

    def close(self) -> None:
        if self._claimed:
            self.buffer.release_lane()
            self._claimed = False

    def __enter__(self) -> "LaneWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

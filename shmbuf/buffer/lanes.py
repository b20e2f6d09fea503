"""Lanes: which lane a handle writes, and writers bound to one. A part of
:class:`shmbuf.Buffer` (it uses the handle's engine only)."""

from __future__ import annotations

from typing import Any, Mapping

from shmbuf.core.engine import Engine


class Lanes:
    """``Buffer``'s lane operations (see :class:`shmbuf.Buffer`)."""

    engine: Engine

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

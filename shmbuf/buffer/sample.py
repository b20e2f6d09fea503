"""The reads of :class:`shmbuf.Buffer` beside ``sample`` (whose hot path is the
handle's own): batches to sample into, windows of consecutive rows, priority updates."""

from __future__ import annotations

from typing import Any

from shmbuf.core.batch import Batch, Outputs, count
from shmbuf.core.engine import Engine
from shmbuf.priority import trees as _priority


class Reads:
    """``empty_batch``, ``sample_sequences``, ``update_priorities`` (see :class:`shmbuf.Buffer`)."""

    engine: Engine
    sampler: Any
    _outputs: Outputs

    def empty_batch(self, n: int, length: int | None = None) -> Batch:
        """Uninitialised arrays shaped like ``sample(n)`` (or ``sample_sequences(n, length)``)."""
        return self._outputs.empty((n,) if length is None else (n, length))

    def update_priorities(self, index: Any, priorities: Any, *, timeout: float | None = None) -> int:
        """Set the priorities of sampled rows, from any process: ``index`` as
        :meth:`sample` returned it, ``priorities`` one per row, finite and > 0 (``|td| +
        1e-6``, say), with ``p**a`` at most
        :func:`~shmbuf.priority.trees.largest_leaf` of the capacity (so the sum over the
        buffer stays finite) and not 0 (``ValueError``, nothing changed). Rows overwritten since they were sampled are skipped (the new row
        in their slot keeps its own priority); returns how many were set.

        Examples:
            >>> from shmbuf import Buffer
            >>> buf = Buffer.create({"x": ((), "int64")}, 4, priority=1.0, seed=0)
            >>> buf.extend({"x": [0, 1, 2, 3]})
            >>> b = buf.sample(1)
            >>> buf.update_priorities(b["index"], [1e-9])
            1
            >>> bool((buf.sample(1000)["x"] == b["x"][0]).mean() < 0.01)
            True
            >>> buf.close()
        """
        return self.sampler.update(index, priorities, self.engine.seconds(timeout))

    def sample_sequences(self, batch: int, length: int, *, out: Batch | None = None,
                         timeout: float | None = None, lane: int | None = None) -> Batch:
        """Sample ``batch`` windows of ``length`` consecutive rows of one lane (of lane
        ``lane`` only, if given: one env's sequences).

        Rows of a window are in the order they were written; a window may wrap
        physically around the ring but never joins the newest row to the oldest, never
        contains an unpublished row, and never mixes lanes. Windows may cross episode
        boundaries. Returns ``{name: (batch, length, *shape)}``.

        Examples:
            >>> import numpy as np
            >>> from shmbuf import Buffer
            >>> buf = Buffer.from_data({"t": np.arange(5)}, capacity=5, seed=0)
            >>> buf.sample_sequences(2, 3)["t"].shape
            (2, 3)
            >>> buf.close()
        """
        batch = count(batch, "batch")
        length = count(length, "length", 1)
        out, arrays = self._outputs.prepare(out, (batch, length))
        flat = [a.reshape((batch * length,) + a.shape[2:]) for a in arrays]  # views
        self.engine.sample_windows(batch, length, flat, timeout, lane)
        out.pop(_priority.FIELD, None)  # (kept by shmbuf)
        return out

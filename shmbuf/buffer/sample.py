"""The reads of :class:`shmbuf.Buffer`: ``sample`` (its hot path inlined, a token
budget's rounds), batches to sample into, windows of consecutive rows, priority updates."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from shmbuf.core import gather, validate
from shmbuf.core.batch import Batch, Outputs, as_out, count
from shmbuf.core.engine import Engine
from shmbuf.core.plain import NoRecords
from shmbuf.core.read import SampleTimeout
from shmbuf.priority import trees as _priority
from shmbuf.samplers.uniform import Uniform


class Reads:
    """``sample``, ``empty_batch``, ``sample_sequences``, ``update_priorities`` (see
    :class:`shmbuf.Buffer`)."""

    engine: Engine
    sampler: Any
    _outputs: Outputs
    _uniform: bool
    _versions: Any

    def sample(self, n: int | None = None, *, out: Batch | None = None, timeout: float | None = None,
               beta: float | None = None, min_version: int | None = None, max_staleness: int | None = None,
               version: int | None = None, freshness: Any = None, max_tokens: int | None = None,
               length: str | None = None, groups: bool = False) -> Batch:
        """Sample ``n`` rows uniformly, with replacement, over all published rows; in a
        prioritized buffer, by priority, adding ``weight`` (importance sampling with
        exponent ``beta``, default 0.4, the largest weight of the buffer 1) and ``index``
        (``(n, 2)``: each row's slot and sequence number, for :meth:`update_priorities`).

        Returns ``{name: array of shape (n, *shape)}`` with rows aligned across fields.
        ``out`` (from :meth:`empty_batch`) is filled in place and returned. ``n`` may
        exceed ``len(self)``. An empty buffer raises ``ValueError``. In a buffer created
        with ``versions=True``: only rows of version ``>= min_version``, or at most
        ``max_staleness`` versions older than the newest (``version``, else the bound
        ``Weights``' latest, else the newest row's); ``freshness=True`` (or a function of
        the staleness) weighs them by ``1 / (staleness + 1)`` and adds ``weight``; see
        :mod:`shmbuf.versions.recent`.

        A ragged field comes as a :class:`~shmbuf.Jagged` (``values`` and ``offsets``).
        ``max_tokens=T`` with ``length="R"`` (a ragged field or its length's name):
        as many rows as fit ``T`` values of that length (at least one; at most ``n`` if
        given), drawn as ``n`` rows are; only the fixed rows of the rows it leaves out
        are read. ``groups=True``: ``n`` whole groups, each the rows one ``extend``
        wrote (a GRPO group), uniformly over the groups the buffer holds whole, their
        rows one after the other (see :mod:`shmbuf.ragged.groups`). ``out`` may also be
        a batch a sample returned (the hot loop's ``b = buf.sample(n, out=b)``): refilled
        in place, its ragged fields' values read into the memory of ``out``'s (one block,
        replaced by a larger one when they do not fit); with ``max_tokens=`` its fixed
        fields are new arrays (the row count varies).

        Examples:
            >>> import shmbuf
            >>> buf = shmbuf.Buffer.from_data({"x": np.arange(10)}, seed=0)
            >>> b = buf.sample(4); b["x"].shape, b["x"].dtype
            ((4,), dtype('int64'))
            >>> buf.close()
        """
        if groups is not False:
            if not validate.flag(groups, "groups") or out is not None or beta is not None \
                    or max_tokens is not None or not all(v is None for v in (min_version, max_staleness, version, freshness)):
                raise ValueError("groups=True takes n (whole groups) and timeout= only")
            return self.engine.records.groups(count(n, "n", 1), timeout)
        if max_tokens is not None or length is not None:
            return as_out(out, self._sample_tokens(n, max_tokens, length, timeout, beta, out,
                                                   dict(min_version=min_version, max_staleness=max_staleness,
                                                        version=version)))
        if type(n) is not int or n < 0:
            n = count(n, "n")
        engine = self.engine
        plain = min_version is None and max_staleness is None and version is None and freshness is None
        if plain and self._uniform and beta is None:
            out, arrays = self._outputs.prepare(out, (n,))  # the common case: the read path, nothing around it
            gather.sample_windows(engine.ring, engine.rng, n, 1, arrays,
                                    engine.timeout if timeout is None else validate.timeout(timeout))
            engine.counters.sampled(n)
            return out
        seconds = engine.seconds(timeout)
        deadline = time.monotonic() + seconds

        def left() -> float:
            return max(0.0, deadline - time.monotonic())
        if plain:
            records = engine.records
            return as_out(out, records.finish(self.sampler.sample(n, records.fixed(out, n), seconds, beta),
                                              lambda m: self.sampler.sample(m, None, left(), beta), deadline,
                                              seconds, reuse=out))
        if beta is not None or type(self.sampler) is not Uniform:
            raise ValueError("min_version=, max_staleness= and freshness= are for a replay buffer without "
                             "priority= or another sampler")
        if freshness is not None and out is not None:
            raise ValueError("out= is not supported with freshness= (the batch gains a weight)")

        def draw(m: int, into: Batch | None, within: float) -> Batch:
            into, _ = self._outputs.prepare(into, (m,))
            return self._versions.sample(engine, m, into, within, min_version, max_staleness, version, freshness)
        return as_out(out, engine.records.finish(draw(n, engine.records.fixed(out, n), seconds),
                                                 lambda m: draw(m, None, left()), deadline, seconds, reuse=out))

    def _sample_tokens(self, n: int | None, max_tokens: Any, length: Any, timeout: float | None, beta: Any,
                       reuse: Any, bounds: dict[str, Any]) -> Batch:
        """``sample(max_tokens=, length=)``: rows drawn in rounds of about the number the
        budget holds, until one does not fit (see :meth:`sample`); ``reuse``: ``out=``,
        whose ragged values' memory is reused."""
        records = self.engine.records
        if isinstance(records, NoRecords):
            raise ValueError("max_tokens= and length= are for a buffer with ragged fields")
        if max_tokens is None or length is None:
            raise ValueError("a token budget takes both max_tokens= and length= (the ragged field or length it counts)")
        budget = count(max_tokens, "max_tokens", 1)
        records.dim_index(length)
        limit = None if n is None else count(n, "n", 1)
        seconds = self.engine.seconds(timeout)
        deadline = time.monotonic() + seconds
        plain = all(v is None for v in bounds.values())
        while True:  # (again if every row drawn had its record covered before it was copied)
            batch = self._draw_tokens(limit, budget, length, deadline, plain, beta, bounds)
            out = records.finish(batch, None, deadline, seconds, drop=True, reuse=reuse)
            if out is not None:
                return out
            if time.monotonic() >= deadline:
                raise SampleTimeout(f"could not copy an intact ragged row within {seconds:g} s: writers cover "
                                    "the arena faster than it can be read (arena= too small?)")

    def _draw_tokens(self, limit: int | None, budget: int, length: str, deadline: float, plain: bool,
                     beta: Any, bounds: dict[str, Any]) -> Batch:
        """The rows of one draw of a token budget (their record words not read yet)."""
        records = self.engine.records
        parts: list[Batch] = []
        got = tokens = 0
        while True:
            want = max(1, min(4096, int((budget - tokens) / max(records.mean, 1.0)) + 1))
            if limit is not None:
                want = min(want, limit - got)
            left = max(0.0, deadline - time.monotonic())
            if plain:
                batch = self.sampler.sample(want, None, left, beta)
            else:
                batch, _ = self._outputs.prepare(None, (want,))
                batch = self._versions.sample(self.engine, want, batch, left, bounds["min_version"],
                                              bounds["max_staleness"], bounds["version"], None)
            lengths = records.lengths(batch, length)
            cum = tokens + np.cumsum(lengths)
            k = int(np.searchsorted(cum, budget, side="right"))
            if not parts and k == 0:
                k = 1  # (at least one row, whatever its length)
            records.mean = float(lengths.mean()) if len(lengths) else records.mean
            if k < want:
                parts.append({key: a[:k] for key, a in batch.items()})
                break
            parts.append(batch)
            got += k
            tokens = int(cum[-1])
            if limit is not None and got >= limit:
                break
        return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}

    def empty_batch(self, n: int, length: int | None = None) -> Batch:
        """Uninitialised arrays shaped like ``sample(n)`` (or ``sample_sequences(n, length)``)."""
        self.engine.records.check_copy("empty_batch()")
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
        self.engine.records.check_copy("sample_sequences()")
        out, arrays = self._outputs.prepare(out, (batch, length))
        flat = [a.reshape((batch * length,) + a.shape[2:]) for a in arrays]  # views
        self.engine.sample_windows(batch, length, flat, timeout, lane)
        out.pop(_priority.FIELD, None)  # (kept by shmbuf)
        return out

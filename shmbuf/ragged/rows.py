"""A handle's ragged rows: values checked and staged as a write's records, record words
turned back into :class:`~shmbuf.ragged.jagged.Jagged` fields as a read ends.

The write side (:meth:`Rows.stamp`): each ragged value is checked (its trailing shape;
its dtype cast as a fixed field's value is: :mod:`shmbuf.core.validate`), the lengths of
a named dimension must agree within each row, and the values of one write must fit a
lane's arena; the row then carries its record word (:data:`~shmbuf.ragged.schema.FIELD`)
and the values are staged for the ring's write (:meth:`shmbuf.core.arena.Arena.stage`).
The read side (:meth:`Rows.finish`): after a sampler's checked gather, the records of
the rows it returned are copied and checked (:meth:`shmbuf.core.arena.Arena.read`);
rows whose record was covered meanwhile are drawn again through the same sampler, all
within the call's deadline (:class:`~shmbuf.core.read.SampleTimeout` after it).
"""

from __future__ import annotations

import time
import weakref
from typing import Any, Callable, Mapping

import numpy as np

from shmbuf.core import arena, validate
from shmbuf.core.batch import count
from shmbuf.core.read import SampleTimeout, read
from shmbuf.core.segment import FormatError
from shmbuf.ragged import schema
from shmbuf.ragged.jagged import Jagged

Batch = dict[str, Any]


class Rows:
    """The ragged fields of one handle (see the module)."""

    def __init__(self, engine: Any, arena: Any, ragged: list[schema.Ragged], dims: list[str]) -> None:
        self.engine, self.arena, self.ragged, self.dims = engine, arena, ragged, dims
        self.names = [r.name for r in ragged]
        self._dim = [dims.index(r.key) for r in ragged]
        self._first = [self._dim.index(d) for d in self._dim]  # (the first field of each one's length)
        self._cols = np.array([2 + d for d in self._dim], np.intp)  # (each field's length in a record word)
        self._specs = [(r.dtype, r.trailing) for r in ragged]
        self._blocks: Any = weakref.WeakValueDictionary()  # (id: block of the batches read here, reusable)
        self._checks = [schema.as_field(r) for r in ragged]
        self.mean = 64.0  # tokens a row of the budget's dimension had, as the last budget found

    @property
    def fields(self) -> dict[str, tuple[tuple[Any, ...], np.dtype]]:
        return {r.name: (r.shape, r.dtype) for r in self.ragged}

    # -- writing ---------------------------------------------------------------------

    def stamp(self, data: Any, single: bool) -> Any:
        """``data`` with its ragged values replaced by the record words, the values
        staged for the write (checked first: nothing is staged if any is wrong)."""
        if not isinstance(data, Mapping):
            return data  # (the schema's check says what a batch is)
        missing = [k for k in self.names if k not in data]
        if missing or schema.FIELD in data:
            raise ValueError(f"{'a transition' if single else 'a batch'} must hold the ragged field(s) "
                             f"{self.names}" + (f": missing {missing}" if missing else "")
                             + (f"; {schema.FIELD!r} is the buffer's own" if schema.FIELD in data else ""))
        per_field = [self._rows(data[r.name], r, f, single) for r, f in zip(self.ragged, self._checks)]
        n = len(per_field[0])
        if any(len(v) != n for v in per_field):
            raise ValueError(f"the ragged fields hold different numbers of rows: "
                             f"{ {k: len(v) for k, v in zip(self.names, per_field)} }")
        words = np.zeros((n, 2 + len(self.dims)), np.int64)
        for j, (r, rows) in enumerate(zip(self.ragged, per_field)):
            lengths = np.fromiter(map(len, rows), np.int64, n)
            d, first = self._dim[j], self._first[j]
            if first < j:
                bad = np.flatnonzero(words[:, 2 + d] != lengths)
                if len(bad):
                    i = int(bad[0])
                    raise ValueError(f"row {i}: field {r.name!r} holds {int(lengths[i])} values, but "
                                     f"{self.names[first]!r} holds {int(words[i, 2 + d])}; both have the length "
                                     f"{r.key!r}, which must agree")
            words[:, 2 + d] = lengths
        total = int(self.arena.sizes(words[:, 2:]).sum())
        if total > self.arena.A:
            raise ValueError(f"the ragged values of these {n} rows take {total:,} bytes, more than a lane's "
                             f"arena ({self.arena.A:,} bytes); nothing was written. Write fewer rows per "
                             "call, or create the buffer with a larger arena=")
        self.arena.stage(per_field)
        out = {k: v for k, v in data.items() if k not in self.names}
        out[schema.FIELD] = words[0] if single else words
        group = np.empty((n, 2), np.int64)
        group[:, 0], group[:, 1] = np.arange(n), n
        out[schema.GROUP] = group[0] if single else group
        return out

    @staticmethod
    def _rows(value: Any, r: schema.Ragged, f: Any, single: bool) -> list[np.ndarray]:
        """The rows of one ragged field's value, each checked and cast (C-contiguous)."""
        if single:
            rows = [value]
        elif isinstance(value, Jagged):
            rows = [value[i] for i in range(len(value))]
        elif isinstance(value, np.ndarray) and value.ndim == 2 + len(r.trailing):
            rows = list(value)
        elif isinstance(value, (list, tuple)):
            rows = list(value)
        else:
            raise ValueError(f"field {r.name!r}: expected one array per row (a list of arrays of shape "
                             f"(length, *{r.trailing}), or a shmbuf.Jagged), got {type(value).__name__}")
        out = []
        nd, trailing, dtype = 1 + len(r.trailing), r.trailing, r.dtype
        for i, v in enumerate(rows):
            if type(v) is not np.ndarray:
                try:
                    v = np.asarray(v)
                except (ValueError, TypeError) as exc:
                    raise ValueError(f"field {r.name!r}: cannot make an array of row {i} ({exc})") from None
            shape = v.shape
            if len(shape) != nd or (trailing and shape[1:] != trailing):
                where = "the value" if single else f"row {i}"
                want = "(length, " + ", ".join(map(str, trailing)) + ")" if trailing else "(length,)"
                raise ValueError(f"field {r.name!r}: expected {where} of shape {want}, got shape {shape}")
            if v.dtype is not dtype and v.dtype != dtype:  # (numpy's dtypes of a kind: one object)
                validate.check_cast(f, v)
                v = np.ascontiguousarray(v, dtype)
            elif not v.flags.c_contiguous:  # (an array of the dtype, C-contiguous, as it is)
                v = np.ascontiguousarray(v)
            out.append(v)
        return out

    def done(self) -> None:
        """After a write (done or not): nothing staged."""
        self.arena.stage(None)

    def describe(self, stats: dict) -> None:
        """Per lane: ``arena_bytes`` (its arena), ``arena_held`` (the bytes from its
        oldest row's record to its head: what its rows' values take, skips included) and
        ``arena_reserved`` (bytes ever reserved)."""
        lo, head = self.engine.window()
        a, lc = self.arena, self.engine.layout.lane_capacity
        for i, d in enumerate(stats["lanes"]):
            h = int(a.heads[i, 0])
            oldest = int(a.table[i * lc + int(lo[i]) % lc]) if lo[i] < head[i] else h
            d.update(arena_bytes=a.A, arena_reserved=h, arena_held=max(0, min(h - oldest, a.A)))

    def check_each(self) -> None:
        raise ValueError(f"add_each() of rows with ragged fields ({self.names}) is not supported yet: add() "
                         "each row into its lane (lane=) instead; nothing was written")

    def snapshot(self, state: dict[str, Any]) -> dict[str, Any]:
        """A state dict (:func:`shmbuf.core.contents.snapshot`'s) with its rows' ragged
        values, read with the checked read: ``state["ragged"]`` holds per ragged field
        ``(values, offsets)`` of the rows kept (``stamps`` not 0, in slot order); a row
        whose record was covered after its fixed part was copied is left out, as a row
        overwritten during the copy is."""
        stamps = state["stamps"]
        kept = np.flatnonzero(stamps)
        words = state["data"][schema.FIELD][kept]
        self._check(words)
        jagged, ok = self._read(words)
        if ok is not None:
            stamps[kept[~ok]] = 0
            jagged = {k: j[np.flatnonzero(ok)] for k, j in jagged.items()}
        state["ragged"] = {k: (j.values, j.offsets) for k, j in jagged.items()}
        return state

    def check_state(self, state: Any, checked: dict[str, Any]) -> dict[str, Any]:
        """``checked`` (:func:`shmbuf.core.contents.check`'s) with what the arena needs to
        restore the ragged values of ``state`` (see :func:`check_values`)."""
        return check_values(self.ragged, self.arena.A, self.engine.layout, state, checked)

    def check_copy(self, what: str) -> None:
        """A copy of the rows (``what``) cannot hold ragged values yet: refused."""
        raise ValueError(f"{what} of a buffer with ragged fields ({self.names}) is not supported yet: it would "
                         "copy the rows without their values; nothing was done")

    # -- reading ---------------------------------------------------------------------

    def lengths(self, batch: Batch, dim: str) -> np.ndarray:
        """The lengths of dimension (or ragged field) ``dim`` of a batch's rows, from their
        record words (the fixed rows only)."""
        return batch[schema.FIELD][:, 2 + self.dim_index(dim)]

    def dim_index(self, dim: str) -> int:
        if dim in self.dims:
            return self.dims.index(dim)
        if dim in self.names:
            return self._dim[self.names.index(dim)]
        raise ValueError(f"length={dim!r} names no ragged field or length of this buffer; it has "
                         f"{sorted(set(self.dims) | set(self.names))}")

    def fixed(self, out: Any, n: int) -> Batch | None:
        """What a sampler fills of ``out`` (``sample(n, out=)``, None: nothing given): a
        batch a read returned (its ragged fields :class:`Jagged`) as its fixed arrays and
        new arrays of the hidden fields (record words, groups)."""
        if out is None:
            return None
        if not isinstance(out, dict) or not all(isinstance(out.get(k), Jagged) for k in self.names):
            got = {k: type(out.get(k)).__name__ for k in self.names} if isinstance(out, dict) else type(out).__name__
            raise ValueError(f"out must be a batch a read of this buffer returned (its ragged field(s) {self.names} "
                             f"each a shmbuf.Jagged), got {got}")
        fixed = {k: a for k, a in out.items() if k not in self.names}
        fixed[schema.FIELD] = np.empty((n, 2 + len(self.dims)), np.int64)
        fixed[schema.GROUP] = np.empty((n, 2), np.int64)
        return fixed

    def finish(self, batch: Batch, redraw: Callable[[int], Batch] | None, deadline: float,
               timeout: float, drop: bool = False, reuse: Any = None) -> Batch | None:
        """``batch`` (a sampler's, with record words) with its ragged fields read in: rows
        whose record was covered meanwhile are replaced by ``redraw(m)``'s (None: a
        take's rows, which nothing may cover: an error), until ``deadline``; with
        ``drop`` (a token budget's rows), left out instead, and None if no row is left
        (the caller draws its budget again). ``reuse``: a batch a read returned
        (``out=``), whose ragged values' memory the values read go into if they fit
        (else a larger block replaces it)."""
        words = batch.pop(schema.FIELD)
        batch.pop(schema.GROUP, None)
        self._check(words)
        jagged, ok = self._read(words, reuse)
        if drop and ok is not None and not ok.any():
            return None  # (every row covered meanwhile: not a take's, whose rows nothing may cover)
        if drop and ok is not None:
            keep = np.flatnonzero(ok)
            batch = {k: a[keep] for k, a in batch.items()}
            jagged, ok = {k: j[keep] for k, j in jagged.items()}, None
        while ok is not None:
            bad = np.flatnonzero(~ok)
            if redraw is None:
                raise FormatError(f"the records of {len(bad)} rows a take holds changed while they were "
                                  "copied: the segment was written by something that does not follow the protocol")
            if time.monotonic() >= deadline:
                raise SampleTimeout(f"could not copy {len(bad)} intact ragged rows within {timeout:g} s: writers "
                                    "cover the arena faster than it can be read (arena= too small?)")
            more = redraw(len(bad))
            words2 = more.pop(schema.FIELD)
            more.pop(schema.GROUP, None)
            self._check(words2)
            got, ok2 = self._read(words2)
            for k, a in more.items():
                batch[k][bad] = a
            keep = ok.copy()
            keep[bad] = True if ok2 is None else ok2
            jagged = {k: _merged(jagged[k], got[k], bad) for k in jagged}
            ok = None if keep.all() else keep
        batch.update(jagged)
        return batch

    def records(self, batch: Batch) -> Batch | None:
        """``batch`` (rows the checked gather copied, every stored field) with its ragged
        fields read in and the hidden fields left out; None if a record was covered
        meanwhile (draw the rows again)."""
        batch = dict(batch)
        batch.pop(schema.GROUP, None)
        words = batch.pop(schema.FIELD)
        self._check(words)
        jagged, ok = self._read(words)
        if ok is not None:
            return None
        batch.update(jagged)
        return batch

    def groups(self, n: int, timeout: float | None) -> Batch:
        """``n`` whole groups (see :mod:`shmbuf.ragged.groups`), their rows one batch."""
        from shmbuf.ragged.groups import Groups, joined
        engine = self.engine
        got = engine.sample(n, n, timeout, lambda left: read(Groups(engine, self), n, left))
        return joined(got["groups"])

    def _check(self, words: np.ndarray) -> None:
        """FormatError unless every record word can be one: lanes of the buffer, lengths
        >= 0, a record that fits its lane's arena."""
        if not len(words):
            return
        lengths, A = words[:, 2:], self.arena.A
        if words.min() < 0 or words[:, 0].max() >= self.engine.layout.lanes or lengths.max() > A \
                or (words[:, 1] % A + self.arena.sizes(lengths) > A).any():
            raise FormatError(f"buffer {self.engine.name!r} holds a record word no shmbuf process writes: "
                              "it is damaged")

    def _read(self, words: np.ndarray, reuse: Any = None) -> tuple[dict[str, Jagged], np.ndarray | None]:
        """The rows' ragged fields, their values read from the records of ``words`` into
        one block of memory (:meth:`Jagged.empties`): the block of ``reuse``'s (a batch
        a read of this handle returned) if they fit, else a new one."""
        block = None
        if isinstance(reuse, dict):
            bases = {id(j.values.base): j.values.base for j in (reuse.get(k) for k in self.names)
                     if isinstance(j, Jagged)}
            block = next(iter(bases.values())) if len(bases) == 1 else None
            block = block if block is not None and self._blocks.get(id(block)) is block else None  # (ours only)
        fields = Jagged.empties(words[:, self._cols], self._specs, block)
        base = fields[0].values.base
        if base is not block:
            self._blocks[id(base)] = base
        jagged = dict(zip(self.names, fields))
        return jagged, self.arena.read(np.ascontiguousarray(words), [(j.values, j.offsets) for j in fields])

    def fit(self, max_tokens: Any, length: Any, groups: bool = False) -> Callable[[np.ndarray, np.ndarray], tuple[int, bool]]:
        """A take's budget: of the rows ``(lanes, seqs)`` it would claim, in order, how many
        fit ``max_tokens`` values of ``length`` (at least one), read from their fixed rows,
        and whether they fill it (the next row would pass it, or they reach it). With
        ``groups``: cut at the end of a write's rows, never inside (at least the first
        write's rows, whole); ``max_tokens`` None: no budget."""
        if (max_tokens is None) != (length is None):
            raise ValueError("a token budget takes both max_tokens= and length= (the ragged field or length it counts)")
        budget = None if max_tokens is None else count(max_tokens, "max_tokens", 1)
        d = None if length is None else 2 + self.dim_index(length)
        words, group = self.engine.view(schema.FIELD), self.engine.view(schema.GROUP)
        lc = self.engine.layout.lane_capacity

        def fit(lanes: np.ndarray, seqs: np.ndarray, n: int) -> tuple[int, bool]:
            slots = lanes * lc + seqs % lc
            k, filled = min(n, len(seqs)), len(seqs) > n
            if budget is not None:
                cum = np.cumsum(words[slots, d])
                fits = max(1, int(np.searchsorted(cum, budget, side="right")))
                filled = filled or fits < len(cum) or int(cum[fits - 1]) >= budget
                k = min(k, fits)
            if groups:  # (back to the start of the write the cut falls in; the first write whole)
                g = group[slots]
                start = (g[:, 0] == 0) | np.concatenate(([True], (lanes[1:] != lanes[:-1])
                                                         | (seqs[1:] - g[1:, 0] != seqs[:-1] - g[:-1, 0])))
                if k < len(seqs) and not start[k]:
                    before = np.flatnonzero(start[:k + 1])
                    k = int(before[-1]) if before[-1] > 0 else int(np.argmax(np.append(start[1:], True))) + 1
                    filled = True
            return k, filled

        def kept(batch: Batch) -> int:  # (rows an earlier take delivered: their own lengths)
            if budget is None:
                return len(next(iter(batch.values())))
            lengths = batch[self.names[self._dim.index(d - 2)]].lengths
            return max(1, int(np.searchsorted(np.cumsum(lengths), budget, side="right")))
        fit.kept = kept  # type: ignore[attr-defined]
        return fit


def check_values(ragged: list[schema.Ragged], lane_arena: int, layout: Any, state: Any, checked: dict[str, Any],
                 where: str = "state_dict['ragged']") -> dict[str, Any]:
    """``checked`` (:func:`shmbuf.core.contents.check`'s, for a buffer of ``layout``
    whose ragged fields are ``ragged`` and a lane's arena ``lane_arena`` bytes) with what
    the arena needs to restore the ragged values of ``state`` (its ``"ragged"``: per field
    ``(values, offsets)`` of the rows its ``stamps`` keep, in slot order), under
    ``"records"``. ``ValueError`` if they do not match its rows (``where``: what the
    error calls the values, ``where[name]`` a field's) or do not fit a lane's arena;
    nothing changed. A load
    runs it before it creates the buffer, a restore before it takes the lock."""
    names = [r.name for r in ragged]
    dims = schema.dims(ragged)
    index = np.array([dims.index(r.key) for r in ragged], np.intp)
    element = np.array([r.element_bytes for r in ragged], np.int64)
    given = state.get("ragged") if isinstance(state, Mapping) else None
    if not isinstance(given, Mapping) or set(given) != set(names):
        got = sorted(given) if isinstance(given, Mapping) else type(given).__name__
        raise ValueError(f"{where} must hold the ragged fields {names} (the values of the rows "
                         f"of a buffer with ragged fields), got {got}")
    raw = np.flatnonzero(np.asarray(state["stamps"]))  # (the rows the values are of, in order)
    words = np.asarray(state["data"][schema.FIELD])[raw]
    values = []
    for r, d in zip(ragged, index.tolist()):
        try:
            j = Jagged(np.asarray(given[r.name][0]), np.asarray(given[r.name][1]))
        except (TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"{where}[{r.name!r}] is not (values, offsets): {exc}") from None
        if j.values.dtype != r.dtype or j.values.shape[1:] != r.trailing or len(j) != len(raw) \
                or not np.array_equal(j.lengths, words[:, 2 + d]):
            agree = len(j) == len(raw) and j.values.dtype == r.dtype and j.values.shape[1:] == r.trailing
            raise ValueError(f"{where}[{r.name!r}] does not match the rows kept: {len(j)} rows of {j.values.dtype} "
                             f"{j.values.shape[1:]}, for {len(raw)} rows of {r.dtype} {r.trailing}"
                             + (" whose lengths (their record words') differ" if agree else " and their lengths"))
        values.append(j)
    slots = np.flatnonzero(checked["stamps"])
    old = slots if checked["source"] is None else checked["source"][slots]
    row = np.searchsorted(raw, old)
    if (row >= len(raw)).any() or (raw[np.minimum(row, len(raw) - 1)] != old).any():
        raise ValueError("the stamps name rows there are no ragged values of")
    lanes = slots // layout.lane_capacity
    used = np.bincount(lanes, arena.record_bytes(words[row, 2:], index, element), minlength=layout.lanes)
    if (used > lane_arena).any():
        lane = int(np.argmax(used))
        raise ValueError(f"the rows of lane {lane} hold {int(used[lane]):,} bytes of ragged values, more than its "
                         f"arena ({lane_arena:,} bytes); restore into a buffer with arena= at least as large as the "
                         "one saved")
    checked["records"] = (slots, row, values, (checked["stamps"][slots] >> 1) - 1)
    return checked


def _merged(old: Jagged, new: Jagged, at: np.ndarray) -> Jagged:
    """``old`` with its rows ``at`` replaced by ``new``'s rows, in order."""
    rows = [old[i] for i in range(len(old))]
    for k, i in enumerate(at.tolist()):
        rows[i] = new[k]
    lengths = np.array([len(r) for r in rows], np.int64)
    j = Jagged.empty(lengths, old.values.dtype, old.values.shape[1:])
    for i, r in enumerate(rows):
        j.values[j.offsets[i]:j.offsets[i + 1]] = r
    return j

"""TorchRL's ``TensorStorage`` over a :class:`shmbuf.Buffer`: :class:`SharedStorage` (see
:mod:`shmbuf.compat.torchrl`)."""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection
from torchrl.data.replay_buffers.storages import Storage, TensorStorage

from shmbuf.buffer.handle import Buffer
from shmbuf.core import pool
from shmbuf.compat.torchrl import ragged as rag
from shmbuf.compat.torchrl.slots import Slots, few, pick, position_of, slot_of
from shmbuf.compat.torchrl.state import INDEX, States, without_index
from shmbuf.core.arena import lane_bytes
from shmbuf.core.read import SampleTimeout
from shmbuf.core.validate import check_cast

KIND = "torchrl"
SEP = "."


class SharedStorage(States, TensorStorage):
    """TorchRL's ``TensorStorage`` over a :class:`shmbuf.Buffer` of ``max_size`` rows
    (rounded down to a multiple of ``lanes``) in ``lanes`` lanes (one per process that
    writes at once); ``name``: the buffer's (made at the first write) or an existing
    one's (attached); ``priority``: the exponent alpha of a prioritized buffer. See
    :mod:`shmbuf.compat.torchrl`.

    Ragged rows (a lazy stack of TensorDicts whose entries differ in their leading
    length: tokens, log-probabilities) are kept as shmbuf's ragged fields in ``arena``
    bytes (default: sized at the first write) and read back as TorchRL's
    ``LazyStackStorage`` gives them, a ``LazyStackedTensorDict`` of the rows;
    ``ragged``: which entries are ragged (default: those whose rows differ in the first
    write). See :mod:`shmbuf.compat.torchrl.ragged`.

    It is a TorchRL storage: put it in TorchRL's own ``ReplayBuffer`` or
    ``TensorDictReplayBuffer`` with TorchRL's samplers and writers (``len``, reads by
    index and TorchRL's ``set`` at its writer's cursor), or use
    :class:`~shmbuf.compat.torchrl.SharedReplayBuffer`, whose writer and sampler are
    shmbuf's (any number of writing processes).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import TensorDictReplayBuffer
        >>> rb = TensorDictReplayBuffer(storage=SharedStorage(8), batch_size=4)  # TorchRL's writer and sampler
        >>> _ = rb.extend(TensorDict({"obs": torch.arange(10.)}, [10]))
        >>> rb.sample()["obs"].shape, len(rb), rb.writer._cursor, rb[0]["obs"].item()
        (torch.Size([4]), 8, 2, 8.0)
        >>> rb.storage.close()
    """

    supports_conditional_update = False
    lazy = False  # reads return a lazy stack of rows (always so with ragged fields)

    def __init__(self, max_size: int, *, name: str | None = None, lanes: int = 1, seed: Any = None,
                 timeout: float = 10.0, priority: float | None = None, arena: int | None = None,
                 ragged: Any = None) -> None:
        Storage.__init__(self, max_size)  # (not TensorStorage's: the rows are the buffer's, not a TensorDict)
        self.ndim, self.device = 1, torch.device("cpu")
        self.lanes, self.seed, self.timeout, self.priority = int(lanes), seed, float(timeout), priority
        self.arena, self.ragged = arena, ragged
        self.lengths: dict[str, str | None] = {}  # the ragged fields: their length's name (None: their own)
        self.evicted = 0  # rows this handle's writes pushed out of lane 0 by covering their values, since a clear
        self.buf: Buffer | None = None
        self.keys: list[str] = []  # the fields: nested keys joined by "."
        self.row_shape: tuple[int, ...] = ()  # a row's own batch dimensions (a [4, 5] extend: 4 rows of [5])
        self.sampled: tuple[Any, TensorDictBase] | None = None  # the sampler's last batch
        self.known: np.ndarray = np.empty(0, np.int64)  # per slot: the row this handle last sampled there (-1: none)
        self.cursor: int | None = None  # the writer's cursor of a TorchRL state being loaded (where its oldest row is)
        self._name = name
        if name is not None:
            with contextlib.suppress(FileNotFoundError):
                self._attach(name)

    def _attach(self, name: str) -> None:
        buf = Buffer.attach(name, seed=self.seed, timeout=self.timeout)
        described = buf.engine.layout.meta
        alpha = buf.parts.keywords["priority"]
        if described.get("kind") != KIND or (self.priority is None) != (alpha is None) \
                or (alpha is not None and float(alpha) != float(self.priority)):
            buf.close()
            what = "not a TorchRL storage" if described.get("kind") != KIND else \
                f"a TorchRL storage {'of priorities with alpha=%s' % alpha if alpha is not None else 'without priorities'}"
            raise ValueError(f"buffer {name!r} is {what} (this storage wants "
                             f"{'priorities with alpha=%s' % self.priority if self.priority is not None else 'none'}): "
                             "attach with the class and alpha it was made with")
        self._opened(buf, tuple(described.get("row_batch", ())))

    def _opened(self, buf: Buffer, row_shape: tuple[int, ...]) -> None:
        self.buf, self.row_shape, self.max_size = buf, row_shape, buf.capacity
        self.keys = [k for k in buf.fields if not k.startswith("_")]
        self.known = np.full(buf.capacity, -1, np.int64)
        spec = buf.parts.keywords.get("arena")
        self.lengths = {} if spec is None else {r["name"]: r["dim"] for r in spec["fields"]}
        self.element = {k: int(np.prod(buf.fields[k][0][1:], dtype=np.int64)) * buf.fields[k][1].itemsize
                        for k in self.lengths}
        self.lane_arena = 0 if spec is None else lane_bytes(spec["arena"], buf.lanes)

    @property
    def initialized(self) -> bool:
        """True once the buffer exists (TorchRL's collectors ask)."""
        return self.buf is not None

    @property
    def name(self) -> str | None:
        return self.buf.name if self.buf is not None else self._name

    def ensure(self, td: TensorDictBase) -> None:
        """Make the buffer from the first rows' leaves (one field per nested key; a row
        keeps the batch dimensions after the first, as TorchRL's ``ndim=1`` storages)."""
        if self.buf is not None:
            return
        cols = rag.columns(td)
        fields, lengths = rag.plan(cols, self.ragged)
        row_shape = tuple(td.batch_size[1:])
        arena = None
        if lengths:
            if row_shape:
                raise ValueError(f"ragged entries {sorted(lengths)} in rows of batch size {list(row_shape)}: ragged "
                                 "rows have the batch size [] (a lazy stack of them along dimension 0)")
            sizes = {k: int(np.prod(fields[k][0][1:], dtype=np.int64)) * _numpy_dtype(fields[k][1]).itemsize
                     for k in lengths}
            arena = self.arena or rag.default_arena(rag.row_bytes(rag.lengths_of(cols, lengths), sizes), self.max_size,
                                                    self.lanes)
        elif self.arena is not None:
            raise ValueError(f"arena={self.arena} is for ragged rows, and the first rows have none (every entry of "
                             "one shape in every row): leave arena= out, or name the ragged entries with ragged=")
        fields = {k: (shape, _numpy_dtype(dtype)) for k, (shape, dtype) in fields.items()}
        self._opened(Buffer.create(fields, self.max_size // self.lanes * self.lanes, lanes=self.lanes, name=self._name,
                                   seed=self.seed, timeout=self.timeout, priority=self.priority, arena=arena,
                                   _library={"kind": KIND, "row_batch": list(row_shape)}), row_shape)

    # -- writing ---------------------------------------------------------------------

    def arrays(self, rows: TensorDictBase) -> dict[str, np.ndarray]:
        """The rows of ``rows`` (TorchRL's ``"index"`` left out) as the buffer's fields, a
        key they lack as zeros (TorchRL's storages keep the slot's old value there),
        checked as a write checks them before anything is written."""
        if tuple(rows.batch_size[1:]) != self.row_shape:
            raise ValueError(f"rows of batch size {list(rows.batch_size)}: this buffer's rows have the batch size "
                             f"{list(self.row_shape)} after the first dimension (fixed by its first write)")
        flat = rag.columns(rows)
        flat.pop(INDEX, None)
        extra = sorted(set(flat) - set(self.keys))
        if extra:
            raise ValueError(f"the rows have keys {extra} the buffer does not: its keys {sorted(self.keys)} were "
                             "fixed by its first write")
        n = len(rows)
        fields = {f.name: f for f in self.buf.engine.fields}
        data = {}
        if self.lengths:
            data.update(rag.values(flat, n, self.lengths, self.element, self.lane_arena, self.buf.lanes))
        for k in self.keys:
            if k in self.lengths:
                continue
            f = fields[k]
            if k not in flat:
                data[k] = np.zeros((n,) + f.shape, f.dtype)
                continue
            if isinstance(flat[k], list):
                raise ValueError(f"key {k!r}: its rows differ in shape ({sorted({tuple(r.shape) for r in flat[k]})[:3]}), "
                                 f"and this buffer keeps it as a fixed field of shape {list(f.shape)} (its rows all "
                                 "had that shape in its first write): make the storage with ragged=[...] naming "
                                 f"{k!r} (or use SharedLazyStackStorage, whose entries are all ragged)")
            a = flat[k].detach().cpu().numpy()
            if a.shape[1:] != f.shape:
                raise ValueError(f"key {k!r}: {n} rows of shape {list(a.shape[1:])}, this buffer's rows have the "
                                 f"shape {list(f.shape)} there (fixed by its first write)")
            if a.dtype != f.dtype:
                check_cast(f, a)
            data[k] = a
        return data

    def write(self, td: TensorDictBase, priority: Any = None, lane: int | None = None) -> torch.Tensor:
        """Write the rows of ``td`` (along its first batch dimension) into this
        process's lane (or ``lane``), with ``priority`` (of a prioritized buffer: one per
        row, or None: the largest yet); returns their slots."""
        self.ensure(without_index(td))
        return self.put(self.arrays(td), len(td), priority, lane)

    def put(self, data: dict[str, np.ndarray], n: int, priority: Any = None, lane: int | None = None) -> torch.Tensor:
        """Write checked rows (:meth:`arrays`); their slots."""
        buf = self.buf
        if lane is None:
            lane = buf.claim_lane() if buf.lanes > 1 else 0
        lc = buf.lane_capacity
        head, base = int(buf.engine.heads()[lane]), int(buf.engine.bases()[lane])  # (exact in a lane it claimed)
        bounds = [(at, min(n, at + lc)) for at in range(0, n, lc)]  # (more rows than a lane holds: in turn)
        if self.lengths:  # (and more values than its arena holds)
            size = rag.row_bytes({k: np.array([len(r) for r in data[k]]) for k in self.lengths}, self.element)
            bounds = rag.parts(size, lc, self.lane_arena)
        for a, b in bounds:
            part = {k: v[a:b] for k, v in data.items()}
            buf.extend(part, lane=lane, priority=priority if np.ndim(priority) == 0 else priority[a:b])
        moved = int(buf.engine.bases()[lane]) - base  # (rows whose values these covered: the slots count from after them)
        self.evicted += moved if lane == 0 else 0
        slots = lane * lc + (head - base - moved + np.arange(n)) % lc
        self.known[slots] = -1  # (a new row there, not sampled yet)
        self._bump_mutation_revision()
        return torch.as_tensor(slots)  # (rows overwritten within the extend share their slot)

    def next_slot(self, lane: int) -> int:
        """Where the next row of ``lane`` goes, in the lane (TorchRL's writer's cursor)."""
        engine = self.buf.engine
        return int(engine.heads()[lane] - engine.bases()[lane]) % self.buf.lane_capacity

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        """TorchRL's writers' call: the rows ``data`` at the slots ``cursor`` (their
        cursor). Rows go only where shmbuf's write path puts them (reserved, then
        published: no process reads or writes a row half written), so the slots must be
        the next ones of the buffer's single lane: TorchRL's writers keep one cursor, in
        one process. Writing at other slots (``rb[i] = td``, ``write_at``) is refused,
        nothing written."""
        if not is_tensor_collection(data):
            raise TypeError(f"a SharedStorage holds TensorDicts (one field per key), got {type(data).__name__}: "
                            "wrap tensors in a TensorDict")
        one = isinstance(cursor, (int, np.integer)) or (torch.is_tensor(cursor) and cursor.ndim == 0)
        rows = data.unsqueeze(0) if one else data
        slots = np.asarray(torch.as_tensor(cursor).reshape(-1).cpu(), dtype=np.int64)
        self.ensure(without_index(rows))
        buf = self.buf
        if buf.lanes != 1:
            raise ValueError(f"this SharedStorage has {buf.lanes} lanes: TorchRL's writers keep one cursor over "
                             "all slots, in one process; write with SharedWriter (each process in a lane of its "
                             "own), or make the storage with lanes=1")
        lc = buf.lane_capacity  # (TorchRL's cursor counts the rows whose values the arena covered: they left)
        want = (self.next_slot(0) + self.evicted + np.arange(len(rows))) % lc
        if len(slots) != len(rows) or not np.array_equal(slots, want):
            raise ValueError(
                f"rows for slots {few(slots)}: a SharedStorage writes rows only at its next slots ({few(want)} "
                "now), where shmbuf reserves them, so that no process reads or overwrites a row being written "
                "(rb[i] = td, write_at, or a writer whose cursor is another process's or was set by hand are "
                "refused, nothing written); write with rb.extend / rb.add")
        self.put(self.arrays(rows), len(rows))

    # -- reading ---------------------------------------------------------------------

    def _rows(self, got: dict[str, np.ndarray], n: int | None, dense: bool = False) -> TensorDictBase:
        """Arrays of rows as a TensorDict (nested keys again; ``n`` None: one row); a
        lazy stack of the rows for ragged ones, or for a lazy storage unless ``dense``
        (:func:`~shmbuf.compat.torchrl.ragged.lazy_rows`)."""
        if self.lengths or (self.lazy and not dense):
            rows = rag.lazy_rows(got, self.keys, set(self.lengths), 1 if n is None else n, self.row_shape)
            return rows[0] if n is None else rows
        batch = list(self.row_shape) if n is None else [n, *self.row_shape]
        return TensorDict({k: torch.as_tensor(got[k][0] if n is None else got[k]) for k in self.keys},
                          batch).unflatten_keys(SEP)

    def batch(self, n: int) -> tuple[torch.Tensor, TensorDictBase]:
        """``n`` rows drawn uniformly through shmbuf's read path: their slots, and the
        rows as a TensorDict."""
        buf, engine = self.buf, self.buf.engine
        deadline = time.monotonic() + self.timeout

        def draw(m: int) -> dict[str, np.ndarray]:
            # (INDEX is not a field: the slot of each row; redrawn rows bring theirs)
            out = pool.batch(engine.fields, m, **{INDEX: np.int64})
            engine.sample_windows(m, 1, [out[f.name] for f in engine.fields], max(0.0, deadline - time.monotonic()),
                                  index=out[INDEX])
            return out
        got = draw(n)
        if self.lengths:  # (their values read; a row whose record was covered meanwhile drawn again)
            got = engine.records.finish(got, draw, deadline, self.timeout)
        index = got.pop(INDEX)
        lc = buf.lane_capacity  # (index: each row's lane * lc + seq % lc; its slot counts from the lane's base)
        lane = index // lc
        slots = lane * lc + (index % lc - buf.engine.bases()[lane]) % lc
        return torch.from_numpy(slots), self._rows(got, n)

    def batch_by_priority(self, n: int, beta: float) -> tuple[torch.Tensor, TensorDictBase, torch.Tensor, torch.Tensor]:
        """``n`` rows drawn by priority (shmbuf's trees, through the read path): their
        slots, the rows, their importance weights and their sequence numbers."""
        got = self.buf.sample(n, beta=beta)
        seqs = got["index"][:, 1].copy()
        slots = slot_of(self.buf.engine, got["index"][:, 0] // self.buf.lane_capacity, seqs)
        self.known[slots] = seqs
        return torch.from_numpy(slots), self._rows(got, n), torch.from_numpy(got["weight"]), torch.from_numpy(seqs)

    def set_priority(self, slots: np.ndarray, priority: np.ndarray, seqs: np.ndarray | None = None) -> int:
        """Set the priorities of the rows ``seqs`` at ``slots`` (default: the rows this
        handle last sampled there; a slot it did not sample since it was written: the
        row there now). Rows overwritten since are left as they are. How many were set."""
        engine, lc = self.buf.engine, self.buf.lane_capacity
        seqs = self.known[slots] if seqs is None else seqs
        lane, position = position_of(engine, slots)
        unknown = seqs < 0
        if unknown.any():  # the row each such slot holds now
            seqs = seqs.copy()
            seqs[unknown] = engine.rows_at(lane[unknown], position[unknown])
        return self.buf.update_priorities(np.stack([lane * lc + seqs % lc, seqs], axis=1), priority)

    def get(self, index: Any) -> Any:
        """The sampler's last batch, or the rows that ``index`` names among the slots
        holding rows (:mod:`shmbuf.compat.torchrl.slots`), read with the torn-read check."""
        if self.sampled is not None and index is self.sampled[0]:
            return self.sampled[1]
        if self.buf is None:
            raise RuntimeError("Cannot get elements out of a non-initialized storage.")  # (TorchRL's words)
        slots, one = pick(self.buf.engine, index)
        return self._rows(self._read(slots), None if one else len(slots))

    def _read(self, slots: np.ndarray) -> dict[str, Any]:
        """The rows ``slots`` hold, through the checked read; their ragged values read too
        (all again if a record was covered meanwhile, within the storage's timeout)."""
        engine = self.buf.engine
        deadline = time.monotonic() + self.timeout
        while True:
            got = engine.read(Slots(engine, slots), len(slots), len(slots), max(0.0, deadline - time.monotonic()))
            if not self.lengths:
                return got
            rows = engine.records.records(got)
            if rows is not None:
                return rows
            if time.monotonic() >= deadline:
                raise SampleTimeout(f"could not copy the ragged values of {len(slots)} rows within {self.timeout:g} "
                                    "s: writers cover the arena faster than they can be read (arena= too small?)")

    def __len__(self) -> int:
        return 0 if self.buf is None else len(self.buf)

    @property
    def _len(self) -> int:
        """The rows held (every process's), for TorchRL's code that reads ``_len``."""
        return len(self)

    @_len.setter
    def _len(self, value: int) -> None:
        pass  # (the buffer counts its rows)

    _total_shape = property(lambda self: torch.Size([self.max_size]))

    @property
    def shape(self) -> torch.Size:
        """The slots holding rows, as TorchRL's storages give it (``[len]``)."""
        return torch.Size([len(self)])

    @property
    def _last_cursor_index(self) -> int | None:
        """The slot of the newest row of a buffer of one lane (TorchRL's ``SliceSampler``
        cuts trajectories there when the ring is full); None if empty or of several lanes."""
        if self.buf is None or self.buf.lanes != 1 or not len(self):
            return None
        return (self.next_slot(0) - 1) % self.buf.lane_capacity

    def _empty(self) -> None:  # (TorchRL's name)
        self.clear()

    def clear(self) -> None:
        """Empty the buffer (its next rows go from slot 0 again, as TorchRL's), and give
        back this process's lane (TorchRL's collectors write a row in the learner to make
        the storage, then empty it: the lane is for a worker)."""
        if self.buf is not None:
            self.buf.clear()
            self.evicted = 0
            self.buf.release_lane()
            self.known[:] = -1
            self._bump_mutation_revision()

    def close(self) -> None:
        if self.buf is not None:
            self.buf.close()

    def dumps(self, path: Any) -> None:
        """Save the rows into the directory ``path`` (:meth:`shmbuf.Buffer.save`)."""
        if self.buf is None:
            raise RuntimeError("this SharedStorage has no buffer yet (it is made at the first write): "
                               "nothing to dump")
        self.buf.save(path, overwrite=True)

    def loads(self, path: Any) -> None:
        """Load rows that :meth:`dumps` saved into this storage (made now if it has no
        buffer yet: with the saved fields)."""
        saved = Buffer.load(path, name=f"torchrl-load-{os.getpid()}-{secrets.token_hex(6)}")
        try:
            if (described := saved.engine.layout.meta).get("kind") != KIND:
                raise ValueError(f"{path} holds no TorchRL storage's rows (it holds {described.get('kind')!r})")
            if self.buf is None:
                row_shape = tuple(described.get("row_batch", ()))
                spec = saved.parts.keywords.get("arena")  # (ragged rows: the arena they were saved from)
                self._opened(Buffer.create(saved.fields, saved.capacity, lanes=saved.lanes, name=self._name,
                                           seed=self.seed, timeout=self.timeout,
                                           arena=None if spec is None else max(spec["arena"], self.arena or 0),
                                           _library={"kind": KIND, "row_batch": list(row_shape)}), row_shape)
            self.buf.load_state_dict(saved.state_dict())
        finally:
            saved.close()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, len={len(self)}, max_size={self.max_size}, "
                f"lanes={self.lanes}, priority={self.priority})")

    def __getstate__(self) -> dict[str, Any]:
        if self.buf is None:
            raise RuntimeError(
                "this SharedStorage has no buffer yet (it is made at its first write, from the rows' keys), so "
                "it cannot travel to another process: there each process would make a private buffer of its "
                "own. Write a first batch here before handing it on (TorchRL's collectors do), or make it "
                "with name= of a buffer that exists")
        state = self.__dict__.copy()
        state.update(buf=None, sampled=None, _name=self.name, known=None, _rng=None)  # by name: it attaches there
        state.update(_mutation_revision_value=None, _last_cursor_index_value=None, _attached_entities_list=[])
        # (TorchRL's multiprocessing Values, which plain pickle refuses: made again where needed; shmbuf's rows
        # use none. The replay buffers it is attached to travel on their own.)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._name is not None:
            with contextlib.suppress(FileNotFoundError):
                self._attach(self._name)


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dtype).numpy().dtype

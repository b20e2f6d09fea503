"""TorchRL's ``Storage`` over a :class:`shmbuf.Buffer`: :class:`SharedStorage` (see
:mod:`shmbuf.compat.torchrl`)."""

from __future__ import annotations

import contextlib
import os
import secrets
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data.replay_buffers.storages import Storage

from shmbuf.buffer.handle import Buffer
from shmbuf.compat.torchrl.slots import Slots, occupied, pick

KIND = "torchrl"
SEP = "."


class SharedStorage(Storage):
    """TorchRL's ``Storage`` over a :class:`shmbuf.Buffer` of ``max_size`` rows (rounded
    down to a multiple of ``lanes``) in ``lanes`` lanes (one per process that writes at
    once); ``name``: the buffer's (made at the first write) or an existing one's
    (attached); ``priority``: the exponent alpha of a prioritized buffer. See
    :mod:`shmbuf.compat.torchrl`."""

    def __init__(self, max_size: int, *, name: str | None = None, lanes: int = 1, seed: Any = None,
                 timeout: float = 10.0, priority: float | None = None) -> None:
        super().__init__(max_size)
        self.lanes, self.seed, self.timeout, self.priority = int(lanes), seed, float(timeout), priority
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
        alpha = (described.get("priority") or {}).get("alpha")
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
        flat = _flat(td)
        fields = {k: (tuple(v.shape[1:]), _numpy_dtype(v.dtype)) for k, v in flat.items()}
        row_shape = tuple(td.batch_size[1:])
        self._opened(Buffer.create(fields, self.max_size // self.lanes * self.lanes, lanes=self.lanes, name=self._name,
                                   seed=self.seed, timeout=self.timeout, priority=self.priority,
                                   _library={"kind": KIND, "row_batch": list(row_shape)}), row_shape)

    def write(self, td: TensorDictBase, priority: Any = None, lane: int | None = None) -> torch.Tensor:
        """Write the rows of ``td`` (along its first batch dimension) into this
        process's lane (or ``lane``), with ``priority`` (of a prioritized buffer: one per
        row, or None: the largest yet); returns their slots."""
        rows = td
        self.ensure(rows)
        if tuple(rows.batch_size[1:]) != self.row_shape:
            raise ValueError(f"rows of batch size {list(rows.batch_size)}: this buffer's rows have the batch size "
                             f"{list(self.row_shape)} after the first dimension (fixed by its first write)")
        flat = _flat(rows)
        extra = sorted(set(flat.keys()) - set(self.keys))
        if extra:
            raise ValueError(f"the rows have keys {extra} the buffer does not: its keys {sorted(self.keys)} were "
                             "fixed by its first write")
        buf = self.buf
        n = len(rows)
        data = {k: np.zeros((n,) + buf.fields[k][0], buf.fields[k][1]) for k in self.keys if k not in flat.keys()}
        data.update({k: v.detach().cpu().numpy() for k, v in flat.items()})  # (a key missing: zeros)
        if lane is None:
            lane = buf.claim_lane() if buf.lanes > 1 else 0
        head = int(buf.engine.heads()[lane])
        lc = buf.capacity // buf.lanes  # (the slots: exact in a lane this process claimed)
        for at in range(0, n, lc):  # (more rows than a lane holds: in turn, as TorchRL's cursor goes round)
            part = {k: v[at:at + lc] for k, v in data.items()}
            buf.extend(part, lane=lane, priority=priority if np.ndim(priority) == 0 else priority[at:at + lc])
        slots = lane * lc + (head + np.arange(n)) % lc
        self.known[slots] = -1  # (a new row there, not sampled yet)
        return torch.as_tensor(slots)  # (rows overwritten within the extend share their slot)

    def _rows(self, got: dict[str, np.ndarray], n: int | None) -> TensorDictBase:
        """Arrays of rows as a TensorDict (nested keys again; ``n`` None: one row)."""
        batch = list(self.row_shape) if n is None else [n, *self.row_shape]
        return TensorDict({k: torch.as_tensor(got[k][0] if n is None else got[k]) for k in self.keys},
                          batch).unflatten_keys(SEP)

    def batch(self, n: int) -> tuple[torch.Tensor, TensorDictBase]:
        """``n`` rows drawn uniformly through shmbuf's read path: their slots, and the
        rows as a TensorDict."""
        buf = self.buf
        got = buf.empty_batch(n)
        index = np.empty(n, np.int64)
        buf.engine.sample_windows(n, 1, [got[f.name] for f in buf.engine.fields], self.timeout, index=index)
        return torch.from_numpy(index), self._rows(got, n)

    def batch_by_priority(self, n: int, beta: float) -> tuple[torch.Tensor, TensorDictBase, torch.Tensor, torch.Tensor]:
        """``n`` rows drawn by priority (shmbuf's trees, through the read path): their
        slots, the rows, their importance weights and their sequence numbers."""
        got = self.buf.sample(n, beta=beta)
        slots, seqs = got["index"][:, 0].copy(), got["index"][:, 1].copy()
        self.known[slots] = seqs
        return torch.from_numpy(slots), self._rows(got, n), torch.from_numpy(got["weight"]), torch.from_numpy(seqs)

    def set_priority(self, slots: np.ndarray, priority: np.ndarray, seqs: np.ndarray | None = None) -> int:
        """Set the priorities of the rows ``seqs`` at ``slots`` (default: the rows this
        handle last sampled there; a slot it did not sample since it was written: the
        row there now). Rows overwritten since are left as they are. How many were set."""
        seqs = self.known[slots] if seqs is None else seqs
        unknown = seqs < 0
        if unknown.any():  # the row each such slot holds now
            lc = self.buf.capacity // self.buf.lanes
            seqs = seqs.copy()
            seqs[unknown] = self.buf.engine.rows_at(slots[unknown] // lc, slots[unknown] % lc)
        return self.buf.update_priorities(np.stack([slots, seqs], axis=1), priority)

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        raise NotImplementedError("rows are written through SharedWriter (shmbuf reserves them: a cursor of "
                                  "TorchRL's would let two processes write the same slots)")

    def get(self, index: Any) -> Any:
        """The sampler's last batch, or the rows that ``index`` names among the slots
        holding rows (:mod:`shmbuf.compat.torchrl.slots`), read with the torn-read check."""
        if self.sampled is not None and index is self.sampled[0]:
            return self.sampled[1]
        if self.buf is None:
            raise RuntimeError("Cannot get elements out of a non-initialized storage.")  # (TorchRL's words)
        slots, one = pick(self.buf.engine, index)
        got = self.buf.engine.read(Slots(self.buf.engine, slots), len(slots), len(slots), self.timeout)
        return self._rows(got, None if one else len(slots))

    def __len__(self) -> int:
        return 0 if self.buf is None else len(self.buf)

    def state_dict(self) -> dict[str, Any]:
        """TorchRL's storage state (``_storage``: the rows by slot, ``[max_size, ...]``,
        zeros where no row is; ``initialized``; ``_len``), which TorchRL's
        ``LazyTensorStorage`` and ``LazyMemmapStorage`` load, plus ``_order``: the slots
        holding rows, oldest first, lane after lane."""
        if self.buf is None:
            return {"_storage": {}, "initialized": False, "_len": 0}
        engine = self.buf.engine
        lo, head = engine.window()
        lc = self.buf.capacity // self.buf.lanes
        order = np.concatenate([lane * lc + np.arange(max(a, b - lc), b) % lc
                                for lane, (a, b) in enumerate(zip(lo.tolist(), head.tolist()))]).astype(np.int64)
        got = engine.read(Slots(engine, order), len(order), len(order), self.timeout)
        rows = {f.name: np.zeros((self.buf.capacity,) + f.shape, f.dtype) for f in engine.fields}
        for k, a in rows.items():
            a[order] = got[k]
        td = self._rows(rows, self.buf.capacity)
        return {"_storage": td.state_dict(), "initialized": True, "_len": len(order), "_order": torch.from_numpy(order)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a storage's state: this storage's, or a TorchRL ``TensorStorage``'s
        (``LazyTensorStorage``, ``LazyMemmapStorage``: their rows in slot order, the
        oldest at :attr:`cursor` if the storage was full: the replay buffer sets it to
        its writer's ``_cursor``; else at slot 0). The
        buffer is made now if this storage has none yet; its rows are replaced."""
        if "_storage" not in state_dict:
            if state_dict:  # (an earlier version's: Buffer.state_dict())
                if self.buf is None:
                    raise RuntimeError("load a shmbuf state into a SharedStorage after its first write")
                self.buf.load_state_dict(state_dict)
            return
        if not state_dict.get("initialized", True) or not state_dict["_storage"]:
            self.clear()
            return
        stored = state_dict["_storage"]
        td = stored if isinstance(stored, TensorDictBase) else TensorDict().load_state_dict(stored, strict=False)
        if "_order" in state_dict:
            order = torch.as_tensor(state_dict["_order"]).numpy()
        else:
            size, n = td.batch_size[0], int(state_dict["_len"])
            first = 0 if n < size or self.cursor is None else int(self.cursor) % size
            order = (first + np.arange(n)) % size
        rows = td[torch.as_tensor(order)].exclude("index")
        if self.buf is None:
            self.max_size = max(self.max_size, int(td.batch_size[0]))
            self.ensure(rows)
        self.restore(rows, order)

    def restore(self, rows: TensorDictBase, order: np.ndarray) -> None:
        """Replace the rows with ``rows``, oldest first: in one lane at the slots
        ``order`` if they follow each other (a ring's order); else lane after lane."""
        buf = self.buf
        lc = buf.capacity // buf.lanes
        self.clear()
        if len(order) > buf.capacity:  # (from a larger storage: the newest rows)
            rows, order = rows[-buf.capacity:], order[-buf.capacity:]
        n = len(order)
        ring = buf.lanes == 1 and n and bool((np.diff(order) % lc == 1).all()) and order.max() < lc
        if ring:  # rows of zeros first, so that the first row lands at its slot, then cleared again
            pad = (int(order[0]) - int(buf.engine.heads()[0])) % lc
            if pad:
                self.write(rows[:1].expand(pad, *self.row_shape).clone().zero_(), lane=0)
                self.clear()
        for lane in range(buf.lanes):
            part = rows[lane * lc:(lane + 1) * lc] if not ring else rows
            if len(part):
                self.write(part, lane=lane)
            if ring:
                break

    def _empty(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Empty the buffer, and give back this process's lane (TorchRL's collectors write
        a row in the learner to make the storage, then empty it: the lane is for a worker)."""
        if self.buf is not None:
            self.buf.clear()
            self.buf.release_lane()
            self.known[:] = -1

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
            described = saved.engine.layout.meta
            if described.get("kind") != KIND:
                raise ValueError(f"{path} holds no TorchRL storage's rows (it holds {described.get('kind')!r})")
            if self.buf is None:
                row_shape = tuple(described.get("row_batch", ()))
                self._opened(Buffer.create(saved.fields, saved.capacity, lanes=saved.lanes, name=self._name,
                                           seed=self.seed, timeout=self.timeout,
                                           _library={"kind": KIND, "row_batch": list(row_shape)}), row_shape)
            self.buf.load_state_dict(saved.state_dict())
        finally:
            saved.close()

    def __getstate__(self) -> dict[str, Any]:
        if self.buf is None:
            raise RuntimeError(
                "this SharedStorage has no buffer yet (it is made at its first write, from the rows' keys), so "
                "it cannot travel to another process: there each process would make a private buffer of its "
                "own. Write a first batch here before handing it on (TorchRL's collectors do), or make it "
                "with name= of a buffer that exists")
        state = self.__dict__.copy()
        state.update(buf=None, sampled=None, _name=self.name, known=None)  # by name: the other process attaches
        state.update(_mutation_revision_value=None, _last_cursor_index_value=None)  # (TorchRL's
        # multiprocessing Values, which plain pickle refuses: made again where needed; shmbuf's rows use none)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._name is not None:
            with contextlib.suppress(FileNotFoundError):
                self._attach(self._name)


def _flat(td: TensorDictBase) -> dict[str, torch.Tensor]:
    """The leaves of ``td`` by their joined keys; a clear error for entries whose shape
    differs from row to row (a lazy stack of ragged TensorDicts)."""
    try:
        return dict(td.flatten_keys(SEP).items())
    except RuntimeError as e:
        raise ValueError(f"these rows' entries differ in shape from row to row (a lazily stacked TensorDict of "
                         f"ragged entries, batch size {list(td.batch_size)}): a shmbuf field holds one shape per "
                         "row; pad them to one shape first, or keep ragged rows in TorchRL's ListStorage") from e


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dtype).numpy().dtype

"""The state of a :class:`~shmbuf.compat.torchrl.storage.SharedStorage`: TorchRL's
storages' state dicts (the rows by slot), made and loaded through the checked read and
shmbuf's write path."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from shmbuf.compat.torchrl.slots import few, slot_of

INDEX = "index"  # TorchRL's key for a row's slot: set on a sample, never stored


def without_index(td: TensorDictBase) -> TensorDictBase:
    """``td`` without TorchRL's ``"index"`` (a row's slot, which the storage knows)."""
    return td.exclude(INDEX) if INDEX in td.keys() else td


class States:
    """``state_dict``, ``load_state_dict`` and ``restore`` of a ``SharedStorage``."""

    buf: Any
    lengths: dict
    cursor: int | None
    timeout: float

    def state_dict(self) -> dict[str, Any]:
        """TorchRL's storage state (``_storage``: the rows by slot, ``[max_size, ...]``,
        zeros where no row is; ``initialized``; ``_len``), which TorchRL's
        ``LazyTensorStorage`` and ``LazyMemmapStorage`` load, plus ``_order``: the slots
        holding rows, oldest first, lane after lane."""
        if self.buf is None:
            return {"_storage": {}, "initialized": False, "_len": 0}
        if self.lengths:
            raise ValueError(f"state_dict() of a SharedStorage with ragged entries ({sorted(self.lengths)}) is not "
                             "supported yet: a TensorStorage's state holds rows of one shape; nothing was done")
        engine = self.buf.engine
        lo, head = engine.window()
        bases = engine.bases()
        lanes = np.concatenate([np.full(b - a, k, np.int64) for k, (a, b) in enumerate(zip(lo.tolist(), head.tolist()))])
        seqs = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(lo.tolist(), head.tolist())])
        order = slot_of(engine, lanes, seqs, bases)
        got = self._read(order)
        rows = {f.name: np.zeros((self.buf.capacity,) + f.shape, f.dtype) for f in engine.fields}
        for k, a in rows.items():
            a[order] = got[k]
        td = self._rows(rows, self.buf.capacity, dense=True)
        return {"_storage": td.state_dict(), "initialized": True, "_len": len(order), "_order": torch.from_numpy(order)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a storage's state: this storage's, or a TorchRL ``TensorStorage``'s
        (``LazyTensorStorage``, ``LazyMemmapStorage``: their rows in slot order, the
        oldest at :attr:`cursor` if the storage was full: the replay buffer sets it to
        its writer's ``_cursor``; else at slot 0). The buffer is made now if this
        storage has none yet; its rows are replaced. Everything is checked first: a
        state this buffer cannot hold (another key, shape or dtype) raises and changes
        nothing."""
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
        try:
            td = stored if isinstance(stored, TensorDictBase) else TensorDict().load_state_dict(stored, strict=False)
            size = int(td.batch_size[0])
            if "_order" in state_dict:
                order = np.asarray(torch.as_tensor(state_dict["_order"]), dtype=np.int64).reshape(-1)
            else:
                n = int(state_dict["_len"])
                first = 0 if n < size or self.cursor is None else int(self.cursor) % size
                order = (first + np.arange(n)) % size
            if len(order) and (order.min() < 0 or order.max() >= size):
                raise ValueError(f"its order names slots {few(order)} of a storage of {size}")
            rows = without_index(td[torch.as_tensor(order)])
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as exc:
            raise ValueError(f"not a storage state this SharedStorage loads ({type(exc).__name__}: {exc}): expected "
                             "a SharedStorage's or a TorchRL TensorStorage's state_dict()") from None
        if self.buf is None:
            self.max_size = max(self.max_size, size)
            self.ensure(rows)
        buf = self.buf
        if len(order) > buf.capacity:  # (from a larger storage: the newest rows)
            rows, order = rows[-buf.capacity:], order[-buf.capacity:]
        data = self.arrays(rows)  # (checked: nothing is changed if this raises)
        self.restore(data, len(order), order)

    def restore(self, data: dict[str, np.ndarray], n: int, order: np.ndarray) -> None:
        """Replace the rows with the checked rows ``data``, oldest first, each in the
        lane of its slot in ``order`` (TorchRL's), from the lane's first slot; a lane's
        full ring at its slots (its oldest where ``order`` says). Slots past this
        buffer's (from a larger storage): lane after lane."""
        buf = self.buf
        lc = buf.lane_capacity
        self.clear()
        if not n:
            return
        if order.max() < buf.capacity:
            groups = [np.flatnonzero(order // lc == lane) for lane in range(buf.lanes)]
        else:
            groups = [np.arange(lane * lc, min((lane + 1) * lc, n)) for lane in range(buf.lanes)]
        for lane, rows in enumerate(groups):
            if not len(rows):
                continue
            slots = order[rows] % lc
            ring = len(rows) == lc and bool((np.diff(slots) % lc == 1).all())
            pad = int(slots[0]) if ring else 0
            if pad:  # rows of zeros first, so that the oldest row lands at its slot: the last rows overwrite them
                self.put({k: np.zeros((pad,) + v.shape[1:], v.dtype) for k, v in data.items()}, pad, lane=lane)
            self.put({k: v[rows] for k, v in data.items()}, len(rows), lane=lane)

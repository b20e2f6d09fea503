"""TorchRL's ``Writer`` and ``Sampler`` for a :class:`~shmbuf.compat.torchrl.storage.SharedStorage`:
shmbuf's write path and read path (see :mod:`shmbuf.compat.torchrl`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torchrl.data.replay_buffers.samplers import PrioritizedSampler, Sampler
from torchrl.data.replay_buffers.storages import Storage
from torchrl.data.replay_buffers.writers import Writer

from shmbuf.priority.trees import check_values

EMPTY = "Cannot sample from an empty storage."  # (TorchRL's words)
ROW = "shmbuf_row"  # a prioritized sample's key: each row's sequence number (its slot's "index" names the place)


class _Stateless:
    """What TorchRL asks a writer and a sampler to keep: nothing here, the buffer keeps it."""

    def _empty(self, *args: Any, **kwargs: Any) -> None:
        pass

    def dumps(self, path: Any) -> None:
        pass

    def loads(self, path: Any) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


class SharedWriter(_Stateless, Writer):
    """TorchRL's ``Writer`` for a ``SharedStorage``: shmbuf's write path (each process
    reserves rows in a lane of its own)."""

    def add(self, data: Any) -> Any:
        return self.extend(data.unsqueeze(0))[0]

    def extend(self, data: Any) -> torch.Tensor:
        return self._storage.write(data)

    _base = 0  # total_added when the count last started (empty(), load_state_dict)

    @property
    def _write_count(self) -> int:
        """Rows written since this buffer was made, emptied or restored, by every
        process (TorchRL's ``write_count``)."""
        buf = self._storage.buf
        return 0 if buf is None else buf.total_added - self._base

    @property
    def _cursor(self) -> int:
        """The slot this process's next row takes (TorchRL's writers' ``_cursor``): in
        its lane, or in lane 0 of a buffer of one lane."""
        buf = self._storage.buf
        if buf is None:
            return 0
        lane = buf.engine.lane if buf.lanes > 1 else 0
        if lane is None:
            raise AttributeError("_cursor: this process has no lane yet (it claims one at its first write)")
        return lane * buf.lane_capacity + self._storage.next_slot(lane)

    def _empty(self, empty_write_count: bool = True) -> None:
        count = self._write_count
        self._storage.clear()
        buf = self._storage.buf
        self._base = 0 if buf is None else buf.total_added - (0 if empty_write_count else count)

    def state_dict(self) -> dict[str, Any]:
        state = {"_write_count": self._write_count}
        if self._storage.buf is not None and self._storage.buf.lanes == 1:
            state["_cursor"] = self._cursor  # (for TorchRL's writers, which load it)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        count = state_dict.get("_write_count")
        buf = self._storage.buf
        if count is not None and buf is not None:
            self._base = buf.total_added - int(count)


class SharedSampler(_Stateless, Sampler):
    """TorchRL's ``Sampler`` for a ``SharedStorage``: uniform, through shmbuf's read
    path (draw, checked copy, redraw)."""

    def sample(self, storage: Storage, batch_size: int) -> tuple[Any, dict]:
        if storage.buf is None or len(storage) == 0:
            raise RuntimeError(EMPTY)
        storage.sampled = storage.batch(batch_size)
        return storage.sampled[0], {}


class SharedPrioritizedSampler(_Stateless, PrioritizedSampler):
    """TorchRL's ``PrioritizedSampler`` on shmbuf's priorities (a buffer made with
    ``priority=alpha``): rows drawn with probability ``(p + eps)**alpha`` over the sum,
    ``"priority_weight"`` ``(p_i / p_min)**-beta``, new rows at the largest priority
    set so far, as TorchRL's. Its trees live in the shared memory, so every process
    that attaches samples by the same priorities, and an ``update_priority`` applies
    only to rows still there (see :meth:`update_priority`)."""

    def __init__(self, storage: Any, alpha: float, beta: float, eps: float = 1e-8, reduction: str = "max") -> None:
        # (TorchRL's __init__ builds its C++ trees: shmbuf's are in the shared memory instead)
        if alpha < 0 or beta < 0 or eps < 0:
            raise ValueError(f"alpha, beta and eps must be >= 0, got {alpha}, {beta}, {eps}")
        self._alpha, self._beta, self._eps, self.reduction = float(alpha), float(beta), float(eps), reduction
        self._shared_storage, self._largest = storage, None
        self.dtype, self._max_priority_within_buffer = torch.float, False

    @property
    def default_priority(self) -> float:
        """The largest priority this handle set, 1.0 before any (TorchRL's default for
        rows that come without one; shmbuf gives them the largest of every process)."""
        return 1.0 if self._largest is None else self._largest

    @property
    def _max_priority(self) -> tuple[Any, Any]:
        return (self._largest, None)

    @property
    def max_size(self) -> int:
        return self._shared_storage.max_size

    def add(self, index: Any) -> None:
        pass

    def extend(self, index: Any) -> None:
        pass

    def mark_update(self, index: Any, *, storage: Any = None) -> None:
        pass

    def sample(self, storage: Storage, batch_size: int) -> tuple[Any, dict]:
        if storage.buf is None or len(storage) == 0:
            raise RuntimeError(EMPTY)
        index, rows, weight, seqs = storage.batch_by_priority(batch_size, self._beta)
        storage.sampled = (index, rows)
        return index, {"priority_weight": weight, ROW: seqs}

    @torch.no_grad()
    def update_priority(self, index: Any, priority: Any, *, storage: Any = None, rows: Any = None) -> None:
        """Set ``priority`` (one, or one per index) of the rows at slots ``index``
        (a sample's ``"index"``): the rows ``rows`` (a sample's ``"shmbuf_row"``;
        default: the rows this handle last sampled there), skipped if they were
        overwritten since (the new row keeps its own priority)."""
        storage = self._shared_storage
        slots = torch.as_tensor(index).reshape(-1).cpu().numpy().astype(np.int64)
        seqs = None if rows is None else torch.as_tensor(rows).reshape(-1).cpu().numpy().astype(np.int64)
        p = torch.as_tensor(priority, dtype=torch.float64).reshape(-1).cpu().numpy()
        if p.size == 1:
            p = np.full(len(slots), p[0])
        if len(p) != len(slots):
            raise ValueError(f"update_priority: {len(p)} priorities for {len(slots)} indices")
        if len(slots) and (slots.min() < 0 or slots.max() >= storage.max_size):
            raise IndexError(f"update_priority: index: slots are in [0, {storage.max_size}), got {slots.min()} .. "
                             f"{slots.max()}")
        if not np.isfinite(p).all() or (p < 0).any():
            raise ValueError(f"update_priority: priorities must be finite and >= 0, got "
                             f"{p[~(np.isfinite(p) & (p >= 0))][:5].tolist()}")
        if (p + self._eps <= 0).any():
            raise ValueError(f"update_priority: a priority of 0 with eps={self._eps:g} gives its row the probability "
                             "0 ((priority + eps)**alpha), so it would never be drawn again: pass priorities > 0, "
                             "or make the buffer with eps > 0 (TorchRL's default, 1e-8)")
        if storage.buf is not None:  # (p + eps)**alpha within what the trees' sum holds, or ValueError
            check_values(p + self._eps, len(p), "update_priority", self._alpha, storage.buf.capacity)
        if len(slots):
            storage.set_priority(slots, p + self._eps, seqs)
            top = float(p.max())
            self._largest = top if self._largest is None else max(self._largest, top)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(alpha={self._alpha}, beta={self._beta}, eps={self._eps}, reduction={self.reduction})"

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

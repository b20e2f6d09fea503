"""Reads by index (``rb[i]``, ``rb[a:b]``, ``rb.storage[i]``, iterating a storage): the
rows that given slots hold now, through the one read path.

A TorchRL storage is an array of ``max_size`` slots read by position; TorchRL's
storages index the slots that hold rows (``storage[:len][index]``). Here the slots that
hold rows are those of each lane's window, in slot order (:func:`occupied`): in a buffer
of one lane that was never emptied, slots ``0 .. len - 1``, exactly TorchRL's. An index
(an int, negative ones too, a slice, a list, an array or a tensor of ints) picks among
them (:func:`pick`), and :class:`Slots` copies what those slots hold through the checked
gather: a row being written or overwritten during the copy is read again (then it is
the newer row, as it would be in TorchRL's storage a moment later), never returned torn.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shmbuf.core.read import Sampler


def occupied(engine: Any) -> tuple[np.ndarray, np.ndarray]:
    """The slots holding rows now, as ranges in slot order: ``(starts, counts)``."""
    lo, head = engine.window()
    lc = engine.layout.lane_capacity
    starts, counts = [], []
    for lane, (a, b) in enumerate(zip(lo.tolist(), head.tolist())):
        n = min(b - a, lc)
        if n <= 0:
            continue
        first, base = (b - n) % lc, lane * lc
        if first + n <= lc:
            starts.append(base + first)
            counts.append(n)
        else:  # the ring wrapped: its low part is first in slot order
            starts += [base, base + first]
            counts += [first + n - lc, lc - first]
    return np.array(starts, np.int64), np.array(counts, np.int64)


def pick(engine: Any, index: Any) -> tuple[np.ndarray, bool]:
    """The slots that ``index`` names among those holding rows, and whether it was one
    int (the read is then one row, without a batch dimension). ``IndexError`` past them."""
    starts, counts = occupied(engine)
    total = int(counts.sum())
    if hasattr(index, "detach"):  # (a tensor)
        index = index.detach().cpu().numpy()
    scalar = isinstance(index, (int, np.integer)) or (isinstance(index, np.ndarray) and index.ndim == 0
                                                    and index.dtype.kind in "iu")
    if scalar:
        i = int(index)
        if not -total <= i < total:
            raise IndexError(f"index {i} is out of range: the storage holds {total} rows")
        k = np.array([i % total], np.int64)
    elif isinstance(index, slice):
        k = np.arange(total, dtype=np.int64)[index]
    else:
        k = np.asarray(index)
        if k.dtype == bool:
            if k.shape != (total,):
                raise IndexError(f"a boolean index of shape {k.shape} for a storage holding {total} rows")
            k = np.flatnonzero(k)
        elif k.dtype.kind not in "iu":
            raise IndexError(f"rows are read by ints, slices, or arrays of ints or booleans; got {k.dtype} {index!r}")
        k = k.astype(np.int64).ravel()
        if len(k) and (k.min() < -total or k.max() >= total):
            raise IndexError(f"index out of range: the storage holds {total} rows")
        k = k % max(total, 1)
    ends = np.cumsum(counts)
    r = np.searchsorted(ends, k, side="right")  # the range of each
    return starts[r] + k - (ends[r] - counts[r]), scalar


class Slots(Sampler):
    """The rows the slots ``slots`` hold, for :func:`shmbuf.core.read.read`: each slot's
    row is the newest of its lane at that position; a slot that holds no row any more
    (emptied meanwhile) is an ``IndexError``."""

    what = "rows at the given slots"

    def __init__(self, engine: Any, slots: np.ndarray) -> None:
        self.engine, self.slots = engine, slots
        self.fields = engine.fields

    def empty(self, m: int) -> dict[str, np.ndarray]:
        return {f.name: np.empty((m,) + f.shape, f.dtype) for f in self.fields}

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> tuple[np.ndarray, np.ndarray]:
        window = self.engine.window()
        lc = self.engine.layout.lane_capacity
        slots = self.slots[todo]
        lane = slots // lc
        seq = self.engine.rows_at(lane, slots % lc, window)
        gone = seq < window[0][lane]
        if gone.any():
            raise IndexError(f"slot {int(slots[gone][0])} holds no row now (the buffer was emptied meanwhile)")
        return lane, seq

    def gather(self, drawn: tuple[np.ndarray, np.ndarray], out: dict[str, np.ndarray]) -> np.ndarray | None:
        return self.engine.gather(drawn[0], drawn[1], 1, list(out.values()))

"""Slots as TorchRL numbers them, and reads by index (``rb[i]``, ``rb[a:b]``, iterating
a storage, TorchRL's samplers' indices): the rows that given slots hold now, through
the one read path.

**Slots.** A TorchRL storage is an array of ``max_size`` slots; its writer fills them
from slot 0 and, once full, overwrites the oldest; ``empty()`` starts again at slot 0.
Here lane ``k`` holds the slots ``k * lane_capacity ...``, and a lane's rows are
numbered from its *base* (its first row since the last clear or restore), so the row
``seq`` of lane ``k`` is at slot ``k * lane_capacity + (seq - base) % lane_capacity``
(:func:`slot_of`): in a buffer of one lane, TorchRL's slot exactly, emptied or not. The
position in the segment (``seq % lane_capacity``) is the core's business
(:func:`position_of`).

**Reads.** The slots that hold rows are, per lane, the first ``rows held`` ones (a
lane fills its slots from its first); an index (an int, negative ones too, a slice, a
list, an array or a tensor of ints, or of booleans) picks among them in slot order
(:func:`pick`), as TorchRL's storages index ``storage[:len]``. :class:`Slots` copies
what those slots hold through the checked gather: a row being written or overwritten
during the copy is read again (then it is the newer row, as it would be in TorchRL's
storage a moment later), never returned torn.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shmbuf.core import pool
from shmbuf.core.read import Sampler


def held(engine: Any) -> np.ndarray:
    """The rows each lane holds now (its first that many slots)."""
    lo, head = engine.window()
    return np.minimum(head - lo, engine.layout.lane_capacity)


def slot_of(engine: Any, lane: np.ndarray, seq: np.ndarray, bases: np.ndarray | None = None) -> np.ndarray:
    """TorchRL's slot of the rows ``seq`` of ``lane`` (see the module)."""
    lc = engine.layout.lane_capacity
    bases = engine.bases() if bases is None else bases
    return lane * lc + (seq - bases[lane]) % lc


def position_of(engine: Any, slots: np.ndarray, bases: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The lane and the position in it (``seq % lane_capacity``) of TorchRL's ``slots``."""
    lc = engine.layout.lane_capacity
    bases = engine.bases() if bases is None else bases
    lane = slots // lc
    return lane, (slots % lc + bases[lane]) % lc


def pick(engine: Any, index: Any) -> tuple[np.ndarray, bool]:
    """The slots that ``index`` names among those holding rows, and whether it was one
    int (the read is then one row, without a batch dimension). ``IndexError`` past them."""
    counts = held(engine)
    starts = np.arange(len(counts), dtype=np.int64) * engine.layout.lane_capacity
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
    r = np.searchsorted(ends, k, side="right")  # the lane of each
    return starts[r] + k - (ends[r] - counts[r]), scalar


class Slots(Sampler):
    """The rows the slots ``slots`` (TorchRL's) hold, for :func:`shmbuf.core.read.read`:
    each slot's row is the newest of its lane at that position; a slot that holds no row
    any more (emptied meanwhile) is an ``IndexError``."""

    what = "rows at the given slots"

    def __init__(self, engine: Any, slots: np.ndarray) -> None:
        self.engine, self.slots = engine, slots
        self.fields = engine.fields

    def empty(self, m: int) -> dict[str, np.ndarray]:
        return pool.batch(self.fields, m)

    def draw(self, todo: np.ndarray, rounds: int, deadline: float) -> tuple[np.ndarray, np.ndarray]:
        window = self.engine.window()
        lane, position = position_of(self.engine, self.slots[todo])
        seq = self.engine.rows_at(lane, position, window)
        gone = seq < window[0][lane]
        if gone.any():
            raise IndexError(f"slot {int(self.slots[todo][gone][0])} holds no row now (the buffer was emptied "
                             "meanwhile)")
        return lane, seq

    def gather(self, drawn: tuple[np.ndarray, np.ndarray], out: dict[str, np.ndarray]) -> np.ndarray | None:
        return self.engine.gather(drawn[0], drawn[1], 1, list(out.values()))


def few(a: np.ndarray) -> str:
    """A few of the ints ``a``, for an error message."""
    a = np.asarray(a).tolist()
    return str(a) if len(a) <= 6 else f"[{', '.join(map(str, a[:3]))}, ..., {', '.join(map(str, a[-2:]))}]"

"""How a ``ReplayBuffer`` of the imitation facade keeps its ``infos``: one of two parts,
chosen when a handle opens by the segment's ``infos`` field: :class:`Records` (a
ragged field: a record of any size per row, :mod:`shmbuf.compat.records`) or
:class:`FixedRows` (a fixed field of ``info_bytes`` bytes a row: segments an older
shmbuf made, :func:`shmbuf.compat.infos.encode`). Both give ``encode(infos, n)`` (the
field's rows and the keys left out), ``decode(value)`` (a sample's field as its dicts),
``slots(handle)`` (every slot's dict, imitation's ``_arrays["infos"]``) and ``WHY``
(what the warning about keys left out says).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shmbuf.compat.infos import decode_rows, encode
from shmbuf.compat.records import pack, unpack_rows

MIN_ARENA = 1 << 20  # bytes: a ReplayBuffer's infos arena, at least (capacity x info_bytes otherwise)


class Records:
    """Each row's infos as one record of any size in the buffer's arena (``infos`` a
    ragged ``uint8`` field): what :func:`~shmbuf.compat.records.pack` keeps."""

    WHY = ("they hold objects that only pickle could keep (the rows keep dicts, lists, tuples, None, "
           "numbers, strings, bytes and numpy arrays: see shmbuf.compat.records.pack)")

    def __init__(self, lane_arena: int) -> None:
        self.arena = lane_arena  # (bytes of the lane's arena: a write's records must fit it)

    def encode(self, infos: Any, n: int) -> tuple[np.ndarray, list[str]]:
        out = np.empty(n, dtype=object)
        if infos is None:
            for i in range(n):
                out[i] = np.zeros(0, np.uint8)
            return out, []
        left: set[str] = set()
        for i, info in enumerate(infos):
            record, gone = pack(info)
            out[i] = np.frombuffer(record, np.uint8)
            left.update(gone)
            if len(record) > self.arena:
                raise ValueError(f"the infos of transition {i} take {len(record):,} bytes, more than the replay "
                                 f"buffer's arena holds ({self.arena:,} bytes); nothing was stored. Create it "
                                 "with a larger info_bytes= (its arena is capacity x info_bytes bytes, at least "
                                 f"{MIN_ARENA:,})")
        return out, sorted(left)

    def parts(self, rows: dict[str, Any]) -> list[slice]:
        """The rows of one store in parts whose records each fit the arena (one part,
        unless the records of all take more than it holds: then the oldest leave as the
        later parts are written, as in a run of stores)."""
        records = rows["infos"]
        sizes = np.fromiter((-(-len(r) // 8) * 8 for r in records), np.int64, len(records))
        if sizes.sum() <= self.arena:
            return [slice(None)]
        parts, start, used = [], 0, 0
        for i, size in enumerate(sizes.tolist()):
            if used + size > self.arena:
                parts.append(slice(start, i))
                start, used = i, 0
            used += size
        return parts + [slice(start, len(records))]

    def decode(self, value: Any) -> np.ndarray:
        return unpack_rows(value.values, value.offsets)

    def slots(self, handle: Any) -> np.ndarray:
        """Every slot's dict (``{}`` where no row is: never written, or left), read with
        the checked read (``state_dict``: a row written meanwhile shows ``{}``)."""
        state = handle.state_dict()
        out = np.empty(len(state["stamps"]), dtype=object)
        out[:] = [{} for _ in range(len(out))]
        values, offsets = state["ragged"]["infos"]
        out[np.flatnonzero(state["stamps"])] = unpack_rows(values, offsets)
        return out


class FixedRows:
    """Each row's infos in ``info_bytes`` bytes of the row (``infos`` a fixed ``uint8``
    field): the layout of segments an older shmbuf made, read and written as it did
    (:func:`~shmbuf.compat.infos.encode`)."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.WHY = ("it keeps numbers, booleans, strings and numpy arrays of them within info_bytes="
                    f"{width} bytes a row (a segment an older shmbuf made; a new ReplayBuffer keeps any size)")

    def encode(self, infos: Any, n: int) -> tuple[np.ndarray, list[str]]:
        out = np.zeros((n, self.width), np.uint8)
        if infos is None:
            return out, []
        return out, sorted({k for i, info in enumerate(infos) for k in encode(info, out[i])})

    def parts(self, rows: dict[str, Any]) -> list[slice]:
        """One store, one write: its rows' infos are as wide as the rows."""
        return [slice(None)]

    def decode(self, value: np.ndarray) -> np.ndarray:
        return decode_rows(value)

    def slots(self, handle: Any) -> np.ndarray:
        return decode_rows(handle.engine.view("infos"))

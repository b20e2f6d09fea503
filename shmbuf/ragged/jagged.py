"""One ragged field of a batch: ``values`` and ``offsets`` (placeholder; see the full class)."""

from __future__ import annotations

from typing import Any

import numpy as np


class Jagged:
    """Rows of varying length: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``."""

    def __init__(self, values: np.ndarray, offsets: np.ndarray) -> None:
        self.values, self.offsets = values, np.asarray(offsets, np.int64)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, (int, np.integer)):
            return self.values[self.offsets[i]:self.offsets[i + 1]]
        at = np.arange(len(self))[i]
        lengths = self.lengths[at]
        out = Jagged.empty(lengths, self.values.dtype, self.values.shape[1:])
        for k, j in enumerate(at.tolist()):
            out.values[out.offsets[k]:out.offsets[k + 1]] = self.values[self.offsets[j]:self.offsets[j + 1]]
        return out

    @classmethod
    def concatenate(cls, parts: list["Jagged"]) -> "Jagged":
        values = np.concatenate([p.values[p.offsets[0]:p.offsets[-1]] for p in parts])
        lengths = np.concatenate([p.lengths for p in parts])
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(values, offsets)

    @classmethod
    def empty(cls, lengths: np.ndarray, dtype: Any, trailing: tuple = ()) -> "Jagged":
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(np.empty((int(offsets[-1]),) + tuple(trailing), dtype), offsets)

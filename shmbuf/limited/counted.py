"""The write part of a buffer created with ``max_times_sampled=k``.

Examples:
    >>> import shmbuf
    >>> buf = shmbuf.Buffer.create({"x": ((), "int64")}, 4, max_times_sampled=2)
    >>> type(buf.engine.writes).__name__, TIMES in buf.engine.layout.stored()
    ('Counted', True)
    >>> buf.close()
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from shmbuf.core.batch import rows_of
from shmbuf.core.plain import Replay


TIMES = "times_sampled"
"""The field of a buffer created with ``max_times_sampled=``: how many samples returned the row."""


class Counted(Replay):
    """The write part of a buffer created with ``max_times_sampled=k``: every row is
    written with its count of samples at 0 (:data:`TIMES`), which its sampler
    (:mod:`shmbuf.limited.sampler`) counts up; every other read is refused, since it
    would return rows without counting them."""

    adds = True

    def __init__(self, ring: Any, k: int) -> None:
        super().__init__(ring)
        self.k = k  # (the most samples a row may be returned by)

    def stamp(self, data: Any, single: bool) -> Any:
        if not isinstance(data, Mapping):
            return data  # (the schema check explains what is wrong)
        if TIMES in data:
            raise ValueError(f"{TIMES!r} is kept by shmbuf: it counts the samples that returned each row")
        return {**data, TIMES: 0 if single else np.zeros(rows_of(data), np.int64)}

    def stats(self) -> dict[str, Any]:
        """``rows_used_up``: rows held that ``max_times_sampled`` samples returned (a scan)."""
        k, lc, times = self.k, self.ring.lane_capacity, self.ring.arrays[TIMES]
        lo, head = self.ring.window()
        used = sum(int((times[lane * lc + np.arange(a, b) % lc] >= k).sum())
                   for lane, (a, b) in enumerate(zip(lo.tolist(), head.tolist())))
        return {"max_times_sampled": k, "rows_used_up": used}

    @staticmethod
    def check_rows(arrays: dict[str, np.ndarray], kept: np.ndarray) -> None:
        """Raise the ``ValueError`` of a state dict whose counts (:data:`TIMES`, at the
        slots ``kept`` restored) are below 0."""
        low = np.asarray(arrays[TIMES][kept])
        if (low < 0).any():
            raise ValueError(f"state_dict['data'][{TIMES!r}] holds counts below 0 ({int((low < 0).sum())} "
                             f"row(s), the least {int(low.min())}): each is how many samples returned its row, "
                             "from 0, and would let the row out more than max_times_sampled times; restore "
                             "an unedited state_dict() or save")

    def check_sample(self) -> None:
        raise ValueError("this buffer counts the samples of each row (max_times_sampled=): only sample() "
                         "reads it, one row at a time, since other reads would return rows uncounted")

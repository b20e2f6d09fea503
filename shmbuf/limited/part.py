"""Rows sampled at most ``k`` times as a part (``Buffer.create(...,
max_times_sampled=k)``; see :mod:`shmbuf.parts` and :mod:`shmbuf.limited.sampler`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from shmbuf.limited.counted import TIMES, Counted
from shmbuf.limited.sampler import Limited

KEY = KEYWORD = "max_times_sampled"
EXCLUDES = {
    "priority": "max_times_sampled= is for a replay buffer sampled uniformly (a count of samples per row "
                "needs every row equally likely); choose one",
    "sampler": "max_times_sampled= is for a replay buffer sampled uniformly (its own sampler counts each row); "
               "leave sampler= out",
}


def spec(k: Any) -> dict | None:
    if k is None:
        return None
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"max_times_sampled must be an int >= 1 (or None: no limit), got {k!r}")
    return {"k": int(k)}


def keyword(spec_: dict | None) -> int | None:
    return None if spec_ is None else spec_["k"]


def plan(spec_: dict, p: Any) -> None:
    p.add_field(TIMES, (), np.int64, "a buffer created with max_times_sampled= counts each row's samples there")


check_rows = Counted.check_rows  # (a load's check of the counts it restores)


def open(spec_: dict, engine: Any) -> dict[str, Any]:
    return {"writes": Counted(engine.ring, spec_["k"]), "sampler": Limited}

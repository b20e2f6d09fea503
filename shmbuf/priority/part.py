"""Priorities as a part (``Buffer.create(..., priority=a)``; see :mod:`shmbuf.parts`):
rows drawn with probability ``p**a / sum p**a`` by the trees of
:mod:`shmbuf.priority.trees`, with ``weight`` and ``index``."""

from __future__ import annotations

from typing import Any

import numpy as np

from shmbuf.priority import trees
from shmbuf.priority.prioritized import Prioritized
from shmbuf.priority.values import check_alpha

KEY = KEYWORD = "priority"
EXCLUDES = {"sampler": "a prioritized buffer is sampled by priority: leave sampler= out, or priority= for "
                       "another sampler"}


def spec(alpha: Any) -> dict | None:
    return None if alpha is None else {"alpha": check_alpha(alpha)}


def keyword(spec_: dict | None) -> float | None:
    return None if spec_ is None else spec_["alpha"]


def plan(spec_: dict, p: Any) -> None:
    p.add_field(trees.FIELD, (), np.float64, "a prioritized buffer keeps the priority a writer passes there")
    p.add_region(trees.REGION, trees.region_bytes(p.capacity, p.lanes))


def open(spec_: dict, engine: Any) -> dict[str, Any]:
    return {"priorities": trees.Trees(engine, spec_), "sampler": Prioritized}

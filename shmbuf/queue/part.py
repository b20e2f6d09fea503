"""The queue as a part (``Buffer.create(..., mode="queue")``; see :mod:`shmbuf.parts`):
rows stamped with the time their write began, written only where there is room, taken
in order, each once (:mod:`shmbuf.queue.protocol`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from shmbuf.queue import protocol, restart
from shmbuf.queue.consumed import Consumed

KEY = "queue"
KEYWORD = "mode"
EXCLUDES = {
    "priority": "a queue is consumed in order with take(), never sampled by priority; create a replay "
                "buffer (the default mode) for priority=",
    "rate": "a queue's writers wait for room and its takers for rows: it keeps no rate limit; leave rate= out",
    "max_times_sampled": "a queue delivers each row once, to one take; leave max_times_sampled= out",
    "sampler": "a queue is consumed in order with take(), never sampled; leave sampler= out",
}


def spec(mode: Any) -> dict | None:
    if mode not in ("replay", "queue"):
        raise ValueError(f"mode must be 'replay' or 'queue', got {mode!r}")
    return {} if mode == "queue" else None


def keyword(spec_: dict | None) -> str:
    return "replay" if spec_ is None else "queue"


def plan(spec_: dict, p: Any) -> None:
    p.add_field(protocol.FIELD, (), np.int64, "a queue keeps the time each write began there")
    p.add_region(protocol.REGION, protocol.region_bytes(p.lanes))
    if p.durable:  # (a queue in a file: snapshots of its words for a restart)
        p.add_region(restart.REGION, restart.region_bytes(p.lanes))


def open(spec_: dict, engine: Any) -> dict[str, Any]:
    regions = engine.layout.regions
    queue = protocol.Queue(engine.ring, engine.lock, regions.get(protocol.REGION, (0, -1)), engine.seg.mmap,
                           regions.get(restart.REGION))
    queue.finish = lambda batch, deadline, timeout, reuse: engine.records.finish(batch, None, deadline, timeout,
                                                                                reuse=reuse)
    return {"writes": queue, "sampler": Consumed}

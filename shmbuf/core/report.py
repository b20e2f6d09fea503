"""A buffer's counters as one report: totals, per process, per lane (``stats()``,
``shmbuf stat``/``watch``). The counters themselves live in the segment; see
:mod:`shmbuf.core.counters`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from shmbuf.core import procs
from shmbuf.core.counters import COUNTERS, H_FOLD, L_CTIME, L_PID, L_TIME, NSLOTS, S_CTIME, S_PID
from shmbuf.core.engine import Engine
from shmbuf.core.layout import LANE_CLAIM_CTIME, LANE_CLAIM_PID, LANE_HEAD
from shmbuf.core.seqlock import read_stable


def read(engine: Engine) -> dict[str, Any]:
    """A buffer's counters: totals, per process and per lane (see :meth:`Buffer.stats`)."""
    c = engine.counters
    ring = engine.ring
    lanes = []
    heads = ring.lane_table[:, LANE_HEAD].copy()
    claims = ring.lane_table[:, [LANE_CLAIM_PID, LANE_CLAIM_CTIME]].copy()
    claim_ctimes = claims[:, 1].view(np.float64)
    lo, head = ring.window()
    sizes = [int(x) for x in head - lo]
    out: dict[str, Any] = {"name": engine.name, "time": time.time(), "rows": int(sum(sizes)),
                           "capacity": engine.layout.capacity, "rows_inserted": int(heads.sum())}
    if not c.present:
        out.update({k: None for k in COUNTERS}, processes=[], lanes=[])
        return out
    stable, slots = read_stable(lambda: int(c.head[H_FOLD]), c.slots.copy, pause=1e-4)
    if slots is None:  # (a fold that never ended: its process died inside it; the counts as they are)
        slots = c.slots.copy()
    slots_f = slots.view(np.float64)
    for k, i in COUNTERS.items():
        out[k] = int(slots[:, i].sum())
    out["lock_wait_seconds"] = out.pop("lock_wait_ns") / 1e9
    by_pid: dict[int, dict[str, Any]] = {}  # (a process may have several handles: one line)
    for i in range(1, NSLOTS):
        pid = int(slots[i, S_PID])
        if pid:
            p = by_pid.setdefault(pid, {"pid": pid, "alive": procs.is_alive(pid, float(slots_f[i, S_CTIME])),
                                        **{k: 0 for k in COUNTERS}})
            for k, j in COUNTERS.items():
                p[k] += int(slots[i, j])
    out["processes"] = list(by_pid.values())
    lane_rows = c.lanes.copy()
    lane_f = lane_rows.view(np.float64)
    for i in range(engine.layout.lanes):
        pid = int(lane_rows[i, L_PID])
        claim = int(claims[i, 0])
        lanes.append({"lane": i, "rows": sizes[i], "rows_inserted": int(heads[i]),
                      "writer_pid": pid or None,
                      "writer_alive": procs.is_alive(pid, float(lane_f[i, L_CTIME])) if pid else None,
                      "last_write": float(lane_f[i, L_TIME]) or None,
                      "claimed_by": claim or None,
                      "claim_alive": procs.is_alive(claim, float(claim_ctimes[i])) if claim else None})
    out["lanes"] = lanes
    return out

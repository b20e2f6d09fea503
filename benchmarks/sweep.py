"""What the docs' plots draw (``scripts/bench --sweep``): how ingest and a learner's
batches grow with the number of writer processes, and what one ``sample(256)`` costs as
the buffer grows. mujoco rows; shmbuf (both paths) beside cpprb's ``MPReplayBuffer``, the
``multiprocessing.Queue`` pipeline and the in-process numpy ring, measured side by side
(every repeat runs each system in turn). Samples are the default call (a new batch each
call, as users write it; before 2026-11-29 shmbuf's and the numpy ring's used ``out=``). Writes ``results/bench-sweep-<time>.json``;
``scripts/plots FILE`` draws it.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

from benchmarks.config import local_loop
from benchmarks.peers import (WORKLOADS, CpprbSystem, NaiveSystem, NumpySystem, ShmbufSystem,
                              Workload)
from benchmarks.run import CTX, WriterPool, machine

WRITERS = (1, 2, 3, 4)
CAPACITIES = (10_000, 100_000, 1_000_000, 4_000_000)
CHUNK = 64
FIELDS = WORKLOADS["mujoco"].fields


def _make(name: str, wl: Workload, lanes: int) -> Any:
    if name in ("shmbuf", "shmbuf-py"):
        return ShmbufSystem(wl, pure=name == "shmbuf-py", lanes=lanes)
    if name == "cpprb":
        return CpprbSystem(wl, CTX)
    if name == "naive":
        return NaiveSystem(wl, CTX)
    return NumpySystem(wl)


ATARI = Workload("atari", 50_000, WORKLOADS["atari"].fields)
"""Frames for the atari sweep: 2.8 GB a buffer, far past any cache, three at once."""


def writers(peers: list[str], repeats: int, window: float, note: Any, wl: Workload | None = None) -> dict[str, Any]:
    """Ingest (rows/s, 64-row adds) and the learner's batches/s while 1..4 writers add
    (mujoco rows, or the rows of ``wl``)."""
    from benchmarks.learner import NAME, LearnerFirst

    wl = wl or Workload("mujoco", 262_144, FIELDS)
    fill = wl.data(1024 if wl.row_bytes < 4096 else 64, 3)
    systems = {p: LearnerFirst(wl, lanes=max(WRITERS)) if p == NAME else _make(p, wl, max(WRITERS))
               for p in peers if p != "numpy"}
    for s in systems.values():
        s.fill(fill)
    pools = {p: WriterPool(s, size=max(WRITERS)) for p, s in systems.items()}
    if "naive" in systems:  # (after the fork: the ring is the learner's private memory)
        floor = NumpySystem(wl)
        floor.fill(fill)
        systems["naive"].ring = floor.ring
    out: dict[str, Any] = {p: {"ingest": {}, "batches": {}} for p in systems}
    try:
        for rep in range(repeats):
            for n in WRITERS:
                for p, pool in pools.items():
                    note(f"writers: repeat {rep + 1}/{repeats}, {n} writers, {p}")
                    res = pool.window(n, CHUNK, window, "sample")
                    out[p]["ingest"].setdefault(str(n), []).append(res["rows/s"])
                    out[p]["batches"].setdefault(str(n), []).append(res["batches/s"])
    finally:
        for pool in pools.values():
            pool.close()
        for s in systems.values():
            s.close()
    return out


def capacity(peers: list[str], repeats: int, window: float, note: Any) -> dict[str, Any]:
    """Microseconds per ``sample(256)`` of a full buffer of each capacity, no writer."""
    out: dict[str, Any] = {p: {} for p in peers if p != "naive"}
    for cap in CAPACITIES:
        wl = Workload("mujoco", cap, FIELDS)
        fill = wl.data(1024, 3)
        systems = {p: _make(p, wl, 2) for p in out}
        try:
            for s in systems.values():
                s.fill(fill)
            for rep in range(repeats):
                for p, s in systems.items():
                    note(f"capacity {cap:,}: repeat {rep + 1}/{repeats}, {p}")
                    out[p].setdefault(str(cap), []).append(1e6 / local_loop(s.sampler(), window))
        finally:
            for s in systems.values():
                s.close()
    return out


def run(peers: list[str], quick: bool, progress: bool = True) -> dict[str, Any]:
    repeats, window = (2, 0.3) if quick else (3, 1.0)

    def note(what: str) -> None:
        if progress:
            print(f"\r\033[K  {what}", end="", file=os.sys.stderr, flush=True)
    res = {"kind": "sweep", "machine": machine(), "config": {"repeats": repeats, "window": window, "chunk": CHUNK},
           "writers": writers(peers, repeats, window, note), "capacity": capacity(peers, repeats, window, note)}
    atari = [p for p in ("shmbuf", "shmbuf-lf", "cpprb") if p in peers or p == "shmbuf-lf" and "shmbuf" in peers]
    res["writers atari"] = writers(atari, repeats, window, note, ATARI)
    if progress:
        print("\r\033[K", end="", file=os.sys.stderr)
    return res


def markdown(res: dict[str, Any]) -> str:
    med = statistics.median
    c = res["capacity"]
    lines: list[str] = []
    for key, what in (("writers", "mujoco"), ("writers atari", "atari")):
        w = res.get(key)
        if not w:
            continue
        lines += [f"| {what}: writers x64 | " + " | ".join(f"{p} ingest rows/s | {p} batches/s" for p in w) + " |",
                  "|---|" + "---:|---:|" * len(w)]
        for n in WRITERS:
            cells = [f"{med(w[p]['ingest'][str(n)]):,.0f} | {med(w[p]['batches'][str(n)]):,.0f}" for p in w]
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["| capacity | " + " | ".join(f"{p} us per sample(256)" for p in c) + " |",
              "|---:|" + "---:|" * len(c)]
    for cap in CAPACITIES:
        lines.append(f"| {cap:,} | " + " | ".join(f"{med(c[p][str(cap)]):.1f}" for p in c) + " |")
    return "\n".join(lines)


def save(res: dict[str, Any], folder: str = "results") -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"bench-sweep-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    return path

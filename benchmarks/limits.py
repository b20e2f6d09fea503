"""What the machine allows, measured beside the systems: memory bandwidth and the
gather's floor, the cost of the protocol's pieces (the lock, the stamp check), and the
memory a process that attaches pays."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import statistics
import time
from typing import Any

import numpy as np
import psutil

import shmbuf
from shmbuf.core import segment

from benchmarks.config import Config, Results, local_loop
from benchmarks.peers import (BATCH, WORKLOADS, ShmbufSystem, Workload)
from shmbuf.core.layout import published

CTX = mp.get_context("fork")


LIMIT_GATHERS = ("private", "private rows")
"""The gathers a part measured alone (``--episodes only``) takes its limits from."""


def physical_limits(r: Results, cfg: Config, workloads: list[Workload] | None = None,
                    wheres: tuple[str, ...] = ("shared", "rows") + LIMIT_GATHERS) -> None:
    """memcpy bandwidth, and random-row gathers of each workload (``cfg.workloads``
    unless given) from shared and private memory, of each field's array or of whole rows
    ("rows": one array of the row's bytes); then each workload's limits
    (:func:`record_limits`)."""
    if "memcpy GB/s" not in r.extra:
        src = np.ones(256 << 20, np.uint8)
        dst = np.empty_like(src)
        best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(5))
        r.extra["memcpy GB/s"] = src.nbytes / best / 1e9
        del src, dst
    for wl in workloads if workloads is not None else [WORKLOADS[w] for w in cfg.workloads]:
        cap = limit_rows(wl)
        seg = segment.Segment.create(f"bench-gather-{os.getpid()}", cap * wl.row_bytes)
        try:
            private = bytearray(cap * wl.row_bytes) if any(w.startswith("private") for w in wheres) else None
            gathers = {where: _gatherer(_one_array(wl) if where.endswith("rows") else wl,
                                        private if where.startswith("private") else seg.mmap, cap)
                       for where in wheres}
            rates: dict[str, list[float]] = {where: [] for where in wheres}
            for _ in range(3):  # the gathers in turn: drift on a shared machine hits them alike
                for where, gather in gathers.items():
                    rates[where].append(local_loop(gather, 0.3))
            del gathers, private
            for where, got in rates.items():
                rate = statistics.median(got)
                r.extra.setdefault("gather GB/s", {}).setdefault(wl.name, {})[where] = \
                    rate * BATCH * wl.row_bytes / 1e9
                r.extra.setdefault("gather batches/s", {}).setdefault(wl.name, {})[where] = rate
        finally:
            seg.unlink()
            seg.close()
        record_limits(r, wl)


class RepeatGathers:
    """The :data:`LIMIT_GATHERS` of a workload kept ready for the whole workload, so each
    repeat measures its limit beside its samples (:meth:`measure`): drift on a shared
    machine then hits the limit as it hits the figures set against it."""

    def __init__(self, wl: Workload) -> None:
        self.wl = wl
        self.cap = limit_rows(wl)
        self.mem = bytearray(self.cap * wl.row_bytes)  # (private: built after the writers are forked)
        self.gathers = {where: _gatherer(_one_array(wl) if where.endswith("rows") else wl, self.mem, self.cap)
                        for where in LIMIT_GATHERS}

    def measure(self, r: Results, seconds: float) -> None:
        """One window of each gather; ``r.extra["limit repeats"][wl]`` gains the fastest."""
        best = max(local_loop(g, seconds) for g in self.gathers.values())
        r.extra.setdefault("limit repeats", {}).setdefault(self.wl.name, []).append(best)

    def close(self) -> None:
        self.gathers.clear()
        self.mem = bytearray()


def limit_rows(wl: Workload) -> int:
    """Rows of a limit gather: 1 GiB of the workload's rows (enough to miss the caches)."""
    return min(wl.capacity, (1 << 30) // wl.row_bytes)


def record_limits(r: Results, wl: Workload) -> None:
    """``r.extra["limits"][wl]``: what the machine allows a figure of each unit on this
    workload, from this run's measurements: ``batches/s`` (samples of 256: the fastest
    gather of 256 random rows into preallocated arrays, from private or shared memory,
    field by field or as whole rows; ``gather`` says which; where the repeats measured
    it beside their samples (:class:`RepeatGathers`), the median of theirs, ``gather``
    then "repeats") and ``rows/s`` (adds: memcpy bandwidth over the row's bytes), with
    the row's bytes."""
    rates = r.extra["gather batches/s"][wl.name]
    best = max(rates, key=lambda w: rates[w])
    batches, gather = rates[best], best
    if r.extra.get("limit repeats", {}).get(wl.name):
        batches, gather = statistics.median(r.extra["limit repeats"][wl.name]), "repeats"
    r.extra.setdefault("limits", {})[wl.name] = {
        "batches/s": batches, "gather": gather,
        "rows/s": r.extra["memcpy GB/s"] * 1e9 / wl.row_bytes, "row bytes": wl.row_bytes}


def _one_array(wl: Workload) -> Workload:
    """The workload's rows as one array of ``row_bytes`` bytes (shared memory, packed)."""
    return Workload(wl.name, wl.capacity, {"row": ((wl.row_bytes,), np.uint8)})


def _gatherer(wl: Workload, mem: Any, cap: int) -> Any:
    """A plain numpy gather of 256 random rows of every field laid out in ``mem`` (written
    first: its pages mapped), into preallocated arrays."""
    arrays, off = [], 0
    for shape, dtype in wl.fields.values():
        a = np.ndarray((cap,) + shape, dtype, mem, off)
        a.view(np.uint8)[...] = 1
        arrays.append(a)
        off += a.nbytes
    outs = [np.empty((BATCH,) + a.shape[1:], a.dtype) for a in arrays]
    rng = np.random.default_rng(0)

    def gather() -> None:
        idx = rng.integers(0, cap, BATCH)
        for a, o in zip(arrays, outs):
            np.take(a, idx, axis=0, out=o, mode="clip")
    return gather


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _contend(name: str, seconds: float, barrier: Any, results: Any) -> None:
    buf = shmbuf.Buffer.attach(name)
    lk = buf.engine.lock
    barrier.wait(60)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(64):
            lk.acquire(1.0)
            lk.release()
        n += 64
    results.put((n, time.perf_counter() - t0))
    buf.close()


def pieces(r: Results, cfg: Config) -> None:
    """What the lock and the torn-read check cost."""
    seconds = 0.3 if cfg.quick else 1.0
    with shmbuf.Buffer.create({"x": ((), np.int64)}, 64, name=f"bench-lock-{os.getpid()}") as buf:
        lk = buf.engine.lock
        def pair() -> None:
            lk.acquire(1.0)
            lk.release()
        r.extra["lock uncontended ns/pair"] = 1e9 / local_loop(pair, seconds)
        barrier, results = CTX.Barrier(3), CTX.Queue()
        procs = [CTX.Process(target=_contend, args=(buf.name, seconds, barrier, results)) for _ in range(2)]
        for p in procs:
            p.start()
        barrier.wait(60)
        got = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
        total = sum(n / t for n, t in got)
        r.extra["lock contended (2 processes) pairs/s"] = total
        r.extra["lock contended ns/pair"] = 1e9 * 2 / total
    for wl in (WORKLOADS[w] for w in cfg.workloads):
        r.extra.setdefault("torn-read check us/batch", {})[wl.name] = _check_cost(wl, seconds)


def _check_cost(wl: Workload, seconds: float) -> float:
    """Microseconds per batch that the torn-read check adds: the stamp reads before and
    after the copy and the comparisons, as shmbuf/core/gather.py does them."""
    # the check reads stamps only: a one-byte field with the workload's capacity will do
    with shmbuf.Buffer.create({"x": ((), np.int8)}, wl.capacity, name=f"bench-check-{os.getpid()}") as buf:
        step = min(4096, wl.capacity)
        block = {"x": np.zeros(step, np.int8)}
        for _ in range(wl.capacity // step + 1):
            buf.extend(block)
        stamps, rng, cap = buf.engine.ring.stamps, np.random.default_rng(0), wl.capacity

        def check() -> None:
            flat = rng.integers(0, cap, BATCH)
            expected = published(flat)
            before = stamps[flat]
            after = stamps[flat]
            ok = before == expected
            ok &= after == before
            ok.all()

        def draw() -> None:
            rng.integers(0, cap, BATCH)
        return 1e6 / local_loop(check, seconds) - 1e6 / local_loop(draw, seconds)


# -- memory: attaching processes do not copy --------------------------------------------

def _attached_memory(name: str, batches: int, results: Any) -> None:
    buf = shmbuf.Buffer.attach(name)
    out = buf.empty_batch(BATCH)
    for _ in range(batches):
        buf.sample(BATCH, out=out)
    info = psutil.Process().memory_full_info()
    results.put({"uss": info.uss, "pss": info.pss, "rss": info.rss})
    buf.close()


def attach_memory(r: Results, system: ShmbufSystem, batches: int) -> None:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_attached_memory, args=(system.buf.name, batches, results)) for _ in range(2)]
    for p in procs:
        p.start()
    got: list[Any] = []
    end = time.monotonic() + 300
    while len(got) < len(procs):
        try:
            got.append(results.get(timeout=0.5))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > end:  # (not 5 minutes of waiting on a process that died)
                for p in procs:
                    p.kill()
                    p.join(30)
                raise RuntimeError(f"the attached-memory processes did not report: exit codes "
                                   f"{[p.exitcode for p in procs]} after {300 - max(0.0, end - time.monotonic()):.0f} s "
                                   "(their tracebacks are on stderr above)") from None
    for p in procs:
        p.join(60)
    r.extra.setdefault("attached processes", {})[system.wl.name] = {
        "buffer bytes": system.bytes, "batches sampled each": batches, "per process": got}


# -- the whole run ----------------------------------------------------------------------

"""Running the benchmark: interleaved windows, writer processes, medians, JSON.

All systems of a workload are built and filled first; then every repeat runs one
window of each (metric, system) in turn, so the systems are measured side by side
and drift on this noisy machine hits them alike. Figures are medians over repeats,
with min and max.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time
from typing import Any

import numpy as np
import psutil

import shmbuf

from benchmarks.config import Config, Results, local_loop
from benchmarks.limits import (LIMIT_GATHERS, RepeatGathers, attach_memory, limit_rows, physical_limits, pieces,
                               record_limits)
from benchmarks.peers import (BATCH, WORKLOADS, CpprbSystem, NaiveSystem, NumpySystem, SB3System, ShmbufSystem,
                    System, TorchRLSystem, Workload, chunks)

CTX = mp.get_context("fork")  # writers inherit the systems (cpprb needs it); shmbuf's attach by name
E2E_CHUNK = 64


class Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled, self.t0 = total, 0, enabled, time.monotonic()

    def step(self, what: str) -> None:
        self.done += 1
        if self.enabled:
            sys.stderr.write(f"\r\033[K  [{self.done}/{self.total}] {time.monotonic() - self.t0:5.0f} s  {what}")
            sys.stderr.flush()

    def note(self, what: str) -> None:
        if self.enabled:
            sys.stderr.write(f"\r\033[K  [{self.done}/{self.total}] {time.monotonic() - self.t0:5.0f} s  {what}")
            sys.stderr.flush()

    def end(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


# -- writer processes ----------------------------------------------------------------

def _writer_main(system: System, seed: int, conn: Any) -> None:
    """A writer process, alive for the whole workload, as a real rollout worker is.
    Each window: get (chunk, seconds), warm up once (untimed: first calls, page
    mapping), say ready, wait for go, add for ``seconds``, report (rows, seconds)."""
    adders: dict[int, Any] = {}
    rows_needed = 4096 if system.wl.row_bytes < 4096 else 128
    data = system.wl.data(rows_needed, seed)
    while True:
        cmd = conn.recv()
        if cmd is None:
            return
        chunk, seconds = cmd
        if chunk not in adders:
            adders[chunk] = (system.writer(chunk), system.prepare(chunks(data, chunk), chunk))
            adders[chunk][0](adders[chunk][1][0])
        add, items = adders[chunk]
        conn.send("ready")
        conn.recv()  # go
        n, i, count = 0, 0, len(items)
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while True:
            add(items[i])
            n += chunk
            i += 1
            if i == count:
                i = 0
            if (i & 7) == 0 and time.perf_counter() >= deadline:
                break
        conn.send((n, time.perf_counter() - t0))


class WriterPool:
    """Two writer processes forked once per workload and system."""

    def __init__(self, system: System, size: int = 2) -> None:
        self.system = system
        self.conns, self.procs = [], []
        for i in range(size):
            mine, theirs = CTX.Pipe()
            p = CTX.Process(target=_writer_main, args=(system, 1000 + i, theirs), daemon=True)
            p.start()
            self.conns.append(mine)
            self.procs.append(p)

    def window(self, writers: int, chunk: int, seconds: float, learner: str) -> dict[str, float]:
        """Run ``writers`` of the pool for ``seconds``; the learner meanwhile idles
        ("idle"), drains a naive queue, or samples ("sample": the default call, a new
        batch each call, as a learner is written)."""
        system, conns = self.system, self.conns[:writers]
        naive = isinstance(system, NaiveSystem)
        for c in conns:
            c.send((chunk, seconds))
        for c in conns:
            self._recv(c)  # "ready"
        sample = system.sampler()
        for c in conns:
            c.send("go")
        batches = drained = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        if learner == "idle" and not naive:
            time.sleep(seconds)
        else:
            while time.perf_counter() < deadline:
                if naive:
                    drained += system.drain()  # type: ignore[attr-defined]
                if learner == "sample" and sample() is not None:  # (None: a rate limit held it)
                    batches += 1
        elapsed = time.perf_counter() - t0
        got = [self._recv(c) for c in conns]
        if naive:
            system.drain()  # type: ignore[attr-defined]  # leave the queue empty
        written = drained / elapsed if naive else sum(n / t for n, t in got)
        return {"rows/s": written, "batches/s": batches / elapsed}

    def _recv(self, conn: Any) -> Any:
        end = time.monotonic() + 300
        while not conn.poll(0.01):
            self.system.unblock()  # a writer may wait on the learner (a full queue, a rate limit)
            if time.monotonic() > end:
                raise RuntimeError(f"{self.system.name}: a writer process stopped answering")
        return conn.recv()

    def close(self) -> None:
        for c in self.conns:
            c.send(None)
        end = time.monotonic() + 30
        for p in self.procs:
            while p.is_alive() and time.monotonic() < end:
                self.system.unblock()  # (a process exits only once its queued chunks are read)
                p.join(0.05)
            if p.is_alive():
                p.kill()


PLAN = [("add", w, c, f"add {w}w x{c}") for w in (1, 2) for c in (1, 64)] + [
    ("sample", 0, 0, "sample"), ("sample out=", 0, 0, "sample out="),
    ("sample+w", 1, E2E_CHUNK, "sample +1w"), ("e2e", 2, E2E_CHUNK, "e2e")]
"""(kind, writers, chunk, label): what every repeat measures, in this order. "sample" is
the default call (a new batch each call, as users write it), "sample out=" the same into
one preallocated batch (systems whose API has it); the learners beside writers ("sample
+1w", "e2e") use the default call."""


def _cycle(fn: Any, items: list[Any]) -> Any:
    """A no-argument function calling ``fn`` on ``items`` in turn."""
    state = [0]

    def one() -> None:
        i = state[0]
        fn(items[i])
        state[0] = i + 1 if i + 1 < len(items) else 0
    return one


def _measure(r: Results, wl: Workload, s: System, pool: WriterPool | None, kind: str,
             writers: int, chunk: int, label: str, cfg: Config) -> None:
    """One window of one system; records its figures under ``label``-derived metrics."""
    if kind == "add" and chunk not in s.chunks:
        pass
    elif kind == "add" and not s.shared:  # in-process systems: one writer, no IPC
        if writers == 1:
            items = s.prepare(chunks(wl.data(4096 if wl.row_bytes < 4096 else 128, 7), chunk), chunk)
            rate = local_loop(_cycle(s.local_adder(chunk), items), cfg.window)
            r.add(wl.name, label, s.name, rate * chunk)
    elif kind == "add":
        r.add(wl.name, label, s.name, pool.window(writers, chunk, cfg.window, "idle")["rows/s"])
    elif kind in ("sample", "sample out="):
        fn = s.sampler() if kind == "sample" else s.sampler_out()
        if fn is not None and not isinstance(s, NaiveSystem):  # naive samples the numpy ring
            rate = local_loop(fn, cfg.window)
            r.add(wl.name, label, s.name, rate)
            r.add(wl.name, f"{label} GB/s", s.name, rate * BATCH * wl.row_bytes / 1e9)
    elif s.shared:  # a learner sampling while writers write
        res = pool.window(writers, chunk, cfg.e2e_window if kind == "e2e" else cfg.window, "sample")
        if kind == "e2e":
            r.add(wl.name, "e2e ingest", s.name, res["rows/s"])
            r.add(wl.name, "e2e batches", s.name, res["batches/s"])
        else:
            r.add(wl.name, "sample +1w", s.name, res["batches/s"])
            r.add(wl.name, "writer during sample", s.name, res["rows/s"])


def _build(wl: Workload, cfg: Config, prog: Progress, r: Results) -> tuple[list[System], dict[str, "WriterPool"]]:
    """Build and fill every system, and fork the writer pools.

    The pools are forked before the in-process numpy ring exists: children of a
    process with large private memory would make each of its writes copy a page
    (copy-on-write). naive's learner uses that same ring, given to it afterwards.
    """
    peers = list(cfg.peers)

    def need() -> int:  # (and the 1 GiB of rows the repeats' limit gathers read)
        buffers = sum(1 for p in peers if p != "naive") + ("naive" in peers and "numpy" not in peers)
        return buffers * wl.capacity * wl.row_bytes + limit_rows(wl) * wl.row_bytes
    avail = 0.85 * psutil.virtual_memory().available
    for opt in cfg.optional:
        if need() > avail and opt in peers:
            peers.remove(opt)
            r.extra.setdefault("skipped", {}).setdefault(wl.name, []).append(opt)
    if need() > avail:
        raise MemoryError(
            f"{wl.name}: the buffers of {', '.join(peers)} need {need() / 2**30:.1f} GiB and "
            f"{avail / 0.85 / 2**30:.1f} GiB are available; benchmark fewer peers at once "
            "(--peers) or free memory")
    built: dict[str, System] = {}
    me = psutil.Process()
    fill_rows = wl.data(1024 if wl.row_bytes < 4096 else 64, 3)

    def build(make: Any) -> System:
        """Construct and fill; record the memory that cost (PSS growth / capacity)."""
        before = me.memory_full_info().pss
        s = make()
        s.fill(fill_rows)
        r.extra.setdefault("bytes per transition", {}).setdefault(wl.name, {})[s.name] = \
            (me.memory_full_info().pss - before) / wl.capacity
        return s

    for name in peers:
        if name in ("numpy", "sb3"):
            continue  # private memory: built after the writer pools are forked
        prog.note(f"{wl.name}: building and filling {name}")
        if name in ("shmbuf", "shmbuf-py"):
            built[name] = build(lambda: ShmbufSystem(wl, pure=name == "shmbuf-py"))
        elif name == "cpprb":
            built[name] = build(lambda: CpprbSystem(wl, CTX))
        elif name == "naive":
            built[name] = NaiveSystem(wl, CTX)
        elif name == "torchrl":
            built[name] = build(lambda: TorchRLSystem(wl))
        else:
            raise ValueError(f"unknown peer {name!r}: expected shmbuf, shmbuf-py, cpprb, naive, numpy, torchrl or sb3")
    pools = {name: WriterPool(s) for name, s in built.items() if s.shared}
    ring = None
    if "numpy" in cfg.peers or "naive" in cfg.peers:
        prog.note(f"{wl.name}: building and filling the in-process numpy ring")
        floor = build(lambda: NumpySystem(wl))
        ring = floor.ring  # type: ignore[attr-defined]
        if "numpy" in cfg.peers:
            built["numpy"] = floor
    if "naive" in built:
        built["naive"].ring = ring  # type: ignore[attr-defined]
    if "sb3" in peers:  # in-process private memory too: after the fork
        prog.note(f"{wl.name}: building and filling sb3")
        built["sb3"] = build(lambda: SB3System(wl))
    return [built[p] for p in peers], pools


# -- physical limits and pieces ---------------------------------------------------------

def machine() -> dict[str, Any]:
    import platform

    return {"cpus": os.cpu_count(), "memory GiB": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "numpy": np.__version__, "platform": platform.platform(),
            "cpprb": _version("cpprb"), "torch": _version("torch"), "torchrl": _version("torchrl"),
            "stable-baselines3": _version("stable-baselines3"), "shmbuf": shmbuf.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def _version(pkg: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def run(cfg: Config) -> Results:
    from benchmarks import episodes
    from benchmarks import learner
    from benchmarks import strategies

    r = Results(config=cfg.__dict__.copy(), machine=machine())
    only = "only" in (cfg.episodes, cfg.strategies)
    workloads = cfg.workloads if not only else ()
    with_episodes = cfg.episodes == "only" or (cfg.episodes == "yes" and not only)
    with_strategies = cfg.strategies == "only" or (cfg.strategies == "yes" and not only)
    plan_len = (len(PLAN) - 1) * cfg.repeats * len(workloads) + min(cfg.e2e_repeats, cfg.repeats) * len(workloads)
    prog = Progress(plan_len + 2 + with_episodes + with_strategies, cfg.progress)
    prog.note("physical limits")
    if workloads:
        physical_limits(r, cfg)
        prog.step("lock and torn-read check")
        pieces(r, cfg)
    elif with_episodes or with_strategies:  # the limits their figures are set against
        physical_limits(r, cfg, wheres=LIMIT_GATHERS)
    if with_strategies and "mujoco" in cfg.workloads:
        physical_limits(r, cfg, [strategies.GOALS_WORKLOAD], wheres=LIMIT_GATHERS)
    prog.step("workloads")
    for wl in (WORKLOADS[w] for w in workloads):
        systems, pools = _build(wl, cfg, prog, r)
        limit = RepeatGathers(wl)  # (after the writer pools are forked: private memory)
        try:
            for rep in range(cfg.repeats):
                for kind, writers, chunk, label in PLAN:
                    if kind == "e2e" and rep >= cfg.e2e_repeats:
                        continue
                    prog.step(f"{wl.name} repeat {rep + 1}/{cfg.repeats}: {label}")
                    for s in systems:  # side by side, in the same minute
                        _measure(r, wl, s, pools.get(s.name), kind, writers, chunk, label, cfg)
                    if kind == "sample":
                        limit.measure(r, cfg.window)  # the limit beside the samples
            record_limits(r, wl)
            shm = next((s for s in systems if isinstance(s, ShmbufSystem)), None)
            if shm is not None:
                prog.note(f"{wl.name}: memory of attached processes")
                attach_memory(r, shm, 200 if cfg.quick else 2000)
        finally:
            limit.close()
            for pool in pools.values():
                pool.close()
            for s in systems:
                s.close()
            del systems
        if cfg.learner_first and "shmbuf" in cfg.peers:
            learner.measure(r, wl, cfg, prog.note)
    if with_episodes:
        episodes.run(r, cfg, local_loop, prog.note)
        prog.step("episodes")
    if with_strategies:
        strategies.run(r, cfg, local_loop, prog.note)
        prog.step("priorities and hindsight")
    prog.end()
    return r


def save(r: Results, folder: str = "results") -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump({"config": r.config, "machine": r.machine, "figures": r.figures, "extra": r.extra},
                  f, indent=1)
    return path

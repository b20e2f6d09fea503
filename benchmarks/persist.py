"""``scripts/bench-persist``: save and load throughput against a plain ``np.save`` /
``np.load`` of the same arrays (the floor), a writer's rate while saves run against
its rate without, and what the stats counters cost on ``add`` and ``sample``.

Every comparison is made in one run, the two sides interleaved round by round, and
reported as a ratio (the machine is shared and noisy; absolute figures drift).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
from typing import Any, Callable

import numpy as np

import shmbuf

from benchmarks.peers import WORKLOADS


def _fill(buf: shmbuf.Buffer, fields: dict[str, Any]) -> None:
    rng = np.random.default_rng(0)
    n = 4096
    chunk = {k: (rng.random((n,) + tuple(s)) * 100).astype(d) for k, (s, d) in fields.items()}
    for _ in range(buf.capacity // n):
        buf.extend(chunk)


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def throughput(workload: str, rows: int, rounds: int, where: str) -> dict[str, list[float]]:
    """GB/s of save, load, np.save and np.load of the same bytes, interleaved."""
    fields = WORKLOADS[workload].fields
    out: dict[str, list[float]] = {"save": [], "np.save": [], "load": [], "np.load": []}
    with shmbuf.Buffer.create(fields, rows) as buf:
        _fill(buf, fields)
        copies = {k: a.copy() for k, a in buf.engine.ring.arrays.items()}  # private arrays for numpy
        nbytes = sum(a.nbytes for a in copies.values()) + 8 * rows
        for i in range(rounds):
            d = tempfile.mkdtemp(dir=where)
            try:
                out["save"].append(nbytes / _timed(lambda: buf.save(os.path.join(d, "s"), progress=False)) / 1e9)

                def np_save() -> None:
                    os.mkdir(os.path.join(d, "n"))
                    for k, a in copies.items():
                        np.save(os.path.join(d, "n", k + ".npy"), a)
                    np.save(os.path.join(d, "n", "stamps.npy"), buf.engine.ring.stamps)
                    for f in os.listdir(os.path.join(d, "n")):  # as durable as save (fsync)
                        fd = os.open(os.path.join(d, "n", f), os.O_RDONLY)
                        os.fsync(fd)
                        os.close(fd)
                out["np.save"].append(nbytes / _timed(np_save) / 1e9)
                name = f"{buf.name}-l{i}"
                holder: list[Any] = []
                out["load"].append(nbytes / _timed(lambda: holder.append(
                    shmbuf.Buffer.load(os.path.join(d, "s"), name=name, progress=False))) / 1e9)
                holder[0].close()
                out["np.load"].append(nbytes / _timed(lambda: [np.load(os.path.join(d, "n", f))
                                                                for f in os.listdir(os.path.join(d, "n"))]) / 1e9)
            finally:
                shutil.rmtree(d)
    return out


def _writer(name: str, seconds: float, windows: Any, ready: Any) -> None:
    buf = shmbuf.Buffer.attach(name)
    rows = {k: np.zeros((64,) + tuple(s), d) for k, (s, d) in buf.fields.items()}
    ready.set()
    end = time.monotonic() + seconds
    marks = []
    while time.monotonic() < end:
        buf.extend(rows)
        marks.append(time.monotonic())
    buf.close()
    windows.put(marks)


def writer_rate(workload: str, rows: int, where: str, seconds: float) -> dict[str, float]:
    """A writer process's rows/s in alternating half-second windows with and without
    saves running in this process."""
    fields = WORKLOADS[workload].fields
    ctx = mp.get_context("spawn")
    spans: dict[str, list[tuple[float, float]]] = {"idle": [], "saving": []}
    with shmbuf.Buffer.create(fields, rows) as buf:
        _fill(buf, fields)
        q, ready = ctx.Queue(), ctx.Event()
        p = ctx.Process(target=_writer, args=(buf.name, seconds + 3.0, q, ready))
        p.start()
        ready.wait(60)
        time.sleep(0.5)
        end = time.monotonic() + seconds
        d = tempfile.mkdtemp(dir=where)
        try:
            i = 0
            while time.monotonic() < end:
                t0 = time.monotonic()
                if i % 2:
                    while time.monotonic() - t0 < 0.5:
                        buf.save(os.path.join(d, "s"), overwrite=True, progress=False)
                    spans["saving"].append((t0, time.monotonic()))
                else:
                    time.sleep(0.5)
                    spans["idle"].append((t0, time.monotonic()))
                i += 1
            marks = np.array(q.get(timeout=60))
            p.join(60)
        finally:
            shutil.rmtree(d)
    rate = {}
    for k, ss in spans.items():
        n = sum(int(((marks >= a) & (marks < b)).sum()) for a, b in ss)
        rate[k] = 64 * n / sum(b - a for a, b in ss)
    return rate


class _NoCounters:
    slot = np.zeros(8, np.int64)
    offset, present, index = -1, False, -1

    def sampled(self, n: int) -> None:
        pass

    def wrote(self, lane: int) -> None:  # (the pure-Python ring's write counts its lane's rows)
        pass

    def release(self) -> None:
        pass


def counter_cost(rounds: int) -> dict[str, list[float]]:
    """Microseconds of add (1 row) and sample (256 rows), mujoco, on one buffer whose
    counters are switched off (no slot in C, a no-op in Python) and on again, in random
    order round by round (one buffer: no difference of placement in memory)."""
    from shmbuf.core import native

    fields = WORKLOADS["mujoco"].fields
    out: dict[str, list[float]] = {f"{op} ({k})": [] for op in ("add", "sample") for k in ("on", "off")}
    with shmbuf.Buffer.create(fields, 100_000, seed=0) as b:
        _fill(b, fields)
        real = b.engine.counters

        def switch(on: bool) -> None:
            c = real if on else _NoCounters()
            b.engine.counters, b.engine.ring.counters, b.engine.lock.stats = c, c, real if on else None
            if b.engine.native is not None:
                native.configure(b.engine.native, b.engine.seg.fd, 0, b.timeout, c.offset,
                                 real.lanes_offset if on else -1)
        row = {k: np.zeros(tuple(s), d) for k, (s, d) in fields.items()}
        order = np.random.default_rng(0)
        try:
            for _ in range(rounds):
                for on in order.permutation(2).tolist():
                    switch(bool(on))
                    k = "on" if on else "off"
                    n = 20_000
                    out[f"add ({k})"].append(_timed(lambda: [b.add(row) for _ in range(n)]) / n * 1e6)
                    m = 2_000
                    out[f"sample ({k})"].append(_timed(lambda: [b.sample(256) for _ in range(m)]) / m * 1e6)
        finally:
            switch(True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench-persist", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller buffers, fewer rounds")
    ap.add_argument("--dir", default=None, help="where the saves go (default: the temp dir)")
    args = ap.parse_args(argv)
    where = args.dir or tempfile.gettempdir()
    rounds = 2 if args.quick else 5
    print(f"shmbuf {shmbuf.__version__}, {'native' if shmbuf.core.native.available() else 'pure-Python'} path, "
          f"saves to {where}\n")
    print("| workload | rows | MB | save GB/s | np.save GB/s | save / np.save | load GB/s | np.load GB/s | load / np.load |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for wl, rows in (("mujoco", 250_000 if args.quick else 1_000_000), ("atari", 2_000 if args.quick else 10_000)):
        t = throughput(wl, rows, rounds, where)
        med = {k: statistics.median(v) for k, v in t.items()}
        mb = rows * (sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in WORKLOADS[wl].fields.values()) + 8) / 1e6
        print(f"| {wl} | {rows:,} | {mb:,.0f} | {med['save']:.2f} | {med['np.save']:.2f} | "
              f"{med['save'] / med['np.save']:.2f} | {med['load']:.2f} | {med['np.load']:.2f} | "
              f"{med['load'] / med['np.load']:.2f} |")
    rate = writer_rate("mujoco", 250_000, where, 3.0 if args.quick else 8.0)
    print(f"\nA writer (mujoco, 64 rows a call) while saves of its 250k-row buffer run back to back: "
          f"{rate['saving'] / rate['idle']:.2f} of its rate without ({rate['saving']:,.0f} vs "
          f"{rate['idle']:,.0f} rows/s; 2 cores, so the save also takes CPU from it)")
    c = counter_cost(3 * rounds)
    med = {k: statistics.median(v) for k, v in c.items()}
    print(f"\nStats counters (mujoco, one buffer, counters on and off in random order, {3 * rounds} "
          "rounds; the quartiles of the per-round ratios show the noise):\n")
    print("| call | counters on | counters off | on / off (median) | per-round ratio, quartiles |")
    print("| --- | ---: | ---: | ---: | --- |")
    for op, label in (("add", "add (1 row)"), ("sample", "sample (256)")):
        on, off = med[f"{op} (on)"], med[f"{op} (off)"]
        r = np.array(c[f"{op} (on)"]) / np.array(c[f"{op} (off)"])
        q1, q3 = np.percentile(r, [25, 75])
        print(f"| {label} | {on:.2f} us | {off:.2f} us | {on / off:.3f} | {q1:.3f} to {q3:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

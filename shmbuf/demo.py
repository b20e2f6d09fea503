"""``shmbuf demo``: rollout workers write into one buffer while a learner samples it.

Each worker process steps its own vectorised CartPole with a random policy and
``extend``s one row per env per step into its own lane. The learner (this process)
samples batches the whole time and checks every sampled row: each row carries a
checksum of its other fields, so a torn row (fields from two different writes) shows.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from typing import Any

import numpy as np

from .buffer import Buffer
from .envs import CartPole

FIELDS = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32),
          "next_obs": ((4,), np.float32), "terminated": ((), np.bool_),
          "truncated": ((), np.bool_), "check": ((), np.float64)}


def checksum(b: dict[str, np.ndarray]) -> np.ndarray:
    """A number that changes if any field of a row comes from another row."""
    return (b["obs"].astype(np.float64).sum(-1) + 3 * b["next_obs"].astype(np.float64).sum(-1)
            + 7 * b["action"] + 11 * b["reward"].astype(np.float64) + 13 * b["terminated"]
            + 17 * b["truncated"])


def worker(buf: Buffer, lane: int, envs: int, seed: int, stop: Any) -> None:
    """Step ``envs`` CartPoles with a random policy; write every transition to ``lane``.

    Stops when told to, or when the buffer is gone (its creator closed it or died):
    a worker whose learner crashed does not write on forever."""
    env = CartPole(envs, seed=seed)
    rng = np.random.default_rng(seed)
    steps = 0
    while not stop.is_set() and (steps % 64 or not buf.unlinked):
        steps += 1
        obs, action = env.obs, rng.integers(0, 2, envs)
        next_obs, reward, terminated, truncated = env.step(action)
        row = {"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
               "terminated": terminated, "truncated": truncated}
        row["check"] = checksum(row)
        buf.extend(row, lane=lane)
    buf.close()


def run(workers: int = 2, envs: int = 16, seconds: float = 10.0, capacity: int = 100_000,
        batch: int = 256, quiet: bool = False) -> dict[str, float]:
    """Run the demo and return its figures (rows/s, batches/s, torn rows)."""
    capacity -= capacity % workers
    ctx = mp.get_context("spawn")  # workers inherit nothing: they attach by name
    name = f"demo-{os.getpid()}"
    with Buffer.create(FIELDS, capacity, name=name, lanes=workers, seed=0) as buf:
        stop = ctx.Event()
        procs = [ctx.Process(target=worker, args=(buf, i, envs, i, stop), daemon=True)
                 for i in range(workers)]
        for p in procs:
            p.start()
        out = buf.empty_batch(batch)
        batches = torn = 0
        t0 = time.monotonic()
        last = t0
        try:
            while (now := time.monotonic()) - t0 < seconds:
                if len(buf) < batch:
                    time.sleep(0.001)
                    continue
                buf.sample(batch, out=out)
                torn += int((checksum(out) != out["check"]).sum())
                batches += 1
                if not quiet and now - last >= 0.5:
                    last = now
                    _progress(now - t0, seconds, buf, batches, torn)
        finally:
            elapsed = time.monotonic() - t0
            stop.set()
            for p in procs:
                p.join(30)
        written = buf.total_added
    if not quiet:
        sys.stderr.write("\n")
    return {"workers": workers, "envs per worker": envs, "seconds": elapsed,
            "rows written": written, "rows written/s": written / elapsed,
            "batches sampled": batches, "batches/s": batches / elapsed,
            "rows checked": batches * batch, "torn rows": torn}


def _progress(t: float, seconds: float, buf: Buffer, batches: int, torn: int) -> None:
    written = buf.total_added
    sys.stderr.write(
        f"\r  {t:4.1f}/{seconds:g} s  written {written:>11,} ({written / t:>10,.0f}/s)  "
        f"buffer {len(buf):>9,}/{buf.capacity:,}  batches {batches:>8,} ({batches / t:>7,.0f}/s)"
        f"  torn {torn}")
    sys.stderr.flush()


def table(r: dict[str, float]) -> str:
    """The demo's figures as a markdown table."""
    rows = [("rollout workers x envs", f"{r['workers']} x {r['envs per worker']}"),
            ("duration", f"{r['seconds']:.1f} s"),
            ("rows written", f"{r['rows written']:,}"),
            ("rows written per second", f"{r['rows written/s']:,.0f}"),
            ("batches of 256 sampled", f"{r['batches sampled']:,}"),
            ("batches sampled per second", f"{r['batches/s']:,.0f}"),
            ("sampled rows checked", f"{r['rows checked']:,}"),
            ("torn rows detected", f"{r['torn rows']}")]
    w = max(len(a) for a, _ in rows)
    v = max(len(b) for _, b in rows)
    lines = [f"| {'metric'.ljust(w)} | {'value'.rjust(v)} |", f"|{'-' * (w + 2)}|{'-' * (v + 1)}:|"]
    lines += [f"| {a.ljust(w)} | {b.rjust(v)} |" for a, b in rows]
    return "\n".join(lines)

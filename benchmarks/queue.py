"""Unrolls from actor processes to a learner: shmbuf's queue mode against
``multiprocessing.Queue`` (every array pickled through a pipe) and, where torch is
installed, ``torch.multiprocessing.Queue`` (tensors moved to shared memory, handles
pickled), in the same run, on the same data.

An unroll is 20 steps of an (84, 84) uint8 frame plus action, reward and done: the
shape of IMPALA's and APPO's actor output. ``actors`` processes push unrolls as fast
as they can; the learner takes batches of ``batch`` unrolls and touches every byte (a
sum, standing in for the copy to a device). Reported: unrolls per second through the
learner (median, min-max and spread over the windows), that over the machine's limit
(memcpy bandwidth measured in the same run over an unroll's bytes), and the fraction of
the learner's time spent waiting for a batch. shmbuf's queue is measured with the call
users write (``q.take(16)``, a new batch each call) and with ``out=`` (``b = q.take(16,
out=b)``, the batch refilled in place).

    python -m benchmarks.queue                 # 3 windows of 3 s per system
    python -m benchmarks.queue --quick         # 1 window of 1.5 s
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from typing import Any

import numpy as np

import shmbuf

T, H, W = 20, 84, 84
FIELDS = {"obs": ((T, H, W), np.uint8), "action": ((T,), np.int64), "reward": ((T,), np.float32),
          "done": ((T,), np.bool_)}
CTX = mp.get_context("spawn")  # (torch's queue needs spawn or forkserver for shared tensors)


def unroll(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"obs": rng.integers(0, 255, (T, H, W), np.uint8), "action": rng.integers(0, 6, T),
            "reward": rng.random(T, np.float32), "done": np.zeros(T, bool)}


def _shmbuf_actor(name: str, stop: Any) -> None:
    q = shmbuf.Buffer.attach(name)
    u = unroll(np.random.default_rng(0))
    while not stop.is_set():
        try:
            q.add(u, timeout=0.2)
        except shmbuf.WriteTimeout:
            continue


def _mp_actor(q: Any, stop: Any, torch_tensors: bool) -> None:
    import queue as stdqueue
    u = unroll(np.random.default_rng(0))
    if torch_tensors:
        import torch
        u = {k: torch.from_numpy(v) for k, v in u.items()}
    while not stop.is_set():
        try:
            q.put(u if not torch_tensors else {k: v.clone() for k, v in u.items()}, timeout=0.2)
        except stdqueue.Full:
            continue


def _learn(take: Any, batch: int, seconds: float) -> tuple[float, float]:
    """Unrolls per second and the fraction of time spent waiting, over ``seconds``."""
    take()  # (warm up: the actors are running)
    got, waited, t0 = 0, 0.0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        w0 = time.perf_counter()
        b = take()
        waited += time.perf_counter() - w0
        got += int(b["obs"].shape[0])
        int(b["obs"].sum())  # the learner reads every byte
    elapsed = time.perf_counter() - t0
    return got / elapsed, waited / elapsed


def run_shmbuf(actors: int, batch: int, seconds: float, out: bool = False) -> tuple[float, float]:
    """``out``: each take refills the batch the one before returned (``out=``)."""
    with shmbuf.Buffer.create(FIELDS, 64 * actors, lanes=actors, mode="queue") as q:
        stop = CTX.Event()
        procs = [CTX.Process(target=_shmbuf_actor, args=(q.name, stop)) for _ in range(actors)]
        for p in procs:
            p.start()
        last: list[Any] = [None]

        def take_out() -> dict[str, np.ndarray]:
            last[0] = q.take(batch, timeout=60, out=last[0])
            return last[0]
        try:
            return _learn(take_out if out else lambda: q.take(batch, timeout=60), batch, seconds)
        finally:
            stop.set()
            for p in procs:
                p.join(30)


def run_mp(actors: int, batch: int, seconds: float, torch_tensors: bool) -> tuple[float, float]:
    ctx = CTX
    if torch_tensors:
        import torch.multiprocessing as tmp
        ctx = tmp.get_context("spawn")
    q, stop = ctx.Queue(64), ctx.Event()
    procs = [ctx.Process(target=_mp_actor, args=(q, stop, torch_tensors)) for _ in range(actors)]
    for p in procs:
        p.start()

    def take() -> dict[str, Any]:
        items = [q.get(timeout=60) for _ in range(batch)]
        if torch_tensors:
            import torch
            return {k: torch.stack([it[k] for it in items]).numpy() for k in items[0]}
        return {k: np.stack([it[k] for it in items]) for k in items[0]}

    try:
        return _learn(take, batch, seconds)
    finally:
        stop.set()
        try:
            while True:
                q.get(timeout=0.1)
        except Exception:
            pass
        for p in procs:
            p.join(30)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args(argv)
    windows, seconds = (2, 1.5) if args.quick else (3, 3.0)
    memcpy = _memcpy_gbs()
    systems = {"shmbuf queue": lambda: run_shmbuf(args.actors, args.batch, seconds),
               "shmbuf queue, take(out=)": lambda: run_shmbuf(args.actors, args.batch, seconds, out=True),
               "multiprocessing.Queue": lambda: run_mp(args.actors, args.batch, seconds, False)}
    try:
        import torch  # noqa: F401
        systems["torch.multiprocessing.Queue"] = lambda: run_mp(args.actors, args.batch, seconds, True)
    except ImportError:
        pass
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in systems}
    for _ in range(windows):  # interleaved: drift hits every system alike
        for k, fn in systems.items():
            got[k].append(fn())
    print(markdown(got, args.actors, args.batch, memcpy))


def unroll_bytes() -> int:
    return sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in FIELDS.values())


def _memcpy_gbs() -> float:
    """The machine's memcpy bandwidth now (numpy copy of 256 MiB, best of 5), GB/s."""
    src = np.ones(256 << 20, np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return src.nbytes / best / 1e9


def markdown(got: dict[str, list[tuple[float, float]]], actors: int, batch: int, memcpy: float) -> str:
    """The table of :func:`main`: ``got[system]`` = [(unrolls/s, fraction waiting)] per window."""
    from benchmarks.report import SPREAD_MARK, marked, pct, spread

    limit = memcpy * 1e9 / unroll_bytes()
    base = float(np.median([r for r, _ in got["shmbuf queue"]]))
    lines = [f"{actors} actors -> 1 learner, unrolls of {T} x ({H}, {W}) uint8 ({unroll_bytes():,} bytes), "
             f"batches of {batch}; limit: memcpy {memcpy:.1f} GB/s over an unroll's bytes = {limit:,.0f} "
             f"unrolls/s, measured in this run\n",
             "| system | unrolls/s: median (min-max, spread) | / limit | learner waiting | shmbuf queue / system |",
             "|---|---|---|---|---|"]
    wide = []
    for k, rs in got.items():
        rates = [r for r, _ in rs]
        rate, wait = float(np.median(rates)), float(np.median([w for _, w in rs]))
        sp = spread(rates)
        if sp is not None and sp > SPREAD_MARK:
            wide.append(f"{k} {pct(sp)}")
        lines.append(f"| {k} | {rate:,.0f} ({min(rates):,.0f}-{max(rates):,.0f}, {marked(sp)}) | {rate / limit:.3f} | "
                     f"{100 * wait:.0f}% | {base / rate:.2f}x |")
    lines.append(f"\nSpread: (max - min) / median over the windows, in bold past {SPREAD_MARK:g}%"
                 + (f": {', '.join(wide)}." if wide else ": none passes it."))
    return "\n".join(lines)


if __name__ == "__main__":
    main()

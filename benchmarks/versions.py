"""Samples of recent policies: ``sample(256, max_staleness=k)`` against ``sample(256)`` on
the same buffer (1M rows over 8 lanes, one writer a lane, 64 policy versions), on this
process's path, and, where TorchRL is installed, its ``StalenessAwareSampler`` on the same
rows (uniform weights, the same cutoff; a ``LazyTensorStorage`` in this process).
Reported: microseconds per call (the best of 5 windows) and the ratios.

    python -m benchmarks.versions              # 5 windows of 400 calls
    python -m benchmarks.versions --quick      # 5 windows of 60 calls
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np

import shmbuf

FIELDS = {"obs": ((17,), np.float32), "action": ((6,), np.float32), "reward": ((), np.float32)}
LANES, VERSIONS, CHUNK = 8, 64, 2048  # 8 lanes x 64 versions x 2048 rows = 1M rows
PATH = ""  # the path shmbuf ran on


def best_us(call: Callable[[], Any], calls: int) -> float:
    call()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def rows() -> dict[str, np.ndarray]:
    return {k: np.zeros((CHUNK,) + s, d) for k, (s, d) in FIELDS.items()}


def shmbuf_figures(k: int, calls: int) -> dict[str, float]:
    buf = shmbuf.Buffer.create(FIELDS, LANES * VERSIONS * CHUNK, lanes=LANES, versions=True, seed=0)
    global PATH
    PATH = "native" if buf.native else "pure-Python"
    try:
        data = rows()
        for lane in range(LANES):
            with shmbuf.Buffer.attach(buf.name) as writer:
                for v in range(VERSIONS):
                    writer.extend(data, version=v, lane=lane)
        return {"sample(256)": best_us(lambda: buf.sample(256), calls),
                f"sample(256, max_staleness={k})": best_us(lambda: buf.sample(256, max_staleness=k), calls)}
    finally:
        buf.close()


def torchrl_figures(k: int, calls: int) -> dict[str, float] | None:
    try:
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        from torchrl.data.replay_buffers.samplers import StalenessAwareSampler
    except ImportError:
        return None
    n = LANES * VERSIONS * CHUNK
    sampler = StalenessAwareSampler(max_staleness=k, staleness_weight_fn=lambda s: torch.ones_like(s, dtype=torch.float))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(n), sampler=sampler, batch_size=256)
    for v in range(VERSIONS):
        td = TensorDict({key: torch.zeros((LANES * CHUNK,) + s, dtype=getattr(torch, np.dtype(d).name))
                         for key, (s, d) in FIELDS.items()}, batch_size=[LANES * CHUNK])
        td["policy_version"] = torch.full((LANES * CHUNK,), v, dtype=torch.int64)
        rb.extend(td)
    sampler.consumer_version = VERSIONS - 1
    return {f"TorchRL StalenessAwareSampler(max_staleness={k})": best_us(lambda: rb.sample(), calls)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.versions", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--staleness", type=int, default=4)
    args = p.parse_args(argv)
    calls = 60 if args.quick else 400
    figures = shmbuf_figures(args.staleness, calls)
    peer = torchrl_figures(args.staleness, calls)
    base = figures["sample(256)"]
    print(f"| call (1M rows, 8 lanes, {PATH} path) "
          "| us per call | sample(256) / it |")
    print("| --- | ---: | ---: |")
    for what, us in {**figures, **(peer or {})}.items():
        print(f"| {what} | {us:.1f} | {base / us:.2f}x |")
    if peer is None:
        print("(TorchRL not installed here: its StalenessAwareSampler was left out)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

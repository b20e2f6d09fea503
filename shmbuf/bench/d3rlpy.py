"""The d3rlpy facade against d3rlpy's own ReplayBuffer, on the same episodes in one run:
transition batches (256) and trajectory batches (64 x 20) per second, medians of 3
rounds, and the ratios. Needs d3rlpy (scripts/bench-d3rlpy runs it in .venv-d3rlpy)."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any, Callable

import numpy as np


def rate(f: Callable[[], Any], seconds: float) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        f()
        n += 1
    return n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="0.5 s windows instead of 2 s")
    args = parser.parse_args()
    import d3rlpy
    import structlog

    from shmbuf.compat import d3rlpy as facade

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    rng = np.random.default_rng(0)
    episodes = [d3rlpy.dataset.Episode(rng.random((200, 17)).astype(np.float32),
                                       rng.random((200, 6)).astype(np.float32),
                                       rng.random((200, 1)).astype(np.float32), bool(e % 2)) for e in range(100)]
    theirs = d3rlpy.dataset.ReplayBuffer(d3rlpy.dataset.FIFOBuffer(100_000), episodes=episodes)
    ours = facade.ReplayBuffer(facade.FIFOBuffer(100_000), episodes=episodes, seed=0)
    assert theirs.transition_count == ours.transition_count
    seconds = 0.5 if args.quick else 2.0
    got: dict[str, list[float]] = {}
    try:
        for _ in range(3):
            for who, buf in (("d3rlpy", theirs), ("shmbuf", ours)):
                got.setdefault((who, "transitions"), []).append(
                    rate(lambda: buf.sample_transition_batch(256), seconds))
                got.setdefault((who, "trajectories"), []).append(
                    rate(lambda: buf.sample_trajectory_batch(64, 20), seconds))
    finally:
        ours.close()
    med = {k: float(np.median(v)) for k, v in got.items()}
    print(f"d3rlpy {d3rlpy.__version__}: 100 episodes of 200 steps (obs (17,), action (6,)), "
          f"medians of 3 rounds of {seconds:g} s\n")
    print("| batches/s | d3rlpy ReplayBuffer | shmbuf.compat.d3rlpy | shmbuf / d3rlpy |\n|---|---:|---:|---:|")
    for what, label in (("transitions", "sample_transition_batch(256)"),
                        ("trajectories", "sample_trajectory_batch(64, 20)")):
        a, b = med[("d3rlpy", what)], med[("shmbuf", what)]
        print(f"| {label} | {a:.0f} | {b:.0f} | {b / a:.1f}x |")


if __name__ == "__main__":
    main()

"""The d3rlpy facade against d3rlpy's own ReplayBuffer, on the same episodes in one run:
transition batches (256) and trajectory batches (64 x 20) per second, medians of 3
rounds, and the ratios; then the wall time of ``DQN.fit_online`` on CartPole (the same
seeds and steps) and of ``DQN.fit`` on the buffer it filled, with each buffer. Needs
d3rlpy (scripts/bench-d3rlpy runs it in .venv-d3rlpy)."""

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

    from shmbuf.compat.d3rlpy import replay as facade

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
    fit_report(d3rlpy, facade, 1000 if args.quick else 5000)


def fit_times(d3rlpy: Any, facade: Any, steps: int) -> dict[str, float]:
    """Seconds of ``fit_online`` (``steps`` env steps) then ``fit`` (``steps // 2``
    updates) of a DQN, with d3rlpy's FIFO buffer and with the facade's."""
    import gymnasium as gym

    out = {}
    for who in ("d3rlpy", "shmbuf"):
        d3rlpy.seed(0)
        env = gym.make("CartPole-v1")
        if who == "d3rlpy":
            buf = d3rlpy.dataset.create_fifo_replay_buffer(limit=10_000, env=env)
        else:
            buf = facade.ReplayBuffer(facade.FIFOBuffer(10_000), env=env, seed=0)
        dqn = d3rlpy.algos.DQNConfig(batch_size=32).create(device="cpu:0")
        noop = d3rlpy.logging.NoopAdapterFactory()
        t0 = time.perf_counter()
        dqn.fit_online(env, buffer=buf, explorer=d3rlpy.algos.ConstantEpsilonGreedy(0.3), n_steps=steps,
                       n_steps_per_epoch=steps, update_start_step=100, show_progress=False, logger_adapter=noop)
        out[who, "fit_online"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        dqn.fit(buf, n_steps=steps // 2, n_steps_per_epoch=steps // 2, show_progress=False, logger_adapter=noop)
        out[who, "fit"] = time.perf_counter() - t0
        if who == "shmbuf":
            buf.close()
    return out


def fit_report(d3rlpy: Any, facade: Any, steps: int) -> None:
    import os
    import tempfile

    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as d:  # (d3rlpy writes logs under the working directory)
        os.chdir(d)
        try:
            times = [fit_times(d3rlpy, facade, steps) for _ in range(3)]
        finally:
            os.chdir(cwd)
    print(f"\nDQN on CartPole-v1, {steps} env steps of fit_online then {steps // 2} updates of fit, "
          "medians of 3 runs\n")
    print("| wall time (s) | d3rlpy ReplayBuffer | shmbuf.compat.d3rlpy | shmbuf / d3rlpy |\n|---|---:|---:|---:|")
    for what in ("fit_online", "fit"):
        a = float(np.median([t["d3rlpy", what] for t in times]))
        b = float(np.median([t["shmbuf", what] for t in times]))
        print(f"| {what} | {a:.2f} | {b:.2f} | {b / a:.2f} |")


if __name__ == "__main__":
    main()

"""SB3's buffer and shmbuf's facade call by call (``scripts/bench-clients --calls``):
microseconds per ``add`` and per ``sample`` with the spaces and ``n_envs`` of SB3's DQN
(CartPole), SAC and TD3 (a mujoco-like Box(17) / Box(6)), float64 rewards as gymnasium
gives them, ``handle_timeout_termination`` as SB3's default (True) and as CleanRL passes
it (False). Both buffers in this process, measured in turn, five repeats; medians."""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

CASES = [("DQN CartPole", (4,), None, 1), ("DQN CartPole, 4 envs", (4,), None, 4),
         ("SAC/TD3 mujoco-like", (17,), (6,), 1)]


def _spaces(obs: tuple, act: Any) -> tuple[Any, Any]:
    from gymnasium import spaces

    a = spaces.Discrete(2) if act is None else spaces.Box(-1, 1, act, np.float32)
    return spaces.Box(-1, 1, obs, np.float32), a


def _per_call(fn: Any, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def measure(repeats: int = 5, calls: int = 20_000) -> list[dict[str, Any]]:
    from stable_baselines3.common.buffers import ReplayBuffer as SB3

    from shmbuf.compat.sb3 import ReplayBuffer as Facade

    rows = []
    for label, obs_shape, act_shape, n_envs in CASES:
        for ht in (True, False):
            obs_space, act_space = _spaces(obs_shape, act_shape)
            bufs = {"sb3": SB3(100_000, obs_space, act_space, "cpu", n_envs=n_envs, handle_timeout_termination=ht),
                    "shmbuf": Facade(100_000, obs_space, act_space, "cpu", n_envs=n_envs,
                                     handle_timeout_termination=ht)}
            rng = np.random.default_rng(0)
            obs = rng.random((n_envs, *obs_shape)).astype(np.float32)
            act = np.array([act_space.sample() for _ in range(n_envs)])
            rew, done, infos = rng.random(n_envs), np.zeros(n_envs, bool), [{} for _ in range(n_envs)]
            got: dict[str, dict[str, list[float]]] = {k: {"add": [], "sample": []} for k in bufs}
            for b in bufs.values():
                for _ in range(1_000):
                    b.add(obs, obs, act, rew, done, infos)
            for _ in range(repeats):
                for k, b in bufs.items():
                    got[k]["add"].append(_per_call(lambda: b.add(obs, obs, act, rew, done, infos), calls))
                    got[k]["sample"].append(_per_call(lambda: b.sample(256), calls // 20))
            bufs["shmbuf"].close()
            med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in got.items()}
            rows.append({"case": label, "handle_timeout_termination": ht, **{
                f"{k} {m} us": med[k][m] for k in med for m in ("add", "sample")}})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| case | handle_timeout_termination | add: SB3 us | add: shmbuf us | shmbuf / SB3 "
             "| sample(256): SB3 us | sample(256): shmbuf us | shmbuf / SB3 |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['handle_timeout_termination']} | {r['sb3 add us']:.2f} | "
                     f"{r['shmbuf add us']:.2f} | {r['shmbuf add us'] / r['sb3 add us']:.2f} | "
                     f"{r['sb3 sample us']:.1f} | {r['shmbuf sample us']:.1f} | "
                     f"{r['shmbuf sample us'] / r['sb3 sample us']:.2f} |")
    return "\n".join(lines)

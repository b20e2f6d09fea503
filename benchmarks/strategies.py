"""``shmbuf bench``'s part on sampling strategies: prioritized replay beside cpprb's
``MPPrioritizedReplayBuffer`` and ``PrioritizedReplayBuffer`` (mujoco workload, a = 0.6,
b = 0.4), hindsight relabelling beside the plain one-step sample of the same episode
buffer, and what each costs over shmbuf's uniform sampling (its default call and, as
``shmbuf uniform out=``, its ``out=`` form; prioritized sampling has no ``out=``). Every figure is a loop in
this process, the systems interleaved window by window (ratios hold on a noisy machine).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
from typing import Any, Callable

import numpy as np

import shmbuf

from benchmarks.peers import BATCH, WORKLOADS, Workload

CHUNK = 64
GOALS = {"observation": ((10,), np.float32), "achieved_goal": ((3,), np.float32),
         "desired_goal": ((3,), np.float32), "action": ((4,), np.float32), "reward": ((), np.float32)}
EPISODE = 50  # steps, as FetchReach's
HER_CAPACITY = 200_000
GOALS_WORKLOAD = Workload("goals", HER_CAPACITY, {
    **GOALS, **{f"next_{o}": GOALS[o] for o in ("observation", "achieved_goal", "desired_goal")},
    "terminated": ((), np.bool_), "truncated": ((), np.bool_)})
"""What one transition of the hindsight part's sample holds: the rows of its limit."""
LIMITS = {"sample 256 + update 256": "mujoco", "sample 256": "mujoco",
          "add 64 rows with priorities (rows/s)": "mujoco", "episode sample 256 (goals)": "goals"}
"""The workload whose limits each metric is set against (``r.extra["limits"]``)."""


def reward_fn(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    """gymnasium-robotics' sparse reward: 0 within 5 cm of the goal, else -1."""
    return -(np.linalg.norm(achieved - desired, axis=-1) > 0.05).astype(np.float32)


def run(r: Any, cfg: Any, loop: Callable[[Callable[[], Any], float], float], progress: Any) -> None:
    """Fill ``r.extra["strategies"]``: {metric: {system: [values]}}."""
    if "mujoco" not in cfg.workloads:
        return
    figures: dict[str, dict[str, list[float]]] = {}
    r.extra["strategies"] = figures

    def add(metric: str, system: str, value: float) -> None:
        figures.setdefault(metric, {}).setdefault(system, []).append(value)

    tag = f"bench-st-{os.getpid()}"
    progress("strategies: filling the prioritized buffers")
    _priorities(cfg, tag, loop, add, progress)
    progress("strategies: filling the goal episodes")
    _her(cfg, tag, loop, add, progress)


def _priorities(cfg: Any, tag: str, loop: Any, add: Any, progress: Any) -> None:
    wl = WORKLOADS["mujoco"]
    cap = wl.capacity if not cfg.quick else wl.capacity // 5
    data = wl.data(min(4096, cap), 1)
    chunk = {k: v[:CHUNK] for k, v in data.items()}
    rng = np.random.default_rng(0)
    td, pri = rng.random(BATCH) + 0.01, rng.random(CHUNK) + 0.1
    pb = shmbuf.Buffer.create(wl.fields, cap, priority=0.6, seed=0, name=f"{tag}-p")
    ub = shmbuf.Buffer.create(wl.fields, cap, seed=0, name=f"{tag}-u")
    peers: dict[str, Any] = {}
    try:
        try:
            from cpprb import MPPrioritizedReplayBuffer, PrioritizedReplayBuffer

            env = {k: {"shape": s if s else 1, "dtype": d} for k, (s, d) in wl.fields.items()}
            peers["cpprb MP"] = MPPrioritizedReplayBuffer(cap, env, alpha=0.6, ctx=mp.get_context("spawn"))
            peers["cpprb local"] = PrioritizedReplayBuffer(cap, env, alpha=0.6)
        except ImportError:
            pass
        for _ in range(cap // len(data["obs"]) + 1):
            pb.extend(data)
            ub.extend(data)
            for p in peers.values():
                p.add(**data)
        pb.sample(1)  # the first sample syncs the trees with every row (once)
        uout = ub.empty_batch(BATCH)  # (prioritized sampling has no out=: uniform only)
        pb.prefault()
        ub.prefault()

        def shm_su() -> None:
            b = pb.sample(BATCH, beta=0.4)
            pb.update_priorities(b["index"], td)

        def peer_su(p: Any) -> Callable[[], None]:
            def su() -> None:
                b = p.sample(BATCH, beta=0.4)
                p.update_priorities(b["indexes"], td)
            return su

        pairs: list[tuple[str, str, Callable[[], Any]]] = [
            ("sample 256 + update 256", "shmbuf", shm_su),
            *[("sample 256 + update 256", name, peer_su(p)) for name, p in peers.items()],
            ("sample 256", "shmbuf uniform", lambda: ub.sample(BATCH)),
            ("sample 256", "shmbuf uniform out=", lambda: ub.sample(BATCH, out=uout)),
            ("sample 256", "shmbuf", lambda: pb.sample(BATCH, beta=0.4)),
            ("add 64 rows with priorities (rows/s)", "shmbuf", lambda: pb.extend(chunk, priority=pri)),
            ("add 64 rows with priorities (rows/s)", "shmbuf uniform", lambda: ub.extend(chunk))]
        if "cpprb MP" in peers:
            mpb = peers["cpprb MP"]
            pairs.append(("add 64 rows with priorities (rows/s)", "cpprb MP",
                          lambda: mpb.add(**chunk, priorities=pri)))
        for rep in range(cfg.repeats):
            progress(f"strategies: priorities, repeat {rep + 1}/{cfg.repeats}")
            for metric, system, fn in pairs:
                rate = loop(fn, cfg.window)
                add(metric, system, rate * CHUNK if "rows/s" in metric else rate)
    finally:
        pb.close()
        ub.close()
        peers.clear()


def _her(cfg: Any, tag: str, loop: Any, add: Any, progress: Any) -> None:
    lanes = 8
    cap = (HER_CAPACITY if not cfg.quick else HER_CAPACITY // 5) // lanes * lanes
    buf = shmbuf.EpisodeBuffer.create(GOALS, cap, lanes=lanes, seed=0, name=f"{tag}-her",
                                      observations=["observation", "achieved_goal", "desired_goal"])
    try:
        rng = np.random.default_rng(0)
        steps = {k: rng.random((EPISODE,) + s).astype(d) for k, (s, d) in GOALS.items()}
        for o in ("observation", "achieved_goal", "desired_goal"):
            steps["next_" + o] = rng.random(GOALS[o][0]).astype(np.float32)
        with buf.writer(envs=lanes) as w:
            for _ in range(cap // lanes // (EPISODE + 1) + 1):
                for env in range(lanes):
                    w.add_episode(steps, terminated=False, env=env)
        her = shmbuf.EpisodeBuffer.attach(buf.name, seed=1, her=shmbuf.HER("future", 0.8, reward_fn=reward_fn))
        buf.core.prefault()  # both handles' pages mapped before timing (the other parts do the same)
        her.core.prefault()
        try:
            for rep in range(cfg.repeats):
                progress(f"strategies: hindsight, repeat {rep + 1}/{cfg.repeats}")
                add("episode sample 256 (goals)", "plain", loop(lambda: buf.sample(BATCH), cfg.window))
                add("episode sample 256 (goals)", "HER future 0.8", loop(lambda: her.sample(BATCH), cfg.window))
        finally:
            her.close()
    finally:
        buf.close()


def ratios(figures: dict[str, dict[str, list[float]]]) -> list[tuple[str, float | None, float | None]]:
    """(what, ratio, target or None) of each comparison."""
    def med(metric: str, system: str) -> float | None:
        v = figures.get(metric, {}).get(system)
        return statistics.median(v) if v else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    su, add = "sample 256 + update 256", "add 64 rows with priorities (rows/s)"
    return [
        ("prioritized sample + update: shmbuf / cpprb MP", ratio(med(su, "shmbuf"), med(su, "cpprb MP")), 1.5),
        ("prioritized sample + update: shmbuf / cpprb local (one process)",
         ratio(med(su, "shmbuf"), med(su, "cpprb local")), None),
        ("add 64 rows with priorities: shmbuf / cpprb MP", ratio(med(add, "shmbuf"), med(add, "cpprb MP")), 1.5),
        ("prioritized / uniform sample (shmbuf)",
         ratio(med("sample 256", "shmbuf"), med("sample 256", "shmbuf uniform")), None),
        ("add 64 rows: prioritized / uniform buffer (shmbuf)",
         ratio(med(add, "shmbuf"), med(add, "shmbuf uniform")), None),
        ("HER future 0.8 / plain one-step sample", ratio(med("episode sample 256 (goals)", "HER future 0.8"),
                                                          med("episode sample 256 (goals)", "plain")), 0.5),
    ]

"""Goal-conditioned episodes for HER.

Code that runs in child processes lives here, importable by name (spawn, forkserver
and Ray workers import it).
"""

from __future__ import annotations

import time

import numpy as np

import shmbuf

from .processes import hang_at

# Goal episodes (HER): observation t of episode ep achieves goal (ep, t); every desired
# goal stored is (-1, -1), so a relabelled one shows, and says where it came from.
GOALS = {"obs": ((1,), "int64"), "achieved_goal": ((2,), "int64"), "desired_goal": ((2,), "int64"),
         "reward": ((), "float64")}


GOAL_OBS = ["obs", "achieved_goal", "desired_goal"]


def goal_step(ep: int, t: int) -> dict[str, np.ndarray]:
    return {"obs": np.array([t]), "achieved_goal": np.array([ep, t]), "desired_goal": np.array([-1, -1]),
            "reward": -1.0}


def goal_episode(ep: int, steps: int) -> dict[str, np.ndarray]:
    """An episode of ``steps`` steps (observations 0 .. steps, the last one final)."""
    t = np.arange(steps + 1)
    achieved = np.stack([np.full(steps + 1, ep), t], axis=1)
    return {"obs": t[:steps, None], "achieved_goal": achieved[:steps],
            "desired_goal": np.full((steps, 2), -1), "reward": np.full(steps, -1.0),
            "next_obs": [steps], "next_achieved_goal": achieved[steps], "next_desired_goal": [-1, -1]}


def goal_reward(achieved: np.ndarray, desired: np.ndarray, info) -> np.ndarray:
    """A reward that says which goals it was computed from."""
    return (1000 * desired[:, 1] + achieved[:, 1]).astype(np.float64)


def goal_writer(name: str, seconds: float, ready, stop, results) -> None:
    """Write goal episodes step by step (lengths 1 .. 12) for ``seconds`` or until
    ``stop``; report how many episodes."""
    buf = shmbuf.EpisodeBuffer.attach(name)
    w = buf.writer()
    ready.wait(30)
    ep, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline and not stop.is_set():
        steps = 1 + (ep * 7) % 12
        for t in range(steps):
            end = t == steps - 1
            step = goal_step(ep, t)
            if end:
                step.update(next_obs=[steps], next_achieved_goal=[ep, steps], next_desired_goal=[-1, -1])
            w.add(step, terminated=end, truncated=False)
        ep += 1
    buf.close()
    results.put(ep)


def goal_writer_hang_in_write(name: str, flag: str, steps: int) -> None:
    """Write ``steps`` steps of goal episode 7 (in progress), then stop forever in the
    middle of writing the next one, touching ``flag`` there."""
    buf = shmbuf.EpisodeBuffer.attach(name)
    w = buf.writer()
    for t in range(steps):
        w.add(goal_step(7, t), terminated=False, truncated=False)
    hang_at("writing", flag)
    w.add(goal_step(7, steps), terminated=False, truncated=False)

__all__ = ['GOALS', 'GOAL_OBS', 'goal_episode', 'goal_reward', 'goal_step', 'goal_writer', 'goal_writer_hang_in_write']

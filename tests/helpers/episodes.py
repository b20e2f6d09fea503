"""Episodes: rows derived from (writer, env, episode, step), their storm, hangs inside writes.

Code that runs in child processes lives here, importable by name (spawn, forkserver
and Ray workers import it).
"""

from __future__ import annotations

import time

import numpy as np

import shmbuf

from .processes import hang_at

def episode_writer_then_hang(name: str, flag: str, steps: int) -> None:
    """Attach to episode buffer ``name``, write a complete episode (obs 100, 101, final
    102), then ``steps`` steps of one in progress (obs t, reward t), create ``flag``,
    then sleep until killed."""
    buf = shmbuf.EpisodeBuffer.attach(name)
    w = buf.writer()
    w.add_episode({"obs": [[100, 100], [101, 101]], "reward": [1, 1], "next_obs": [102, 102]})
    for t in range(steps):
        w.add({"obs": [t, t], "reward": float(t)}, terminated=False, truncated=False)
    open(flag, "w").close()
    time.sleep(600)


# Simple episodes: observation (start + t) twice, action t, the rewards given.
EPISODE_FIELDS = {"obs": ((2,), "float32"), "action": ((), "int64"), "reward": ((), "float32")}


def simple_episode(start: int, rewards) -> dict:
    t = np.arange(len(rewards))
    return {"obs": (start + t)[:, None] * np.ones(2), "action": t, "reward": rewards,
            "next_obs": [start + len(rewards)] * 2}


# Episode storm: every value is derived from (writer, env, episode, step).
EPISODE_STORM = {"obs": ((3,), "int64"), "action": ((), "int64"), "reward": ((), "float64")}


def episode_key(writer, env, episode, step):
    return ((writer * 16 + env) * 1_000_000 + episode) * 1_000 + step


def episode_plan(writer: int, env: int, episode: int) -> tuple[int, bool]:
    """(steps, terminated) of an episode: random-looking, known to every process."""
    h = (writer * 7919 + env * 104729 + episode * 1299709) % 1_000_003
    return 1 + h % 23, bool(h // 23 % 2)


def episode_step(writer, env, episode, step) -> dict[str, np.ndarray]:
    key = episode_key(writer, env, episode, step)
    return {"obs": np.array([key, key + 1, key + 2]), "action": key * 3, "reward": float(step + 1)}


def episode_storm_writer(name: str, writer: int, envs: int, seconds: float, ready, stop, results,
                         finished=None, die_after: int = 0, flag: str = "") -> None:
    """Write episodes of ``envs`` envs through one vectorised writer until ``stop`` or
    ``seconds``; report how many steps. ``finished[writer * 16 + env]``: the episodes of
    that env ended so far, raised once the write that ended one has returned. With
    ``die_after``: after that many writes, stop forever inside the next one (at the
    "writing" point, touching ``flag``), to be killed there."""
    buf = shmbuf.EpisodeBuffer.attach(name, timeout=60)
    episode, step = np.zeros(envs, np.int64), np.zeros(envs, np.int64)
    written = 0
    with buf.writer(envs=envs) as w:
        if ready is not None:
            ready.wait(30)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            rows = [episode_step(writer, e, episode[e], step[e]) for e in range(envs)]
            plans = [episode_plan(writer, e, episode[e]) for e in range(envs)]
            ended = np.array([step[e] + 1 == plans[e][0] for e in range(envs)])
            term = ended & np.array([p[1] for p in plans])
            data = {k: np.stack([np.asarray(r[k]) for r in rows]) for k in EPISODE_STORM}
            data["next_obs"] = np.stack([episode_step(writer, e, episode[e], step[e] + 1)["obs"]
                                         for e in range(envs)])
            if die_after and written == die_after * envs:
                hang_at("writing", flag)
            w.add(data, terminated=term, truncated=ended & ~term)
            written += envs
            step += 1
            episode[ended] += 1
            step[ended] = 0
            if finished is not None:
                for e in np.flatnonzero(ended).tolist():
                    finished[writer * 16 + e] = int(episode[e])
    buf.close()
    results.put((writer, written))


def episode_storm_errors(batch: dict, kind: str, n: int = 1, gamma: float = 0.5, finished=None) -> int:
    """Values of a sample that do not match the formula (0 if all do). ``finished``: the
    writers' episode counts read before the sample was asked for (see
    :func:`episode_storm_writer`)."""
    def split(key):
        key = np.asarray(key)
        return key // 1_000_000_000, key // 1_000 % 1_000_000, key % 1_000

    if kind == "episode":
        obs, k = batch["obs"], batch["obs"][:, 0]
        who, episode, step = split(k)
        w, e = who // 16, who % 16
        steps, term = episode_plan(int(w[0]), int(e[0]), int(episode[0]))
        want = np.arange(steps)
        bad = len(k) != steps or (who != who[0]).any() or (episode != episode[0]).any() or (step != want).any()
        if bad:
            return 1
        bad = (obs != k[:, None] + np.arange(3)).sum() + (batch["action"] != k * 3).sum()
        bad += (batch["next_obs"][:, 0] != k + 1).sum() + (batch["reward"] != step + 1).sum()
        bad += batch["terminated"].tolist() != [term and i == steps - 1 for i in range(steps)]
        bad += batch["truncated"].tolist() != [not term and i == steps - 1 for i in range(steps)]
        return int(bad)
    k = batch["obs"][..., 0]
    who, episode, step = split(k)
    w, e = who // 16, who % 16
    plan = np.array([episode_plan(int(a), int(b), int(c)) for a, b, c in
                     zip(w.ravel(), e.ravel(), episode.ravel())]).reshape(k.shape + (2,))
    steps, term = plan[..., 0], plan[..., 1].astype(bool)
    if kind == "trajectory":
        m = batch["mask"]
        bad = (batch["obs"][m] != k[m][:, None] + np.arange(3)).sum() + (batch["action"][m] != k[m] * 3).sum()
        bad += (batch["obs"][~m] != 0).sum() + (batch["timestep"][m] != step[m] + 1).sum()
        for row, rm in zip(k, m):  # one episode, consecutive steps, ending the window
            r = row[rm]
            bad += len(set((r // 1_000).tolist())) > 1 or (np.diff(r) != 1).any() or not rm[-1]
        last = step == steps - 1
        bad += (batch["terminated"] != (m & last & term)).sum() + (batch["truncated"] != (m & last & ~term)).sum()
        rtg = batch["returns_to_go"]
        bad += (np.abs(rtg[:, :-1] - rtg[:, 1:] - np.where(m[:, :-1], step[:, :-1] + 1, 0)) > 1e-9)[m[:, :-1]].sum()
        # the end step's: rewards step+1 from it to the episode's end (every step written
        # so far, for an episode in progress), all of them for one that ended before the call
        for i in range(len(k)):
            s, n, ep = int(step[i, -1]), int(steps[i, -1]), int(episode[i, -1])
            sums = np.cumsum(np.arange(s, n) + 1.0)  # to each step still to come
            ended_before = finished is not None and ep < finished[int(who[i, -1])]
            got = float(rtg[i, -1])
            bad += (got != sums[-1]) if ended_before else not np.isin(got, sums[min(1, len(sums) - 1):])
        return int(bad)
    bad = (batch["obs"] != k[:, None] + np.arange(3)).sum() + (batch["action"] != k * 3).sum()
    taken = batch["steps"] if "steps" in batch else np.ones(len(k), np.int64)
    want_k = np.minimum(steps - step, n)
    bad += (taken != want_k).sum() + (batch["next_obs"][:, 0] != k + taken).sum()
    ended = step + taken == steps
    bad += (batch["terminated"] != (ended & term)).sum() + (batch["truncated"] != (ended & ~term)).sum()
    if "steps" in batch:
        want_r = sum(np.where(i < taken, gamma ** i * (step + 1 + i), 0.0) for i in range(n))
        bad += (np.abs(batch["reward"] - want_r) > 1e-9).sum()
    else:
        bad += (batch["reward"] != step + 1).sum()
    return int(bad)


def episode_writer_hang_in_write(name: str, flag: str, steps: int) -> None:
    """Write ``steps`` steps of 2 envs (obs = 100 * env + t), then stop forever in the
    middle of the next write (the native path's "writing" point, or the Python path's),
    touching ``flag`` there."""
    buf = shmbuf.EpisodeBuffer.attach(name)
    w = buf.writer(envs=2)
    no = np.zeros(2, bool)

    def step(t):
        return {"obs": np.array([[t, t], [100 + t, 100 + t]], np.float32), "reward": np.ones(2, np.float32)}
    for t in range(steps):
        w.add(step(t), terminated=no, truncated=no)
    hang_at("writing", flag)
    w.add(step(steps), terminated=no, truncated=no)


def episode_steps_then_hang_in_write(name: str, flag: str, steps: int) -> None:
    """Write ``steps`` steps (obs [t], reward 1) of an episode in progress, then stop
    forever inside the write of the next one, touching ``flag`` there."""
    buf = shmbuf.EpisodeBuffer.attach(name)
    w = buf.writer()
    for t in range(steps):
        w.add({"obs": [t], "reward": 1.0}, terminated=False, truncated=False)
    hang_at("writing", flag)
    w.add({"obs": [steps], "reward": 1.0}, terminated=False, truncated=False)

__all__ = ['EPISODE_FIELDS', 'EPISODE_STORM', 'episode_key', 'episode_plan', 'episode_step', 'episode_steps_then_hang_in_write', 'episode_storm_errors', 'episode_storm_writer', 'episode_writer_hang_in_write', 'episode_writer_then_hang', 'simple_episode']

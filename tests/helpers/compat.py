"""The facades of the reference libraries, driven from child processes.

Code that runs in child processes lives here, importable by name (spawn, forkserver
and Ray workers import it).
"""

from __future__ import annotations

import numpy as np

def imitation_storer(name: str, rounds: int, ready, results) -> None:
    """Attach an imitation ReplayBuffer by name and store transitions through its own
    ``store`` while the parent samples: obs row i is (k, k) with acts k, next_obs k+1."""
    from shmbuf.compat.imitation import ReplayBuffer, Transitions

    buf = ReplayBuffer.attach(name)
    ready.wait(30)
    for r in range(rounds):
        k = np.arange(r * 8, r * 8 + 8)
        infos = np.array([{}] * 8, dtype=object)
        buf.store(Transitions(obs=np.stack([k, k], 1).astype(np.float32), acts=k, infos=infos,
                              next_obs=np.stack([k + 1, k + 1], 1).astype(np.float32),
                              dones=k % 5 == 0))
    results.put(buf.size())
    buf.close()


def fishyrl_adder(name: str, steps: int, ready, results) -> None:
    """Attach a fishyrl SequentialBuffer by name and add steps t = 1000.. through its own
    ``add`` while the parent samples: obs is (t, t), reward t."""
    from shmbuf.compat.fishyrl import SequentialBuffer

    buf = SequentialBuffer.attach(name)
    ready.wait(30)
    for t in range(1000, 1000 + steps):
        buf.add({"obs": np.array([t, t]), "reward": np.float32(t)})
    results.put(buf.size)
    buf.close()


def velora_adder(name: str, rounds: int, ready, results) -> None:
    """Attach a velora ReplayBuffer by name and add_multi batches whose every value of a
    row is the row's key k (states k, actions k, rewards k, next_states k + 1)."""
    from shmbuf.compat.velora import ReplayBuffer

    buf = ReplayBuffer.attach(name)
    ready.wait(30)
    for r in range(rounds):
        k = np.arange(r * 4, r * 4 + 4, dtype=np.float32)
        buf.add_multi(np.repeat(k[:, None], 3, 1), k, k, np.repeat(k[:, None] + 1, 3, 1), k % 2 == 0,
                      np.repeat(k[:, None], 2, 1))
    results.put(len(buf))
    buf.close()


def fishyrl_vector_adder(name: str, steps: int, ready, results) -> None:
    """Attach an IndependentVectorizedBuffer by name; add steps t of 2 envs: env e's obs
    is 1000 * e + t."""
    from shmbuf.compat.fishyrl import IndependentVectorizedBuffer

    buf = IndependentVectorizedBuffer.attach(name)
    ready.wait(30)
    for t in range(steps):
        buf.add({"obs": np.array([[t], [1000 + t]])})
    results.put(buf.size)
    buf.close()


def garage_path(p: int) -> dict:
    """Path ``p`` of ``p % 5 + 1`` steps: every value of step t is ``p * 1000 + t``
    (``obs`` 3 wide, ``act`` 1 wide, float32 and int64)."""
    t = np.arange(p % 5 + 1)[:, None] + p * 1000
    return {"obs": np.repeat(t, 3, 1).astype(np.float32), "act": t.astype(np.int64)}


def garage_path_bad(path: dict) -> bool:
    """True if ``path`` is not one whole :func:`garage_path` (torn, mixed, cut)."""
    t = path["act"][:, 0]
    p = int(t[0]) // 1000
    return (len(t) != p % 5 + 1 or (t != p * 1000 + np.arange(len(t))).any()
            or (path["obs"] != t[:, None]).any())


def garage_adder(name: str, paths: int, ready, results) -> None:
    """Attach a garage PathBuffer by name and add paths 1.. through its own ``add_path``."""
    from shmbuf.compat.garage import PathBuffer

    buf = PathBuffer.attach(name)
    ready.wait(30)
    for p in range(1, paths + 1):
        buf.add_path(garage_path(p))
    results.put(buf.n_transitions_stored)
    buf.close()


def d3rlpy_buffer(buffer, **kwargs):
    """A d3rlpy-facade ReplayBuffer of float32 (2,) observations, int64 actions and
    float32 rewards (signatures given, as a user without an env would)."""
    from shmbuf.compat.d3rlpy import ActionSpace, ReplayBuffer, Signature

    return ReplayBuffer(buffer, observation_signature=Signature(dtype=[np.float32], shape=[(2,)]),
                        action_signature=Signature(dtype=[np.int64], shape=[(1,)]),
                        reward_signature=Signature(dtype=[np.float32], shape=[(1,)]),
                        action_space=ActionSpace.DISCRETE, action_size=1000, **kwargs)


def d3rlpy_obs(episode: int, t: int) -> np.ndarray:
    """The observation of step t of an episode: (episode, t)."""
    return np.array([episode, t], np.float32)


def d3rlpy_appender(name: str, episodes: int, ready, results, first: int = 1) -> None:
    """Attach a d3rlpy-facade ReplayBuffer by name and append episodes first.. through its
    own ``append`` / ``clip_episode``: episode e has e % 7 + 2 steps, observation (e, t),
    action t, reward e; odd episodes end terminated, even ones by a time limit."""
    from shmbuf.compat.d3rlpy import ReplayBuffer

    buf = ReplayBuffer.attach(name)
    ready.wait(30)
    for e in range(first, first + episodes):
        for t in range(e % 7 + 2):
            buf.append(d3rlpy_obs(e, t), t, float(e))
        buf.clip_episode(e % 2 == 1)
    results.put(buf.transition_count)
    buf.close()


def d3rlpy_bad_transitions(batch) -> int:
    """Transitions of :func:`d3rlpy_appender` episodes (or of episode 0, added by the
    test) that are not what their episode says."""
    obs, nxt = batch.observations, batch.next_observations
    e, t = obs[:, 0], obs[:, 1]
    steps = e % 7 + 2
    terminal = batch.terminals[:, 0] == 1
    bad = (batch.actions[:, 0] != t) | (batch.rewards[:, 0] != e)
    bad |= terminal & ((nxt != 0).any(axis=1) | (e % 2 != 1) | (t != steps - 1))
    bad |= ~terminal & ((nxt[:, 0] != e) | (nxt[:, 1] != t + 1) | (batch.next_actions[:, 0] != t + 1))
    bad |= ~terminal & (t >= steps - 1)  # a timeout episode's last observation is no transition
    return int(bad.sum())

__all__ = ['d3rlpy_appender', 'd3rlpy_bad_transitions', 'd3rlpy_buffer', 'd3rlpy_obs', 'fishyrl_adder', 'fishyrl_vector_adder', 'garage_adder', 'garage_path', 'garage_path_bad', 'imitation_storer', 'velora_adder']

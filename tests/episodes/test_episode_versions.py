"""Policy versions in an EpisodeBuffer (``EpisodeBuffer.create(versions=True)``): every
step and final row keeps the version its writer gave, and every way data leaves the
buffer carries it (both paths: scripts/test runs this file on each)."""

from __future__ import annotations

import numpy as np
import pytest

import shmbuf

from helpers import GOAL_OBS, GOALS, goal_episode, goal_reward

F = {"obs": ((2,), "float32"), "reward": ((), "float32")}


def episodes(name, **kw):
    return shmbuf.EpisodeBuffer.create(F, 48, name=name, versions=True, seed=0, **kw)


def episode(first, steps):
    """``steps`` steps whose obs is (first + t, first + t)."""
    t = np.arange(steps, dtype=np.float32) + first
    return {"obs": np.stack([t, t], 1), "reward": np.ones(steps, np.float32), "next_obs": [first + steps] * 2}


def test_every_way_out_carries_each_steps_version(name, tmp_path):
    """Episodes written whole (version 1, obs 0..2) and step by step by a 2-env writer
    (obs 100.. and 200.., steps 0-1 at version 2, 2-3 at 3): a version follows its step through
    transitions, n-step sums, trajectories with burn-in, whole episodes, saves and state
    dicts."""
    with episodes(name, lanes=3) as buf:
        buf.add_episode(episode(0, 3), version=1)
        with buf.writer(2) as w:
            for t in range(4):
                ended = np.array([t == 3, t == 3])
                w.add({"obs": np.array([[100 + t] * 2, [200 + t] * 2], np.float32), "reward": np.ones(2, np.float32),
                       "next_obs": np.array([[104] * 2, [204] * 2], np.float32)},
                      terminated=ended, truncated=np.zeros(2, bool), version=2 if t < 2 else 3)

        def want(obs):  # the version each step was written with
            return np.where(obs < 100, 1, np.where(obs % 100 < 2, 2, 3))

        for b in (buf.sample(300), buf.sample(300, n_step=3)):
            assert (b["version"] == want(b["obs"][:, 0])).all()
        t = buf.sample_trajectories(50, 3, burn_in=2)
        mask = t["mask"] | t["burn_in_mask"]
        assert (t["version"][mask] == want(t["obs"][mask][:, 0])).all() and (t["version"][~mask] == 0).all()
        eps = sorted(buf.episodes(), key=lambda e: float(e["obs"][0, 0]))
        assert [e["version"].tolist() for e in eps] == [[1, 1, 1], [2, 2, 3, 3], [2, 2, 3, 3]]
        assert all((e["version"] == want(e["obs"][:, 0])).all() for e in buf.sample_episodes(10))
        buf.save(tmp_path / "save")
        state = buf.core.state_dict()
        with shmbuf.EpisodeBuffer.load(tmp_path / "save", name=name + "-back") as back:
            assert back.versioned and [e["version"].tolist() for e in sorted(
                back.episodes(), key=lambda e: float(e["obs"][0, 0]))] == [[1, 1, 1], [2, 2, 3, 3], [2, 2, 3, 3]]
        with episodes(name + "-state", lanes=3) as other:
            other.core.load_state_dict(state)
            b = other.sample(200)
            assert (b["version"] == want(b["obs"][:, 0])).all()


def test_relabelled_transitions_carry_their_version(name):
    her = shmbuf.HER("future", 1.0, reward_fn=goal_reward)
    with shmbuf.EpisodeBuffer.create(GOALS, 200, name=name, seed=0, observations=GOAL_OBS, her=her,
                                     versions=True) as buf:
        buf.add_episode(goal_episode(0, 4), version=7)
        buf.add_episode(goal_episode(1, 3), version=8)
        b = buf.sample(400)
        assert (b["version"] == np.where(b["achieved_goal"][:, 0] == 0, 7, 8)).all()


def test_a_bound_weights_versions_every_step(name):
    with episodes(name) as buf, shmbuf.Weights.create(name + "-w", {"w": np.zeros(1)}) as weights:
        buf.bind(weights)
        weights.publish({"w": np.ones(1)})
        buf.add({"obs": [0, 0], "reward": 1.0}, terminated=False, truncated=False)
        weights.publish({"w": np.ones(1)})
        buf.add({"obs": [1, 1], "reward": 1.0, "next_obs": [2, 2]}, terminated=True, truncated=False)
        assert [e["version"].tolist() for e in buf.episodes()] == [[1, 2]]
        weights.unlink()


def test_bad_versions_are_clear_errors_that_write_nothing(name):
    with episodes(name) as buf:
        with pytest.raises(ValueError, match="this buffer keeps each row's policy version: pass version="):
            buf.add({"obs": [0, 0], "reward": 1.0}, terminated=False, truncated=False)
        buf.add_episode(episode(0, 2), version=3)
        with pytest.raises(ValueError, match="versions never go backwards: lane 0's newest row is of version 3, got 2"):
            buf.add_episode(episode(10, 2), version=2)
        with pytest.raises(ValueError, match="version must be an int >= 0"):
            buf.add({"obs": [0, 0], "reward": 1.0}, terminated=False, truncated=False, version=-1)
        with pytest.raises(ValueError):  # a bad step at version 9: nothing written, no floor moved
            buf.add({"obs": [0, 0, 0], "reward": 1.0}, terminated=False, truncated=False, version=9)
        assert len(buf) == 3
        buf.add_episode(episode(20, 2), version=4)
        assert len(buf) == 6 and [e["version"].tolist() for e in buf.episodes()] == [[3, 3], [4, 4]]
    with shmbuf.EpisodeBuffer.create(F, 16, name=name + "-plain") as plain:
        with pytest.raises(ValueError, match="version= is for a buffer created with versions=True"):
            plain.add({"obs": [0, 0], "reward": 1.0}, terminated=False, truncated=False, version=1)
        assert len(plain) == 0 and not plain.versioned
    for kw in ({"sampler": "newest"}, {"max_times_sampled": 2}):
        with pytest.raises(ValueError, match="are for shmbuf.Buffer"):
            shmbuf.EpisodeBuffer.create(F, 8, name=name + "-x", **kw)

"""Sequences for recurrent agents: trajectories with a burn-in prefix, drawn uniformly
or by the priority of their last step, with one priority per sequence."""

from __future__ import annotations

import math

import numpy as np
import pytest

import shmbuf

FIELDS = {"obs": ((2,), np.float32), "reward": ((), np.float32), "hidden": ((3,), np.float32)}


def episode(ep: int, steps: int) -> dict:
    """Episode ``ep``: obs (1000*ep + t, t), reward t, hidden state (ep, t, -t)."""
    t = np.arange(steps)
    return {"obs": np.stack([1000 * ep + t, t], 1), "reward": t,
            "hidden": np.stack([np.full(steps, ep), t, -t], 1),
            "next_obs": [1000 * ep + steps, steps]}


def check_sequences(t: dict, burn_in: int, length: int) -> None:
    """Every position holds the step its place says, of the episode of the last step."""
    total = burn_in + length
    assert t["obs"].shape[:2] == (len(t["mask"]), total)
    for i in range(len(t["mask"])):
        ep, end = divmod(int(t["obs"][i, -1, 0]), 1000)
        steps_before = np.arange(end - total + 1, end + 1)  # the step each position holds
        exists = steps_before >= 0
        assert t["mask"][i].tolist() == exists.tolist()
        assert t["burn_in_mask"][i].tolist() == (exists & (np.arange(total) < burn_in)).tolist()
        s = steps_before[exists]
        assert t["obs"][i, exists].tolist() == np.stack([1000 * ep + s, s], 1).tolist()
        assert t["hidden"][i, exists].tolist() == np.stack([np.full(len(s), ep), s, -s], 1).tolist()
        assert t["timestep"][i, exists].tolist() == (s + 1).tolist()
        assert not t["obs"][i, ~exists].any() and not t["hidden"][i, ~exists].any()


def test_burn_in_prepends_the_steps_before_the_window(name):
    """Burn-in steps are the episode's steps before the window, exact; near the start
    of an episode they are padding, and ``burn_in_mask`` says which exist."""
    with shmbuf.EpisodeBuffer.create(FIELDS, 200, seed=0, name=name) as buf:
        for ep in range(6):
            buf.add_episode(episode(ep, 3 + 4 * ep))
        t = buf.sample_trajectories(300, 4, burn_in=5)
        check_sequences(t, 5, 4)
        assert t["burn_in_mask"].any() and not t["burn_in_mask"].all()  # both cases were drawn
        assert "weight" not in t and "index" not in t
        # without burn_in: the same trajectories as before, no burn_in_mask
        assert "burn_in_mask" not in buf.sample_trajectories(2, 4)


def test_the_hidden_state_comes_back_for_the_first_burn_in_step(name):
    """An R2D2 learner takes the stored recurrent state at the first burn-in step."""
    with shmbuf.EpisodeBuffer.create(FIELDS, 100, seed=1, name=name) as buf:
        buf.add_episode(episode(3, 40))
        t = buf.sample_trajectories(50, 8, burn_in=10)
        end = t["obs"][:, -1, 1]
        full = end >= 17  # the windows whose first position holds a step
        assert full.any() and (~full).any()
        assert t["hidden"][full, 0].tolist() == [[3, e - 17, 17 - e] for e in end[full]]
        # shorter: the first step of the episode, where the burn-in mask starts
        first = t["burn_in_mask"][~full].argmax(axis=1)
        assert t["hidden"][~full][np.arange(len(first)), first, 1].tolist() == [0] * len(first)


def wilson_hilferty(df: int, z: float = 4.0) -> float:
    """An upper quantile of chi-square with ``df`` degrees of freedom (z sigmas)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("alpha", [1.0, 0.6])
def test_sequences_are_drawn_in_proportion_to_their_last_steps_priority(name, alpha):
    """A chi-square test of the drawn end steps against p**alpha / sum p**alpha, and the
    weights against the formula (min p**alpha / p**alpha) ** beta."""
    with shmbuf.EpisodeBuffer.create(FIELDS, 64, priority=alpha, seed=3, name=name) as buf:
        for ep in range(3):
            buf.add_episode(episode(ep, 8))
        t = buf.sample_trajectories(400, 3, burn_in=2)
        index = t["index"]
        steps = {}  # row (slot, seq) -> the priority we give that sequence
        for (slot, seq), obs in zip(index.tolist(), t["obs"][:, -1].tolist()):
            steps[(slot, seq)] = 1.0 + (obs[1] % 4) + obs[0] / 1000
        idx = np.array(list(steps))
        prio = np.array(list(steps.values()))
        assert buf.update_priorities(idx, prio) == len(idx)
        assert len(idx) == 3 * 8  # every transition (step) was drawn at least once (400 draws of 24)
        t = buf.sample_trajectories(20_000, 3, burn_in=2, beta=0.5)
        keys = {k: i for i, k in enumerate(steps)}
        counts = np.bincount([keys[k] for k in map(tuple, t["index"].tolist())], minlength=len(keys))
        p = prio ** alpha / (prio ** alpha).sum()
        chi2 = float((((counts - 20_000 * p) ** 2) / (20_000 * p)).sum())
        assert chi2 < wilson_hilferty(len(p) - 1), (chi2, counts, p)
        want = ((prio ** alpha).min() / prio ** alpha) ** 0.5
        got = want[[keys[k] for k in map(tuple, t["index"].tolist())]]
        assert np.allclose(t["weight"], got)
        check_sequences(t, 2, 3)


def test_a_sequence_whose_last_step_was_overwritten_keeps_its_new_priority(name):
    """``update_priorities`` is stale-safe: a sequence whose last step was overwritten
    since it was drawn is skipped (the count returned says so)."""
    with shmbuf.EpisodeBuffer.create(FIELDS, 16, priority=1.0, seed=0, name=name) as buf:
        buf.add_episode(episode(0, 6))
        t = buf.sample_trajectories(4, 2)
        for ep in range(1, 4):
            buf.add_episode(episode(ep, 6))  # 21 more rows: the ring of 16 wrapped
        assert buf.update_priorities(t["index"], np.full(4, 5.0)) == 0
        t = buf.sample_trajectories(4, 2)
        assert buf.update_priorities(t["index"], np.full(4, 5.0)) == 4


def test_bad_arguments_are_refused_and_change_nothing(name):
    with shmbuf.EpisodeBuffer.create(FIELDS, 32, seed=0, name=name) as buf:
        buf.add_episode(episode(0, 5))
        state = buf.engine.rng.bit_generator.state
        with pytest.raises(ValueError, match="beta= is for a prioritized buffer"):
            buf.sample_trajectories(2, 2, beta=0.5)
        with pytest.raises(ValueError, match="burn_in must be >= 0"):
            buf.sample_trajectories(2, 2, burn_in=-1)
        with pytest.raises(TypeError, match="burn_in must be an int"):
            buf.sample_trajectories(2, 2, burn_in=1.5)
        assert buf.engine.rng.bit_generator.state == state
    with shmbuf.EpisodeBuffer.create(FIELDS, 32, seed=0, priority=0.6, name=name + "-p") as buf:
        buf.add_episode(episode(0, 5))
        with pytest.raises(ValueError, match="beta"):
            buf.sample_trajectories(2, 2, beta=-1.0)


def test_an_episode_buffer_has_no_queue_mode():
    with pytest.raises(ValueError, match="mode='queue'"):
        shmbuf.EpisodeBuffer.create(FIELDS, 32, mode="queue")

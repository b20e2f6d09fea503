"""EpisodeBuffer's trajectories, whole episodes, frame stacks and FIFO eviction, in the
terms of seed-semantics: d3rlpy's trajectory slicer (its verified examples), FIFO
counts, garage's whole-path sampling across the wrap, d3rlpy's frame-stack padding."""

from __future__ import annotations

import numpy as np
import pytest

import shmbuf

F = {"obs": ((1,), "float32"), "reward": ((), "float32")}
R = [1, 2, 4, 8, 16]


def _episode(first, rewards, final=None):
    t = np.arange(len(rewards), dtype=np.float32)
    return {"obs": (first + t)[:, None], "reward": rewards,
            "next_obs": [first + len(rewards) if final is None else final]}


def _by_end(t):
    """{end timestep: (obs, mask, timestep, returns_to_go, terminated)} of a trajectory batch."""
    out = {}
    for i in range(len(t["mask"])):
        out[int(t["timestep"][i, -1])] = (t["obs"][i, :, 0].tolist(), t["mask"][i].tolist(),
                                          t["timestep"][i].tolist(), t["returns_to_go"][i].tolist(),
                                          t["terminated"][i].tolist())
    return out


def test_trajectories_match_the_slicer_examples_of_d3rlpy(name):
    """r = [1, 2, 4, 8, 16], terminated: end 1 size 4 -> rtg [0, 0, 31, 30], timesteps
    [0, 0, 1, 2]; end 4 size 3 -> rtg [28, 24, 16], timesteps [3, 4, 5], terminals [0, 0, 1]."""
    with shmbuf.EpisodeBuffer.create(F, 16, name=name, seed=0) as buf:
        buf.add_episode(_episode(10, R), terminated=True)
        four = _by_end(buf.sample_trajectories(400, 4))
        assert four[2] == ([0, 0, 10, 11], [False, False, True, True], [0, 0, 1, 2],
                           [0, 0, 31, 30], [False, False, False, False])
        three = _by_end(buf.sample_trajectories(400, 3))
        assert three[5] == ([12, 13, 14], [True] * 3, [3, 4, 5], [28, 24, 16], [False, False, True])
        assert sorted(three) == [1, 2, 3, 4, 5]  # every step ends one (uniform over transitions)


def test_a_trajectory_never_crosses_into_another_episode(name):
    with shmbuf.EpisodeBuffer.create(F, 32, name=name, seed=0) as buf:
        buf.add_episode(_episode(0, [1, 1, 1]), terminated=False)
        buf.add_episode(_episode(100, [2, 2]), terminated=True)
        t = buf.sample_trajectories(300, 5)
        obs, mask = t["obs"][..., 0], t["mask"]
        assert (obs[~mask] == 0).all()
        for row, m in zip(obs, mask):
            assert len({v // 100 for v in row[m]}) == 1  # one episode per window
        assert set(t["truncated"][:, -1].tolist()) == {False, True}  # a truncated episode's last step is an end


def test_returns_to_go_of_an_episode_in_progress_run_to_its_newest_step(name):
    with shmbuf.EpisodeBuffer.create(F, 16, name=name, seed=0) as buf:
        for r in R[:3]:
            buf.add({"obs": [0.0], "reward": r}, terminated=False, truncated=False)
        t = _by_end(buf.sample_trajectories(200, 2))
        assert sorted(t) == [1, 2]  # the newest step waits for its next observation
        assert t[1][3] == [0, 7] and t[2][3] == [7, 6]  # to the newest step written (4)


def test_evicted_steps_are_padding_and_whole_episodes_must_be_unevicted(name):
    # 6 rows: the episode of 5 steps takes 6 (with its final row); one more row evicts step 0
    with shmbuf.EpisodeBuffer.create(F, 6, name=name, seed=0) as buf:
        buf.add_episode(_episode(10, R), terminated=True)
        assert len(buf.sample_episodes(3)) == 3
        buf.add({"obs": [99.0], "reward": 0}, terminated=False, truncated=False)
        with pytest.raises(ValueError, match="no complete episode"):
            buf.sample_episodes(1)
        t = _by_end(buf.sample_trajectories(300, 5))
        assert t[5][1:3] == ([False, True, True, True, True], [0, 2, 3, 4, 5])
        assert t[5][3] == [0, 30, 28, 24, 16]  # the evicted step is padding; the rest still add up
        b = buf.sample(300)
        assert set(b["obs"][:, 0].tolist()) == {11, 12, 13, 14}  # surviving steps stay transitions
        assert (buf.num_episodes, buf.transition_count) == (1, 4)


@pytest.mark.parametrize("terminated, transitions", [(True, 5), (False, 5)])
def test_fifo_counts_follow_d3rlpy(name, terminated, transitions):
    """d3rlpy: limit 500, 10 episodes of 100 steps -> 5 episodes left. Here an episode of
    100 steps takes 101 rows (its final observation), and truncated episodes keep their
    last step as a transition (it bootstraps from the final observation)."""
    with shmbuf.EpisodeBuffer.create(F, 500, name=name, seed=0) as buf:
        for e in range(10):
            buf.add_episode(_episode(1000 * e, np.ones(100)), terminated=terminated)
        assert (len(buf), buf.num_episodes, buf.transition_count) == (500, 5, 495)
        assert len({int(ep["obs"][0, 0]) for ep in buf.sample_episodes(200)}) == 4  # the partial one is not whole


def test_only_the_final_row_left_is_no_episode(name):
    with shmbuf.EpisodeBuffer.create(F, 4, name=name, seed=0) as buf:
        buf.add_episode(_episode(0, [1, 2, 3]), terminated=True)  # rows 0..3
        assert (buf.num_episodes, buf.transition_count) == (1, 3)
        buf.add({"obs": [7.0], "reward": 1}, terminated=False, truncated=False)
        buf.add({"obs": [8.0], "reward": 1}, terminated=False, truncated=False)
        buf.add({"obs": [9.0], "reward": 1}, terminated=False, truncated=False)
        # left: the first episode's final row, and 3 steps of one in progress
        assert (buf.num_episodes, buf.transition_count) == (1, 2)


def test_whole_episodes_come_in_order_across_the_wrap_and_uniformly(name):
    with shmbuf.EpisodeBuffer.create(F, 10, name=name, seed=0) as buf:
        buf.add_episode(_episode(0, [1, 1, 1]), terminated=True)      # rows 0..3
        buf.add_episode(_episode(10, [1, 1]), terminated=False)       # rows 4..6
        buf.add_episode(_episode(20, [1, 2, 3, 4]), terminated=True)  # rows 7..11: wraps to slots 0, 1
        eps = buf.sample_episodes(1000)
        firsts = [int(e["obs"][0, 0]) for e in eps]
        assert set(firsts) == {10, 20}  # the first episode was overwritten
        assert 400 < firsts.count(20) < 600  # uniform over episodes, not over steps
        wrapped = next(e for e in eps if e["obs"][0, 0] == 20)
        assert wrapped["obs"][:, 0].tolist() == [20, 21, 22, 23]
        assert wrapped["next_obs"][:, 0].tolist() == [21, 22, 23, 24]
        assert wrapped["reward"].tolist() == [1, 2, 3, 4]
        assert wrapped["terminated"].tolist() == [False, False, False, True]
        cut = next(e for e in eps if e["obs"][0, 0] == 10)
        assert cut["truncated"].tolist() == [False, True] and not cut["terminated"].any()


def test_frame_stacks_are_the_episodes_latest_frames_zero_padded(name):
    """d3rlpy's FrameStackTransitionPicker: frames before step 0 are zeros; the next
    observation is stacked the same way at the next step."""
    fields = {"obs": ((2,), "uint8"), "reward": ((), "float32")}
    with shmbuf.EpisodeBuffer.create(fields, 32, frame_stack=3, name=name, seed=0) as buf:
        for first, n in ((10, 4), (50, 2)):
            t = np.arange(n)
            buf.add_episode({"obs": np.repeat((first + t)[:, None], 2, axis=1), "reward": np.ones(n),
                             "next_obs": [first + n] * 2}, terminated=True)
        assert buf.fields["obs"][0] == (2,)
        b = buf.sample(500)
        assert b["obs"].shape == (500, 3, 2) and b["next_obs"].shape == (500, 3, 2)
        got = {tuple(o[:, 0]): tuple(x[:, 0]) for o, x in zip(b["obs"], b["next_obs"])}
        assert got == {(0, 0, 10): (0, 10, 11), (0, 10, 11): (10, 11, 12), (10, 11, 12): (11, 12, 13),
                       (11, 12, 13): (12, 13, 14), (0, 0, 50): (0, 50, 51), (0, 50, 51): (50, 51, 52)}
        n3 = buf.sample(300, n_step=3, gamma=1.0)
        assert {tuple(o[:, 0]): tuple(x[:, 0]) for o, x in zip(n3["obs"], n3["next_obs"])}[(0, 0, 10)] \
            == (11, 12, 13)


def test_a_frame_stack_reaching_evicted_frames_is_not_sampled(name):
    fields = {"obs": ((), "uint8")}
    with shmbuf.EpisodeBuffer.create(fields, 6, frame_stack=3, name=name, seed=0) as buf:
        for v in range(7):  # one episode in progress: rows 0..6, row 0 evicted
            buf.add({"obs": v}, terminated=False, truncated=False)
        b = buf.sample(300)
        assert set(map(tuple, b["obs"].tolist())) == {(1, 2, 3), (2, 3, 4), (3, 4, 5)}  # not (0, 1, 2) nor (x, 1, 2)


@pytest.mark.parametrize("frames", [1, 4])
def test_episode_buffers_store_observations_once(frames):
    """Atari rows: an EpisodeBuffer takes about half the memory of a Buffer holding obs
    and next_obs; storing single frames (frame_stack=4) about an eighth."""
    atari = {"obs": ((4, 84, 84), "uint8"), "action": ((), "int64"), "reward": ((), "float32")}
    core = shmbuf.Buffer.create({**atari, "next_obs": ((4, 84, 84), "uint8"), "done": ((), "bool")}, 1000)
    fields = {**atari, "obs": ((84, 84), "uint8")} if frames > 1 else atari
    eps = shmbuf.EpisodeBuffer.create(fields, 1000, frame_stack=frames)
    try:
        ratio = eps.core.nbytes / core.nbytes
        assert ratio < (0.51 if frames == 1 else 0.13), ratio
    finally:
        eps.close()
        core.close()


def test_the_index_of_whole_episodes_follows_new_episodes_eviction_and_clear(name):
    with shmbuf.EpisodeBuffer.create(F, 12, name=name, seed=0) as buf:
        firsts = lambda: {int(e["obs"][0, 0]) for e in buf.sample_episodes(200)}  # noqa: E731
        buf.add_episode(_episode(0, [1, 1]), terminated=True)         # rows 0..2
        assert firsts() == {0}
        buf.add({"obs": [10.0], "reward": 1}, terminated=False, truncated=False)
        assert firsts() == {0}  # one in progress: not whole yet
        buf.add({"obs": [11.0], "reward": 1, "next_obs": [12.0]}, terminated=False, truncated=True)
        assert firsts() == {0, 10}
        for first in (20, 30, 40):
            buf.add_episode(_episode(first, [1, 1]), terminated=True)  # rows 6..14: evicts rows 0..2
        assert firsts() == {10, 20, 30, 40}
        buf.core.clear()
        buf.add_episode(_episode(50, [1]), terminated=True)
        assert firsts() == {50}

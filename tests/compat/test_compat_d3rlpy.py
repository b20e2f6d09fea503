"""shmbuf.compat.d3rlpy, called as d3rlpy's users call ReplayBuffer and its parts
(seed-semantics 1.5, section 2 A5, B12-B14, C2, D1-D2, E1-E2, E6, E9-E10, E12)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from shmbuf.compat.d3rlpy import (ActionSpace, BasicTrajectorySlicer, BasicTransitionPicker, Episode,
                                  EpisodeGenerator, FIFOBuffer, FrameStackTransitionPicker, InfiniteBuffer,
                                  MixedReplayBuffer, MultiStepTransitionPicker, ReplayBuffer, Signature,
                                  SparseRewardTransitionPicker, create_fifo_replay_buffer)

import helpers

REWARDS = [1.0, 2.0, 4.0, 8.0, 16.0]


def episode(steps, terminated, rewards=None, e=0):
    obs = np.stack([helpers.d3rlpy_obs(e, t) for t in range(steps)])
    rewards = np.full(steps, float(e)) if rewards is None else np.asarray(rewards, np.float64)
    return Episode(obs, np.arange(steps)[:, None], rewards.astype(np.float32)[:, None], terminated)


def by_step(batch):
    """{step t: (reward, interval, terminal, next obs)} of every distinct transition drawn."""
    out = {}
    for i in range(len(batch.actions)):
        out[int(batch.observations[i, 1])] = (float(batch.rewards[i, 0]), float(batch.intervals[i, 0]),
                                              float(batch.terminals[i, 0]), batch.next_observations[i].tolist())
    return out


def test_signatures_come_from_somewhere_or_a_clear_error():
    with pytest.raises(ValueError, match="Either episodes or env must be provided to determine signatures"):
        ReplayBuffer(FIFOBuffer(10))
    sig = Signature(dtype=[np.float32], shape=[(2,)])
    with pytest.raises(ValueError, match="to determine action_space"):
        ReplayBuffer(FIFOBuffer(10), observation_signature=sig, action_signature=sig, reward_signature=sig)
    with pytest.raises(ValueError, match="limit must be an int >= 1"):
        FIFOBuffer(0)
    with pytest.raises(TypeError, match="FIFOBuffer"):
        ReplayBuffer(object(), episodes=[episode(3, True)])


def test_signatures_and_action_space_from_episodes_and_from_an_env(name):
    with ReplayBuffer(InfiniteBuffer(), episodes=[episode(3, True), episode(4, False, e=5)], name=name) as buf:
        info = buf.dataset_info
        assert info.action_space.value == ActionSpace.DISCRETE.value and info.action_size == 4  # max + 1
        assert list(map(tuple, info.observation_signature.shape)) == [(2,)] and buf.transition_count == 3 + 3
        assert buf.size() == 2 and len(buf.episodes) == 2
        buf.unlink()

    class Box:
        shape, dtype = (3,), np.float32

    class Discrete:
        shape, dtype, n = (), np.int64, 2

    class Env:
        observation_space, action_space = Box(), Discrete()

    with ReplayBuffer(FIFOBuffer(50), env=Env(), name=name + "e") as buf:
        info = buf.dataset_info
        assert info.action_space.value == ActionSpace.DISCRETE.value and info.action_size == 2
        for t in range(4):
            buf.append(np.zeros(3, np.float32), 1, 1.0)  # an int action becomes [a]
        buf.clip_episode(True)
        b = buf.sample_transition_batch(8)
        assert b.actions.shape == (8, 1) and b.observations.shape == (8, 3)
        buf.unlink()


@pytest.mark.parametrize("terminated, count", [(True, 100), (False, 99)])
def test_online_episodes_give_t_or_t_minus_1_transitions(name, terminated, count):
    with helpers.d3rlpy_buffer(FIFOBuffer(1000), name=name, seed=0) as buf:
        for t in range(100):
            buf.append(helpers.d3rlpy_obs(0, t), t, 0.0)
            if t >= 2:
                assert buf.transition_count == t - 2  # (d3rlpy: t; the newest two steps wait here)
        buf.clip_episode(terminated)
        assert buf.transition_count == count and buf.size() == 1
        b = buf.sample_transition_batch(2000)
        t, terminal = b.observations[:, 1], b.terminals[:, 0] == 1
        assert (terminal == (t == 99)).all() and (b.next_observations[terminal] == 0).all()
        assert (b.next_observations[~terminal, 1] == t[~terminal] + 1).all()
        assert set(b.observations[:, 1].astype(int).tolist()) == set(range(count))
        assert (b.terminals[:, 0] == 1).sum() > 0 if terminated else not b.terminals.any()
        buf.unlink()


def test_one_step_episodes_are_a_terminal_transition_or_nothing(name):
    with helpers.d3rlpy_buffer(FIFOBuffer(100), name=name, seed=0) as buf:
        buf.clip_episode(True)  # nothing active: nothing happens
        buf.append(helpers.d3rlpy_obs(1, 0), 0, 1.0)
        buf.clip_episode(True)  # (d3rlpy writes nothing and merges the step into the next episode)
        assert buf.transition_count == 1 and buf.size() == 1
        b = buf.sample_transition_batch(5)
        assert (b.terminals == 1).all() and (b.next_observations == 0).all()
        buf.append(helpers.d3rlpy_obs(2, 0), 0, 2.0)
        buf.clip_episode(False)  # one observation, cut: no transition
        assert buf.transition_count == 1 and buf.size() == 1
        buf.append(helpers.d3rlpy_obs(3, 0), 0, 3.0)  # a new episode
        buf.append(helpers.d3rlpy_obs(3, 1), 1, 3.0)
        buf.clip_episode(False)
        assert buf.transition_count == 2 and buf.size() == 2
        buf.unlink()


def test_basic_picker_terminal_and_timeout_transitions(name):
    with helpers.d3rlpy_buffer(FIFOBuffer(100), name=name, seed=0) as buf:
        buf.append_episode(episode(3, True, e=1))
        buf.append_episode(episode(3, False, e=2))
        b = buf.sample_transition_batch(500)
        assert helpers.d3rlpy_bad_transitions(b) == 0
        last = b.observations[:, 0] == 1
        idx2 = last & (b.observations[:, 1] == 2)
        assert idx2.any() and (b.next_observations[idx2] == 0).all() and (b.terminals[idx2] == 1).all()
        assert (b.next_actions[idx2] == 0).all()
        cut = (b.observations[:, 0] == 2) & (b.observations[:, 1] == 1)
        assert cut.any() and (b.next_observations[cut] == [2, 2]).all() and (b.terminals[cut] == 0).all()
        assert not ((b.observations[:, 0] == 2) & (b.observations[:, 1] == 2)).any()
        assert (b.next_actions[cut] == 2).all()  # the cut episode's last action: kept for next_action
        assert b.rewards.dtype == np.float32 and b.rewards.shape == (500, 1)
        assert b.intervals.shape == (500, 1) and (b.intervals == 1).all()
        with pytest.raises(ValueError):
            helpers.d3rlpy_buffer(FIFOBuffer(5), name=name + "x").sample_transition_batch(1)
        buf.unlink()


@pytest.mark.parametrize("terminated, want", [
    (False, {0: (3.0, 3, 0.0), 1: (6.0, 3, 0.0), 2: (8.0, 2, 0.0), 3: (8.0, 1, 0.0)}),
    (True, {0: (3.0, 3, 0.0), 1: (6.0, 3, 0.0), 2: (12.0, 3, 1.0), 3: (16.0, 2, 1.0), 4: (16.0, 1, 1.0)}),
])
def test_multi_step_picker_rewards_and_intervals(name, terminated, want):
    with helpers.d3rlpy_buffer(FIFOBuffer(100), name=name, seed=0,
                               transition_picker=MultiStepTransitionPicker(n_steps=3, gamma=0.5)) as buf:
        buf.append_episode(episode(5, terminated, REWARDS))
        got = by_step(buf.sample_transition_batch(500))
        assert {t: v[:3] for t, v in got.items()} == want
        for t, (_, interval, terminal, nxt) in got.items():
            assert nxt == ([0, 0] if terminal else [0, t + interval])
        again = ReplayBuffer.attach(name)  # the picker comes with the buffer
        assert {t: v[:3] for t, v in by_step(again.sample_transition_batch(500)).items()} == want
        again.close()
        buf.unlink()


def test_frame_stack_picker_pads_front_and_zeroes_after_a_terminal(name):
    sig = Signature(dtype=[np.float32], shape=[(1, 2)])
    buf = ReplayBuffer(FIFOBuffer(50), transition_picker=FrameStackTransitionPicker(n_frames=3), name=name,
                       observation_signature=sig, action_signature=Signature(dtype=[np.int64], shape=[(1,)]),
                       reward_signature=Signature(dtype=[np.float32], shape=[(1,)]),
                       action_space=ActionSpace.DISCRETE, action_size=10, seed=0)
    for t in range(4):
        buf.append(np.full((1, 2), t + 1, np.float32), t, 0.0)
    buf.clip_episode(True)
    b = buf.sample_transition_batch(300)
    assert b.observations.shape == (300, 3, 2)  # 3 frames of (1, 2) on axis 0
    for i in range(300):
        t = int(b.actions[i, 0])
        frames = [max(s + 1, 0) if s >= 0 else 0 for s in range(t - 2, t + 1)]
        assert b.observations[i, :, 0].tolist() == frames
        if t == 3:
            assert (b.next_observations[i] == 0).all() and b.terminals[i, 0] == 1
        else:
            assert b.next_observations[i, :, 0].tolist() == [max(s + 1, 0) if s >= 0 else 0 for s in range(t - 1, t + 2)]
            assert b.next_actions[i, 0] == t + 1
    buf.close()


def test_trajectories_end_at_a_transition_and_pad_the_front(name):
    with helpers.d3rlpy_buffer(FIFOBuffer(100), name=name, seed=0, trajectory_slicer=BasicTrajectorySlicer()) as buf:
        buf.append_episode(episode(5, True, REWARDS))
        b = buf.sample_trajectory_batch(400, 4)
        assert b.observations.shape == (400, 4, 2) and b.rewards.shape == (400, 4, 1) and b.length == 4
        assert b.timesteps.dtype == np.float32 and b.masks.dtype == np.float32
        ends = {int(b.timesteps[i, -1]) - 1: i for i in range(400)}
        i = ends[1]
        assert b.observations[i, :, 1].tolist() == [0, 0, 0, 1] and b.masks[i].tolist() == [0, 0, 1, 1]
        assert b.returns_to_go[i, :, 0].tolist() == [0, 0, 31, 30] and b.timesteps[i].tolist() == [0, 0, 1, 2]
        i = ends[4]
        assert b.returns_to_go[i, 1:, 0].tolist() == [28, 24, 16] and b.timesteps[i, 1:].tolist() == [3, 4, 5]
        assert b.terminals[i, :, 0].tolist() == [0, 0, 0, 1]
        one = buf.sample_trajectory(2)
        assert one["observations"].shape == (2, 2) if isinstance(one, dict) else one.observations.shape == (2, 2)
        buf.unlink()


def test_fifo_keeps_partial_episodes_until_their_last_transition_goes(name):
    with helpers.d3rlpy_buffer(FIFOBuffer(10), name=name, seed=0) as buf:
        for e in (1, 2, 3):
            buf.append_episode(episode(4, True, e=e))  # 5 rows each
        assert buf.size() == 2 and buf.transition_count == 4 + 4  # episode 1 evicted; 2 and 3 whole
        buf.append_episode(episode(2, True, e=4))  # 3 rows: evicts 3 of episode 2's
        assert buf.size() == 3 and buf.transition_count == 1 + 4 + 2
        b = buf.sample_transition_batch(500)
        e, t, terminal = b.observations[:, 0], b.observations[:, 1], b.terminals[:, 0] == 1
        assert (terminal == (t == np.where(e == 4, 1, 3))).all() and (b.next_observations[terminal] == 0).all()
        assert (b.next_observations[~terminal] == np.stack([e, t + 1], 1)[~terminal]).all()
        assert set(map(tuple, b.observations[e == 2].tolist())) == {(2, 3)}
        assert [int(ep.observations[0, 0]) for ep in buf.episodes] == [3, 4]  # complete ones only
        buf.unlink()
    with helpers.d3rlpy_buffer(FIFOBuffer(1), name=name + "1") as one:  # (d3rlpy: IndexError)
        for t in range(3):
            one.append(helpers.d3rlpy_obs(0, t), t, 0.0)
        one.clip_episode(True)
        assert one.transition_count == 0
        one.unlink()


def test_an_infinite_buffer_never_evicts_it_refuses(name):
    eps = [episode(4, True, e=e) for e in (1, 2)]
    with ReplayBuffer(InfiniteBuffer(), episodes=eps, name=name) as buf:
        assert buf.transition_count == 8 and buf.size() == 2
        buf.unlink()
    with helpers.d3rlpy_buffer(InfiniteBuffer(limit=12), name=name + "i") as buf:
        buf.append_episode(eps[0])
        buf.append_episode(eps[1])
        with pytest.raises(ValueError, match="InfiniteBuffer is full"):
            buf.append_episode(eps[0])
        assert buf.transition_count == 8
        for t in range(3):
            buf.append(helpers.d3rlpy_obs(5, t), t, 5.0)
        with pytest.raises(ValueError, match="InfiniteBuffer is full"):
            buf.clip_episode(True)
        buf.unlink()


def test_write_at_termination_and_cache_size(name):
    with helpers.d3rlpy_buffer(FIFOBuffer(100), name=name, write_at_termination=True, cache_size=5) as buf:
        for t in range(5):
            buf.append(helpers.d3rlpy_obs(0, t), t, 0.0)
        assert buf.transition_count == 0
        with pytest.raises(AssertionError, match="episode length exceeds cache_size."):
            buf.append(helpers.d3rlpy_obs(0, 5), 5, 0.0)
        buf.clip_episode(False)
        assert buf.transition_count == 4
        buf.unlink()


def test_episode_generator_splits_at_ends_and_drops_the_tail():
    terminals = [0, 0, 1, 0, 0, 0, 0]
    timeouts = [0, 0, 0, 0, 1, 0, 0]
    eps = EpisodeGenerator(np.arange(7.0)[:, None], np.arange(7), np.ones(7), terminals, timeouts)()
    assert [(e.size(), e.terminated, e.transition_count) for e in eps] == [(3, True, 3), (2, False, 1)]
    assert eps[0].actions.shape == (3, 1) and eps[0].rewards.shape == (3, 1)
    with pytest.raises(AssertionError, match="No episode termination was found"):
        EpisodeGenerator(np.zeros((3, 1)), np.zeros(3), np.zeros(3), np.zeros(3))
    both = EpisodeGenerator(np.zeros((2, 1)), np.zeros(2), np.zeros(2), [0, 1], [0, 1])()
    assert both[0].terminated  # terminal wins


def test_mixed_replay_buffer_splits_batches_by_ratio(name):
    a = helpers.d3rlpy_buffer(FIFOBuffer(50), name=name + "a", seed=0)
    b = helpers.d3rlpy_buffer(FIFOBuffer(50), name=name + "b", seed=1)
    a.append_episode(episode(3, True, e=1))
    b.append_episode(episode(3, True, e=2))
    mixed = MixedReplayBuffer(a, b, secondary_mix_ratio=0.25)
    batch = mixed.sample_transition_batch(8)
    assert batch.observations[:, 0].tolist() == [1] * 6 + [2] * 2
    assert mixed.sample_trajectory_batch(8, 2).observations.shape == (8, 2, 2)
    assert mixed.size() == 2 and mixed.transition_count == 6
    for call in (mixed.sample_transition, lambda: mixed.sample_trajectory(2), lambda: mixed.dump(None)):
        with pytest.raises(NotImplementedError):
            call()
    with pytest.raises(AssertionError):
        MixedReplayBuffer(a, b, 1.5)
    mixed.append_episode(episode(2, True, e=3))
    assert a.transition_count == 5 and b.transition_count == 3
    a.close(), b.close()


def test_pickers_and_slicers_are_the_documented_objects():
    assert BasicTransitionPicker().n_steps == 1 and SparseRewardTransitionPicker(-1).n_steps == 1
    buf = create_fifo_replay_buffer(20, episodes=[episode(2, True)])
    assert isinstance(buf.buffer, FIFOBuffer) and buf.buffer.limit == 20
    assert isinstance(buf.transition_picker, BasicTransitionPicker)
    assert pickle.loads(pickle.dumps(buf)).transition_count == 2  # pickles as its name
    buf.close()


def test_a_second_process_appends_while_this_one_samples(name):
    buf = helpers.d3rlpy_buffer(FIFOBuffer(400), name=name, seed=0, lanes=2)
    buf.append_episode(episode(2, False))  # episode 0 (see helpers.d3rlpy_appender)
    bad = []

    def check():
        batch = buf.sample_transition_batch(64)
        bad.append(helpers.d3rlpy_bad_transitions(batch))
        return 64

    count, checked = helpers.check_while_child_writes(helpers.d3rlpy_appender, (name, 300), check)
    assert sum(bad) == 0 and checked > 0 and count > 0
    seen = buf.sample_transition_batch(2000).observations[:, 0]
    assert seen.max() > 250  # the child's episodes, sampled here
    assert helpers.d3rlpy_bad_transitions(buf.sample_transition_batch(2000)) == 0
    buf.close()

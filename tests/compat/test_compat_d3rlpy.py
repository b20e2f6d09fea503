"""shmbuf.compat.d3rlpy, called as d3rlpy's users call ReplayBuffer and its parts
(seed-semantics 1.5, section 2 A5, B12-B14, C2, D1-D2, E1-E2, E6, E9-E10, E12)."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

import helpers.d3rlpy_reference as d3ref
import shmbuf
from shmbuf.core.layout import published
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
            assert buf.transition_count == t  # as d3rlpy counts: every step before the newest
        buf.clip_episode(terminated)
        assert buf.transition_count == count and buf.size() == 1
        b = buf.sample_transition_batch(2000)
        t, terminal = b.observations[:, 1], b.terminals[:, 0] == 1
        assert (terminal == (t == 99)).all() and (b.next_observations[terminal] == 0).all()
        assert (b.next_observations[~terminal, 1] == t[~terminal] + 1).all()
        assert set(b.observations[:, 1].astype(int).tolist()) == set(range(count))
        assert (b.terminals[:, 0] == 1).sum() > 0 if terminated else not b.terminals.any()
        buf.unlink()


def same_as_d3rlpy(buf, ref, samples=3000):
    """The facade holds what d3rlpy's ReplayBuffer holds: counts, and every transition
    (a seeded batch of ``samples`` draws shows each one, and no other)."""
    assert (buf.transition_count, buf.size()) == (ref.transition_count, ref.size())
    if ref.transition_count:
        assert d3ref.batch_keys(buf.sample_transition_batch(samples)) == d3ref.every_transition(ref)


def run_both(buf, ref, ops):
    """Apply ``ops`` ("a" e t: append step t of episode e; "c" True/False: clip;
    "e" episode: append_episode) to both, comparing after each."""
    for op in ops:
        if op[0] == "a":
            for x in (buf, ref):
                x.append(helpers.d3rlpy_obs(op[1], op[2]), op[2], float(op[1]))
        elif op[0] == "c":
            buf.clip_episode(op[1]), ref.clip_episode(op[1])
        else:
            buf.append_episode(op[1]), ref.append_episode(op[1])
        same_as_d3rlpy(buf, ref, samples=400)


def test_counts_are_d3rlpys_after_every_append_and_clip(name):
    ops = [("a", 1, 0), ("c", True), ("a", 2, 0), ("a", 2, 1), ("c", False),  # (a one-step episode goes on)
           ("a", 3, 0), ("a", 3, 1), ("a", 3, 2), ("c", True), ("c", False), ("a", 4, 0), ("c", False),
           ("a", 5, 0), ("a", 5, 1), ("a", 5, 2), ("a", 5, 3), ("c", False)]
    with helpers.d3rlpy_buffer(FIFOBuffer(100), name=name, seed=0) as buf:
        run_both(buf, d3ref.reference("fifo", 100), ops)
        buf.clip_episode(True)  # nothing in progress: nothing happens (d3rlpy appends a transition of an
        assert buf.transition_count == 9  # empty episode, which fails when it is sampled)
        buf.unlink()


@pytest.mark.parametrize("limit, kind", [(1, "basic"), (2, "basic"), (5, "basic"), (7, "basic"), (5, "frames"),
                                         (4, "n_step"), (4, "custom")])
def test_a_fifo_keeps_the_newest_limit_transitions(name, limit, kind):
    ops = [("a", 1, t) for t in range(6)] + [("c", True), ("e", episode(4, True, e=2)), ("e", episode(3, False, e=3))]
    ops += [("a", 4, t) for t in range(9)] + [("c", False), ("a", 5, 0), ("a", 5, 1), ("c", True)]
    picker = PICKERS[kind](d3ref.parts())  # (the frames and n-step context of the oldest: still there)
    with helpers.d3rlpy_buffer(FIFOBuffer(limit), name=name, seed=0, transition_picker=picker) as buf:
        run_both(buf, d3ref.reference("fifo", limit, picker=picker, own=limit == 1), ops)  # (d3rlpy's (1) fails)
        assert buf.transition_count == limit
        buf.unlink()


class Doubled:
    """A user's picker: d3rlpy's basic transition with the reward doubled."""

    def __call__(self, episode, index):
        t = d3ref.parts().BasicTransitionPicker()(episode, index)
        return dataclasses.replace(t, reward=t.reward * 2)


class Reversed:
    """A user's slicer: d3rlpy's basic window, its steps in reverse order."""

    def __call__(self, episode, end_index, size):
        t = d3ref.parts().BasicTrajectorySlicer()(episode, end_index, size)
        flip = {k: getattr(t, k)[::-1] for k in ("observations", "actions", "rewards", "returns_to_go", "terminals",
                                                  "timesteps", "masks")}
        return dataclasses.replace(t, **flip)


PICKERS = {"basic": lambda p: p.BasicTransitionPicker(), "n_step": lambda p: p.MultiStepTransitionPicker(3, 0.5),
           "frames": lambda p: p.FrameStackTransitionPicker(3), "sparse": lambda p: p.SparseRewardTransitionPicker(-5),
           "custom": lambda p: Doubled()}
MIXED = [("a", 1, t) for t in range(5)] + [("c", True), ("e", episode(4, False, rewards=[1, 2, 4, 8], e=2)),
                                         ("e", episode(2, True, rewards=[3, 5], e=3))]
MIXED += [("a", 4, t) for t in range(6)] + [("c", False)] + [("a", 5, t) for t in range(4)]  # (5: in progress)


@pytest.mark.parametrize("kind", sorted(PICKERS))
def test_every_picker_gives_d3rlpys_transitions(name, kind):
    """d3rlpy's own picker objects where it is installed (else this module's), or a
    user's callable, give what d3rlpy's ReplayBuffer gives with the same picker."""
    picker = PICKERS[kind](d3ref.parts())
    with helpers.d3rlpy_buffer(FIFOBuffer(100), name=name, seed=0, transition_picker=picker) as buf:
        run_both(buf, d3ref.reference("fifo", 100, picker=picker), MIXED)
        assert buf.transition_picker is picker
        buf.unlink()


@pytest.mark.parametrize("kind", ["basic", "frames", "custom"])
def test_every_slicer_gives_d3rlpys_trajectories(name, kind):
    p = d3ref.parts()
    slicer = {"basic": p.BasicTrajectorySlicer(), "frames": p.FrameStackTrajectorySlicer(2), "custom": Reversed()}[kind]
    ops = MIXED
    with helpers.d3rlpy_buffer(FIFOBuffer(100), name=name, seed=0, trajectory_slicer=slicer) as buf:
        ref = d3ref.reference("fifo", 100, slicer=slicer)
        run_both(buf, ref, ops)
        for length in (1, 3, 7):
            got = d3ref.trajectory_keys(buf.sample_trajectory_batch(2000, length))
            assert got == d3ref.every_trajectory(ref, length)
        buf.unlink()


def test_a_picker_or_slicer_must_be_callable(name):
    with pytest.raises(TypeError, match=r"transition_picker must be callable as picker\(episode, index\)"):
        helpers.d3rlpy_buffer(FIFOBuffer(10), name=name, transition_picker=3)
    with pytest.raises(TypeError, match="trajectory_slicer must be callable"):
        helpers.d3rlpy_buffer(FIFOBuffer(10), name=name, trajectory_slicer="basic")


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


def test_an_infinite_buffer_never_evicts_it_refuses(name):
    eps = [episode(4, True, e=e) for e in (1, 2)]
    with ReplayBuffer(InfiniteBuffer(), episodes=eps, name=name) as buf:
        assert buf.transition_count == 8 and buf.size() == 2
        buf.unlink()
    with helpers.d3rlpy_buffer(InfiniteBuffer(limit=10), name=name + "i") as buf:  # 10 transitions
        buf.append_episode(eps[0])
        buf.append_episode(eps[1])
        with pytest.raises(ValueError, match="InfiniteBuffer is full"):
            buf.append_episode(eps[0])
        assert buf.transition_count == 8
        for t in range(3):
            buf.append(helpers.d3rlpy_obs(5, t), t, 5.0)
        assert buf.transition_count == 10
        with pytest.raises(ValueError, match="InfiniteBuffer is full"):
            buf.append(helpers.d3rlpy_obs(5, 3), 3, 5.0)
        with pytest.raises(ValueError, match="InfiniteBuffer is full"):
            buf.clip_episode(True)
        assert buf.transition_count == 10  # (refused: nothing changed)
        buf.clip_episode(False)
        assert buf.transition_count == 10 and buf.size() == 3
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
    ep = episode(3, True, rewards=[1, 2, 4])
    t = BasicTransitionPicker()(ep, 2)
    assert t.terminal == 1.0 and (t.next_observation == 0).all() and t.rewards_to_go.ravel().tolist() == [4]
    assert SparseRewardTransitionPicker(-7, step_reward=4.0)(ep, 2).rewards_to_go.tolist() == [[-7]]
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


def test_two_processes_append_while_a_third_samples(name):
    """Two spawned processes attach by name and append episodes (1-300 and 1001-1300)
    through their own lanes while this one samples: every batch is intact, and once they
    are done the buffer holds and samples both, counted as d3rlpy counts them."""
    import multiprocessing as mp

    buf = helpers.d3rlpy_buffer(FIFOBuffer(5000), name=name, seed=0, lanes=3)
    buf.append_episode(episode(2, False))  # episode 0, so that the first batches have something
    ctx = mp.get_context("spawn")
    ready, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=helpers.d3rlpy_appender, args=(name, 300, ready, results), kwargs={"first": first})
             for first in (1, 1001)]
    for p in procs:
        p.start()
    ready.set()
    bad = checked = 0
    try:
        while any(p.is_alive() for p in procs):
            bad += helpers.d3rlpy_bad_transitions(buf.sample_transition_batch(64))
            checked += 1
        counts = [results.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(60)
    assert [p.exitcode for p in procs] == [0, 0] and bad == 0 and checked > 0
    each = [sum(e % 7 + 2 - (e % 2 == 0) for e in range(first, first + 300)) for first in (1, 1001)]
    assert buf.transition_count == 1 + sum(each) >= max(counts)  # terminated: T, cut: T - 1
    seen = buf.sample_transition_batch(4000)
    assert helpers.d3rlpy_bad_transitions(seen) == 0
    e = seen.observations[:, 0]
    assert ((e >= 1) & (e <= 300)).any() and (e >= 1001).any()
    buf.close()


def test_an_appender_without_a_free_lane_is_told_how_many_to_make(name):
    with helpers.d3rlpy_buffer(FIFOBuffer(50), name=name, seed=0) as buf:
        for t in range(3):
            buf.append(helpers.d3rlpy_obs(0, t), t, 0.0)  # its first step written: the only lane is this handle's
        other = ReplayBuffer.attach(name)
        other.append(helpers.d3rlpy_obs(1, 0), 0, 1.0)  # (held in the process: no lane yet)
        other.append(helpers.d3rlpy_obs(1, 1), 1, 1.0)
        with pytest.raises(RuntimeError, match=r"has 1 lane\(s\) for appending processes.*lanes=2"):
            other.append(helpers.d3rlpy_obs(1, 2), 2, 1.0)
        assert other.transition_count == 1  # (refused: nothing changed)
        other.close()
        buf.unlink()


def torn_facade(name, **kw):
    """A facade of 4 terminated episodes of 5 steps, row 8 planted as a writer killed
    mid-copy leaves it (stamp odd, observation garbage): see tests/core/test_read.py."""
    buf = helpers.d3rlpy_buffer(FIFOBuffer(100), name=name, seed=0, **kw)
    for e in range(1, 5):
        buf.append_episode(episode(5, True, e=e))
    with shmbuf.EpisodeBuffer.attach(name) as raw:
        ring = raw.engine.ring
        seq = int(ring.stamps[8] - 2) // 2
        ring.stamps[8] = published(seq) - 1
        ring.arrays["observation"][8] = -7.0
    return buf


FACADE_READS = {
    "transitions (fast)": ({}, lambda b: [b.sample_transition_batch(300).observations]),
    "transitions (any picker)": ({"transition_picker": Doubled()},
                                 lambda b: [b.sample_transition_batch(300).next_observations]),
    "trajectories (fast)": ({}, lambda b: [b.sample_trajectory_batch(100, 3).observations]),
    "trajectories (any slicer)": ({"trajectory_slicer": Reversed()},
                                  lambda b: [b.sample_trajectory_batch(100, 3).observations]),
}


@pytest.mark.parametrize("read", list(FACADE_READS))
def test_the_facade_never_returns_a_row_being_written(name, read):
    kw, sample = FACADE_READS[read]
    with torn_facade(name, **kw) as buf:
        assert not any((a == -7.0).any() for _ in range(3) for a in sample(buf))
        buf.unlink()


@pytest.mark.parametrize("read", list(FACADE_READS))
def test_the_facade_reads_through_the_one_checked_gather(name, read, break_protection):
    kw, sample = FACADE_READS[read]
    with torn_facade(name, **kw) as buf:
        break_protection("stamp check")
        assert any((a == -7.0).any() for _ in range(3) for a in sample(buf))
        buf.unlink()


@pytest.mark.parametrize("observation_shape", [(4,), ((4,), (8,))])
def test_dump_files_move_both_ways_between_d3rlpy_and_the_facade(name, tmp_path, observation_shape):
    """In the shape of d3rlpy's tests/dataset/test_io.py: episodes of 100 and 200 steps
    dumped by d3rlpy load in the facade, and the facade's dump loads in d3rlpy, every
    array equal (d3rlpy's own dump/load where it is installed: scripts/test-libraries)."""
    d3 = pytest.importorskip("d3rlpy.dataset")
    from shmbuf.compat.d3rlpy import dump, load

    rng = np.random.default_rng(0)

    def make(length):
        obs = [rng.random((length, *s)).astype(np.float32) for s in observation_shape] \
            if isinstance(observation_shape[0], tuple) else rng.random((length, *observation_shape)).astype(np.float32)
        return d3.Episode(obs, rng.random((length, 2)).astype(np.float32), rng.random((length, 1)).astype(np.float32),
                          True)

    episodes = [make(100), make(200)]
    theirs, mine = tmp_path / "theirs.h5", tmp_path / "mine.h5"
    with open(theirs, "w+b") as f:
        d3.dump(episodes, f)
    with open(theirs, "rb") as f:
        loaded = load(Episode, f)
    with open(mine, "w+b") as f:
        dump(loaded, f)
    with open(mine, "rb") as f:
        back = d3.load(d3.Episode, f)
    assert len(loaded) == len(back) == 2
    for want, a, b in zip(episodes, loaded, back):
        for got in (a, b):
            obs = zip(want.observations, got.observations) if isinstance(observation_shape[0], tuple) else \
                [(want.observations, got.observations)]
            assert all(np.array_equal(x, y) for x, y in obs)
            assert np.array_equal(want.actions, got.actions) and np.array_equal(want.rewards, got.rewards)
            assert want.terminated == got.terminated

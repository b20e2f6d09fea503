"""shmbuf.compat.garage, called as garage's users call PathBuffer, HERReplayBuffer and
ReplayBuffer (seed-semantics 1.4, section 2 B9-B11, C5, D3, E7, F1, F7)."""

from __future__ import annotations

import collections
import pickle

import numpy as np
import pytest

from shmbuf.compat.garage import HERReplayBuffer, PathBuffer, ReplayBuffer

import helpers


def col(values, dtype=np.int64):
    return np.array(values, dtype)[:, None]


def test_paths_evict_whole_and_remnants_stay_transitions(name):
    buf = PathBuffer(3, seed=0, name=name)
    assert buf.name is None and buf.n_transitions_stored == 0
    buf.add_path({"x": col([1, 1])})
    buf.add_path({"x": col([2, 3])})  # overwrites the first path's first row
    assert buf.name == name and buf.n_transitions_stored == 3
    assert set(buf.sample_transitions(200)["x"].ravel().tolist()) == {1, 2, 3}  # garage's remnants
    assert all(buf.sample_path()["x"].ravel().tolist() == [2, 3] for _ in range(30))
    buf.clear()


def test_a_path_across_the_ring_end_comes_back_in_order(name):
    with PathBuffer(5, seed=0, name=name) as buf:
        buf.add_path({"x": col([1, 2, 3]), "y": col([10, 20, 30], np.float32)})
        buf.add_path({"x": col([4, 5, 6]), "y": col([40, 50, 60], np.float32)})  # rows 3, 4, 0
        for _ in range(10):
            p = buf.sample_path()
            assert p["x"].ravel().tolist() == [4, 5, 6] and p["y"].ravel().tolist() == [40, 50, 60]
            assert p["x"].shape == (3, 1) and p["y"].dtype == np.float32
        assert set(buf.sample_transitions(200)["x"].ravel().tolist()) == {2, 3, 4, 5, 6}
        buf.unlink()


def test_paths_are_drawn_uniformly_not_by_length(name):
    with PathBuffer(100, seed=1, name=name) as buf:
        buf.add_path({"x": col([0])})
        buf.add_path({"x": col([1, 1, 1, 1, 1, 1, 1, 1, 1])})
        short = np.mean([len(buf.sample_path()["x"]) == 1 for _ in range(2000)])
        assert 0.45 < short < 0.55  # length-weighted would be 0.1
        rows = buf.sample_transitions(5000)["x"].ravel()
        assert 0.05 < (rows == 0).mean() < 0.15  # transitions: uniform over rows
        buf.unlink()


@pytest.mark.parametrize("path, message", [
    ({"x": col([1, 2])}, "Key y missing from path."),
    ({"x": col([1, 2]), "y": np.zeros(2)}, "Array y has wrong shape."),
    ({"x": col([1, 2]), "y": np.zeros((2, 3))}, "Array y has wrong shape."),
    ({"x": col([1, 2]), "y": np.zeros((3, 2))}, "path has inconsistent lengths between 'x' and 'y'."),
    ({"x": col([]), "y": np.zeros((0, 2))}, "Nothing in path"),
    ({}, "Key x missing"),
    ({"x": col(range(9)), "y": np.zeros((9, 2))}, "Path is too long to store in buffer."),
    ({"x": col([1]), "y": np.zeros((1, 2)), "z": col([1])}, r"keys \['z'\] are new"),
    ({"x": col([1.0, np.nan], float), "y": np.zeros((2, 2))}, "'x'"),
    ({"x": col([1]), "y": np.zeros((1, 2)), "_len": col([1])}, "keys starting with '_'"),
])
def test_bad_paths_are_refused_with_garages_errors_and_change_nothing(name, path, message):
    with PathBuffer(8, seed=0, name=name) as buf:
        buf.add_path({"x": col([7, 8]), "y": np.ones((2, 2), np.float32)})
        with pytest.raises(ValueError, match=message):
            buf.add_path(path)
        assert buf.n_transitions_stored == 2
        assert buf.sample_path()["x"].ravel().tolist() == [7, 8]
        buf.add_path({"x": col([1.9]), "y": np.zeros((1, 2))})  # cast into the first path's dtypes
        assert buf.sample_transitions(50)["x"].dtype == np.int64
        buf.unlink()


def test_first_path_checks_and_clear_forgets_the_schema(name):
    buf = PathBuffer(4, seed=0, name=name)
    for bad in ({"x": np.zeros(3)}, {}, {"x": np.zeros((5, 1))}):
        with pytest.raises(ValueError):
            buf.add_path(bad)  # (a 1-D first path is garage's IndexError)
    assert buf.name is None
    with pytest.raises(ValueError):
        buf.sample_transitions(1)  # empty
    with pytest.raises(ValueError):
        buf.sample_path()
    buf.add_path({"x": np.zeros((2, 1), np.int8)})
    buf.clear()
    assert buf.name is None and buf.n_transitions_stored == 0
    with pytest.raises(FileNotFoundError):
        PathBuffer.attach(name)  # the segment ended with the schema
    buf.add_path({"obs": np.ones((3, 4), np.float64)})  # new keys, shape and dtype
    p = buf.sample_path()
    assert list(p) == ["obs"] and p["obs"].shape == (3, 4) and p["obs"].dtype == np.float64
    buf.clear()


def test_pickle_carries_the_name_and_another_handle_sees_the_paths(name):
    buf = PathBuffer(10, seed=0, name=name)
    buf.add_path(helpers.garage_path(3))
    copy = pickle.loads(pickle.dumps(buf))
    assert copy.name == name and copy.n_transitions_stored == 4
    p = copy.sample_path()
    assert {k: (v.shape, v.dtype) for k, v in p.items()} == {"obs": ((4, 3), np.float32), "act": ((4, 1), np.int64)}
    copy.add_path(helpers.garage_path(5))
    assert buf.n_transitions_stored == 5
    copy.close()
    buf.clear()


def test_save_and_load(name, tmp_path):
    with PathBuffer(10, seed=0, name=name) as buf:
        buf.add_path(helpers.garage_path(2))
        buf.save(tmp_path / "paths")
        buf.unlink()
    with PathBuffer.load(tmp_path / "paths", name=name) as again:
        assert again.sample_path()["act"].ravel().tolist() == [2000, 2001, 2002]
        again.unlink()
    with pytest.raises(ValueError, match="not of a garage.HERReplayBuffer"):
        HERReplayBuffer.load(tmp_path / "paths", name=name)


def test_a_second_process_adds_paths_while_this_one_samples_them(name):
    buf = PathBuffer(64, seed=0, name=name)
    buf.add_path(helpers.garage_path(0))
    bad = []

    def check():
        paths = [buf.sample_path() for _ in range(20)]
        bad.extend(p for p in paths if helpers.garage_path_bad(p))
        rows = buf.sample_transitions(64)
        assert (rows["obs"] == rows["act"]).all()
        return len(paths)

    stored, checked = helpers.check_while_child_writes(helpers.garage_adder, (name, 600), check)
    assert stored == 64 and checked > 0 and not bad
    assert max(int(buf.sample_path()["act"][0, 0]) // 1000 for _ in range(50)) > 500  # its paths, seen here
    buf.clear()


# -- HERReplayBuffer -----------------------------------------------------------------------

def her_path(steps, dicts=False):
    """Goal observations whose achieved goal at step t is t (and observation 100 + t)."""
    t = np.arange(steps, dtype=np.float64)[:, None]
    parts = {"observation": 100 + t, "achieved_goal": t, "desired_goal": np.full_like(t, 9)}
    nxt = {**parts, "achieved_goal": t + 1, "observation": 101 + t}
    if dicts:
        parts = [{k: v[i] for k, v in parts.items()} for i in range(steps)]
        nxt = [{k: v[i] for k, v in nxt.items()} for i in range(steps)]
    return {"observations": parts, "next_observations": nxt, "actions": t,
            "rewards": -np.ones((steps, 1)), "terminals": np.zeros((steps, 1), bool)}


def one(achieved, desired, info):
    return 1.0


@pytest.mark.parametrize("k, ok", [(0, True), (2.0, True), (4, True), (0.2, False), (-1, False), ("x", False)])
def test_replay_k_must_be_an_integer_at_least_0(k, ok):
    if ok:
        HERReplayBuffer(k, lambda a, d, i: 0.0, 10, None)
    else:
        with pytest.raises(ValueError, match="replay_k must be an integer and >= 0."):
            HERReplayBuffer(k, lambda a, d, i: 0.0, 10, None)


@pytest.mark.parametrize("dicts", [False, True])
def test_her_adds_k_relabelled_transitions_per_step_but_the_last(name, dicts):
    calls = []

    def reward_fn(achieved, desired, info):
        calls.append(info)
        return float(achieved[0] == desired[0])

    buf = HERReplayBuffer(4, reward_fn, 100, None, seed=0, name=name)
    buf.add_path(her_path(2, dicts))
    assert buf.n_transitions_stored == 2 + 1 * 4 and calls == [None] * 4
    short = np.mean([len(buf.sample_path()["actions"]) == 1 for _ in range(1000)])
    assert 0.74 < short < 0.86  # 5 paths: 4 of one step, the original of 2
    buf.clear()
    buf.add_path(her_path(1, dicts))  # T=1: only the original
    assert buf.n_transitions_stored == 1 and len(calls) == 4
    buf.clear()


def test_her_goals_come_from_strictly_later_steps(name):
    buf = HERReplayBuffer(3, lambda a, d, i: -float(abs(a[0] - d[0]) > 0.5), 200, None, seed=0, name=name)
    buf.add_path(her_path(6))
    assert buf.n_transitions_stored == 6 + 5 * 3
    rows = buf.sample_transitions(2000)
    obs, nxt = rows["observations"], rows["next_observations"]  # sorted keys: achieved, desired, observation
    t = obs[:, 2] - 100
    relabelled = obs[:, 1] != 9
    assert relabelled.any() and (~relabelled).any()
    goal = obs[relabelled, 1]
    assert (goal > t[relabelled]).all() and (goal <= 5).all()  # a strictly later step's achieved goal
    assert (nxt[relabelled, 1] == goal).all() and (obs[:, 0] == t).all() and (nxt[:, 0] == t + 1).all()
    want = -(np.abs(nxt[relabelled, 0] - goal) > 0.5).astype(float)
    assert (rows["rewards"][relabelled, 0] == want).all() and not rows["terminals"][relabelled].any()
    assert (rows["rewards"][~relabelled] == -1).all()
    assert set(t[relabelled].tolist()) == {0, 1, 2, 3, 4}  # the last step never relabelled
    whole = [p for p in (buf.sample_path() for _ in range(300)) if len(p["actions"]) > 1]
    assert whole and (whole[0]["observations"][:, 1] == 9).all()  # the original, added whole
    buf.clear()


def test_her_splits_flat_observations_by_the_env_spec_and_attaches_with_reward_fn(name):
    class Box:
        def __init__(self, n):
            self.shape = (n,)

    class Spec:  # garage's EnvSpec: a Dict observation space, in its key order
        class observation_space:
            spaces = {"observation": Box(2), "desired_goal": Box(1), "achieved_goal": Box(1)}

    t = np.arange(3, dtype=float)[:, None]
    flat = np.concatenate([t + 100, t + 100, np.full_like(t, 9), t], 1)
    path = {"observations": flat, "next_observations": flat + [1, 1, 0, 1], "actions": t,
            "rewards": np.zeros((3, 1)), "terminals": np.zeros((3, 1), bool)}
    buf = HERReplayBuffer(2, one, 50, Spec(), seed=0, name=name)
    buf.add_path(path)
    rows = buf.sample_transitions(500)["observations"]
    relabelled = rows[:, 2] != 9
    assert (rows[relabelled, 2] > rows[relabelled, 3]).all()  # desired goal: a later achieved one
    with pytest.raises(ValueError, match="do not match"):
        buf.add_path({**path, "observations": flat[:, :3]})
    other = pickle.loads(pickle.dumps(buf))  # carries the name and the reward_fn (if it pickles)
    assert other.n_transitions_stored == 3 + 2 * 2
    plain = HERReplayBuffer.attach(name)
    with pytest.raises(ValueError, match="reward_fn"):
        plain.add_path(path)
    assert plain.sample_transitions(3)["observations"].shape == (3, 4)
    plain.close(), other.close()
    buf.clear()


def test_her_rows_evict_fifo_like_any_path(name):
    buf = HERReplayBuffer(4, lambda a, d, i: 0.0, 10, None, seed=0, name=name)
    buf.add_path(her_path(3))  # 3 + 8 rows: the first relabelled row goes
    assert buf.n_transitions_stored == 10
    buf.add_path(her_path(3))
    assert buf.n_transitions_stored == 10
    assert len(max((buf.sample_path() for _ in range(200)), key=lambda p: len(p["actions"]))["actions"]) == 3
    buf.clear()


# -- ReplayBuffer (episode slots) ---------------------------------------------------------------

def test_episode_slots_fill_fifo_and_wrap_correctly(name):
    buf = ReplayBuffer(None, 3, 1, seed=0, name=name)
    buf.add_transitions(observation=[1, 2])
    assert not buf.full and buf.n_transitions_stored == 2
    buf.add_transitions(observation=[3, 4])  # straddles the end: garage's shape-mismatch bug
    assert buf.full and buf.n_transitions_stored == 3
    for pair in ([5, 6], [7, 8]):
        buf.add_transitions(observation=pair)
    assert set(buf.sample(200)["observation"].tolist()) == {6, 7, 8}
    with pytest.raises(KeyError, match="observation"):
        buf.add_transition(action=1)
    buf.unlink(), buf.close()


def test_episodes_commit_at_the_horizon_and_sample_a_step_uniformly(name):
    buf = ReplayBuffer(None, 8, 4, seed=0, name=name)
    for t in range(3):
        buf.add_transition(observation=np.array([t, t]), reward=float(t))
    assert buf.n_transitions_stored == 0 and buf.name is None  # still in this handle's cache
    with pytest.raises(ValueError):
        buf.sample(1)
    buf.add_transition(observation=np.array([3, 3]), reward=3.0)
    assert buf.n_transitions_stored == 4
    s = buf.sample(4000)
    assert s["observation"].shape == (4000, 2) and s["reward"].shape == (4000,)
    assert (s["observation"][:, 0] == s["reward"]).all()
    assert np.allclose(np.bincount(s["reward"].astype(int)) / 4000, 0.25, atol=0.04)
    other = pickle.loads(pickle.dumps(buf))
    assert other.n_transitions_stored == 4 and not other.full
    other.close()
    buf.unlink(), buf.close()


def test_sample_timesteps_needs_garage_and_says_so(name):
    import importlib.util

    from shmbuf.compat.garage import PathBuffer

    buf = PathBuffer(20, name=name, seed=0)
    buf.add_path({"observations": np.zeros((3, 2)), "next_observations": np.ones((3, 2)),
                  "actions": np.zeros((3, 1)), "rewards": np.arange(3.0)[:, None],
                  "terminals": np.array([[False], [False], [True]])})
    if importlib.util.find_spec("garage") is None:
        with pytest.raises(ImportError, match="TimeStepBatch.*pip install garage, or call sample_transitions"):
            buf.sample_timesteps(4)
    else:
        b = buf.sample_timesteps(4)
        assert b.rewards.shape == (4,) and len(b.step_types) == 4
    buf.unlink()
    buf.close()


@pytest.mark.parametrize("kind", ["PathBuffer", "HERReplayBuffer", "ReplayBuffer"])
def test_each_pickles_before_its_first_path_and_the_copies_share_one_buffer(name, kind):
    import pickle

    from shmbuf.compat.garage import paths as garage

    def reward_fn(achieved, desired, info):
        return 0.0

    make = {"PathBuffer": lambda: garage.PathBuffer(50, seed=0),
            "HERReplayBuffer": lambda: garage.HERReplayBuffer(2, _zero_reward, 50, None, seed=0),
            "ReplayBuffer": lambda: garage.ReplayBuffer(None, 12, 3, seed=0)}[kind]
    buf = make()
    copy = pickle.loads(pickle.dumps(buf))  # (as a snapshot, or a worker, before the first path)
    assert copy.name == buf.name is not None and copy.n_transitions_stored == 0
    if kind == "ReplayBuffer":
        for pair in ([1, 2], [3, 4], [5, 6]):
            copy.add_transitions(observation=pair)
    elif kind == "HERReplayBuffer":
        goals = {"observation": np.zeros((3, 2)), "achieved_goal": [[0.], [1.], [2.]],
                 "desired_goal": np.full((3, 1), 9.)}
        copy.add_path({"observations": goals, "next_observations": goals, "actions": np.zeros((3, 1)),
                       "rewards": -np.ones((3, 1)), "terminals": np.zeros((3, 1), bool)})
    else:
        copy.add_path({"observations": np.zeros((3, 2)), "actions": np.zeros((3, 1))})
    assert buf.n_transitions_stored == copy.n_transitions_stored > 0  # the copy's path, seen here
    again = pickle.loads(pickle.dumps(buf))  # after the first path: pickles as its name (attaches)
    assert again.n_transitions_stored == buf.n_transitions_stored
    again.close()
    buf.unlink()
    copy.close(), buf.close()


def _zero_reward(achieved, desired, info):
    return 0.0


def _garages_segments(capacity, lengths):
    """garage's own bookkeeping of PathBuffer._path_segments (its add_path at 2d59480),
    re-stated: each new path's segments drop the oldest paths they overlap. One fix:
    garage compares the new segments with the oldest path's first segment only, so a path
    that started exactly at the end of the ring (first segment empty) keeps its segments
    after its rows were overwritten (sample_path could then return rows of other paths);
    here, as in the facade, both of its segments count."""
    segments, first = collections.deque(), 0

    def overlap(a, b):
        return a.start < b.stop and b.start < a.stop if len(a) and len(b) else False

    for n in lengths:
        end = first + n
        new = (range(first, capacity), range(0, end - capacity)) if end > capacity else (range(first, end), range(0, 0))
        while segments and any(overlap(a, b) for a in new for b in segments[0]):
            segments.popleft()
        segments.append(new)
        first = new[1].stop if new[1].stop != 0 else new[0].stop
    return list(segments), first


def test_garages_private_attributes_are_read_only_views_that_follow_its_bookkeeping(name):
    """_buffer, _path_segments, _first_idx_of_next_path and _transitions_stored as
    garage's (its tests read them): after every path of a random run, the same segments
    as garage's own bookkeeping; _buffer shows the rows and refuses writes."""
    buf = PathBuffer(10, seed=0, name=name)
    assert buf._buffer == {} and not buf._path_segments
    rng = np.random.default_rng(0)
    lengths, t = [], 0
    for _ in range(40):
        n = int(rng.integers(1, 6))
        lengths.append(n)
        buf.add_path({"obs": np.arange(t, t + n)[:, None]})
        t += n
        segments, first = _garages_segments(10, lengths)
        assert list(buf._path_segments) == segments
        assert buf._first_idx_of_next_path == first
        assert buf._transitions_stored == min(t, 10)
    last = buf._path_segments[-1]
    rows = [buf._buffer["obs"][i, 0] for seg in last for i in seg]
    assert rows == list(range(t - lengths[-1], t))
    with pytest.raises(ValueError, match="read-only"):
        buf._buffer["obs"][0] = 1
    buf.clear()
    assert buf._buffer == {} and not buf._path_segments

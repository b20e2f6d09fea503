"""shmbuf.compat.fishyrl, called as fishyrl's users call SequentialBuffer (seed-semantics 1.2)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from shmbuf.compat.fishyrl import SequentialBuffer, convert_samples_to_tensors

import helpers


def step(t):
    return {"obs": np.array([t, t]), "reward": np.float32(t)}


def test_the_schema_and_the_segment_come_with_the_first_add(name):
    buf = SequentialBuffer(5, name=name, seed=0)
    assert buf.name is None and buf.size == 0 and not buf.is_full
    early = pickle.loads(pickle.dumps(buf))  # pickled before the first add: the name is fixed now
    assert early.name == buf.name == name
    with pytest.raises(ValueError):
        buf.sample(1, 1)
    buf.add({"obs": np.array([1, 2], np.int64), "reward": 0.5})
    assert buf.name == name and buf.size == 1 and early.size == 1  # (the copy finds the segment)
    early.close()
    buf.add({"obs": np.array([2.7, 3.2]), "reward": 1})  # cast into the first step's dtypes
    s = buf.sample(20, 1)
    assert s["obs"].dtype == np.int64 and s["obs"].shape == (20, 1, 2)
    assert {tuple(r) for r in s["obs"][:, 0].tolist()} <= {(1, 2), (2, 3)}
    with pytest.raises(ValueError, match="Key 'x' not common between experience and buffer."):
        buf.add({"obs": np.zeros(2), "reward": 1.0, "x": 1})
    with pytest.raises(ValueError, match="Key 'reward' not common"):
        buf.add({"obs": np.zeros(2)})
    with pytest.raises(ValueError, match="'obs'"):
        buf.add({"obs": np.array([np.nan, 0]), "reward": 1.0})
    assert buf.size == 2
    buf.reset()  # forgets keys: the next add may bring others
    assert buf.name is None and buf.size == 0
    buf.add({"other": np.zeros(3)})
    assert list(buf.sample(1, 1)) == ["other"]
    buf.reset()


def test_windows_are_consecutive_never_join_newest_to_oldest(name):
    with SequentialBuffer(5, seed=1, name=name) as buf:
        for t in range(7):
            buf.add(step(t))
        assert buf.size == 5 and buf.is_full  # (fishyrl's is_full is False here: fixed)
        w = buf.sample(300, 3)["reward"]
        assert {tuple(x) for x in w.tolist()} == {(2, 3, 4), (3, 4, 5), (4, 5, 6)}
        assert len({tuple(x) for x in buf.sample(50, 5)["reward"].tolist()}) == 1  # size == L: one window
        with pytest.raises(ValueError):
            buf.sample(1, 6)
        buf.reset()


def test_state_dict_round_trip_gives_identical_samples(name):
    a = SequentialBuffer(8, seed=3, name=name)
    for t in range(11):
        a.add(step(t))
    a.sample(4, 2)
    sd = a.state_dict()
    assert sd["_buffer"]["data"]["reward"] is not a._core.engine.ring.arrays["reward"]  # copies
    expected = [a.sample(6, 3)["reward"].tolist() for _ in range(3)]
    b = SequentialBuffer(8, seed=99, name=name + "b")
    b.load_state_dict(sd)
    assert [b.sample(6, 3)["reward"].tolist() for _ in range(3)] == expected
    assert b.size == 8 and b.is_full
    a.reset()
    b.reset()


@pytest.mark.timeout(120)
def test_another_process_adds_by_name_while_this_one_samples(name):
    buf = SequentialBuffer(64, seed=0, name=name)
    try:
        buf.add(step(999))
        again = pickle.loads(pickle.dumps(buf))
        assert again.name == name
        again.close()

        def check():
            if buf.size < 4:
                return 0
            s = buf.sample(16, 4)
            r = s["reward"]
            assert (np.diff(r, axis=1) == 1).all()  # consecutive steps, in order
            assert (s["obs"][..., 0] == r).all()  # whole rows
            return 16
        size, checked = helpers.check_while_child_writes(helpers.fishyrl_adder, (name, 500), check)
        assert size == 64 and buf.size == 64 and checked > 0
    finally:
        buf.reset()


@pytest.mark.extras
def test_convert_samples_to_tensors_shares_memory():
    torch = pytest.importorskip("torch", reason="torch is an optional extra")
    s = {"obs": np.zeros((2, 3, 4), np.float32), "done": np.zeros((2, 3), bool)}
    t = convert_samples_to_tensors(s)
    t["obs"][0, 0, 0] = 5
    assert s["obs"][0, 0, 0] == 5 and t["done"].dtype == torch.bool
    assert convert_samples_to_tensors(s, dtype=torch.float64)["done"].dtype == torch.float64


from shmbuf.compat.fishyrl import IndependentVectorizedBuffer  # noqa: E402


def env_steps(buf, ts, envs=3):
    for t in ts:
        buf.add({"obs": np.array([[1000 * e + t] for e in range(envs)]), "done": np.zeros(envs, bool)})


def test_vectorized_sequences_never_mix_envs_and_split_at_random(name):
    with IndependentVectorizedBuffer(3, 10, seed=0, name=name) as buf:
        assert buf.name is None
        env_steps(buf, range(12))  # each env wraps its own 10 steps
        assert buf.size == 30
        seen = set()
        for _ in range(20):
            s = buf.sample(9, sequence_length=3)["obs"][..., 0]
            assert s.shape == (9, 3) and (np.diff(s, axis=1) == 1).all()  # one env, in order
            envs = s[:, 0] // 1000
            assert (np.diff(envs) >= 0).all()  # grouped in env order
            seen.add(tuple(np.bincount(envs, minlength=3)))
            assert (s % 1000 >= 2).all()  # the newest 10 steps of each env
        assert len(seen) > 1  # the split varies from call to call
        with pytest.warns(UserWarning, match="not divisible"):
            assert len(buf.sample(7)["obs"]) == 7  # not actually rounded down (as fishyrl)
        buf.reset()


def test_vectorized_mask_sends_rows_in_order_to_the_selected_envs(name):
    with IndependentVectorizedBuffer(3, 4, seed=0, name=name) as buf:
        buf.add({"obs": np.array([[0], [0], [0]]), "done": np.zeros(3, bool)})
        buf.add({"obs": np.array([[1], [2]]), "done": np.zeros(2, bool)}, mask=[False, True, True])
        with pytest.raises(ValueError, match="fewer rows"):
            buf.add({"obs": np.array([[1]]), "done": np.zeros(1, bool)}, mask=[True, True, False])
        lanes = buf._core.lane_sizes()
        assert lanes == [1, 2, 2]
        assert sorted(buf._core.sample_sequences(50, 2, lane=1)["obs"][:, 1, 0].tolist())[0] == 1
        assert set(buf._core.sample_sequences(50, 2, lane=2)["obs"][:, 1, 0].tolist()) == {2}
        buf.reset()


def test_vectorized_state_dict_round_trip(name):
    a = IndependentVectorizedBuffer(2, 8, seed=4, name=name)
    env_steps(a, range(11), envs=2)
    sd = a.state_dict()
    expected = [a.sample(6, sequence_length=2)["obs"].tolist() for _ in range(3)]
    b = IndependentVectorizedBuffer(2, 8, seed=77, name=name + "b")
    b.load_state_dict(sd)
    assert [b.sample(6, sequence_length=2)["obs"].tolist() for _ in range(3)] == expected
    a.reset()
    b.reset()


@pytest.mark.timeout(120)
def test_vectorized_another_process_adds_by_name(name):
    buf = IndependentVectorizedBuffer(2, 32, seed=0, name=name)
    try:
        buf.add({"obs": np.array([[-1], [999]])})

        def check():
            if buf.size < 4:  # every env holds a window of 2 from here on
                return 0
            s = buf.sample(8, sequence_length=2)["obs"][..., 0]
            assert (np.diff(s, axis=1) == 1).all()
            return 8
        size, checked = helpers.check_while_child_writes(helpers.fishyrl_vector_adder, (name, 300), check)
        assert size == 64 and checked > 0
    finally:
        buf.reset()


def test_capacity_and_the_abstract_base():
    from shmbuf.compat.fishyrl import Buffer, IndependentVectorizedBuffer

    buf = SequentialBuffer(7, seed=0)
    assert buf.capacity == 7 and isinstance(buf, Buffer)
    assert isinstance(IndependentVectorizedBuffer(2, 5), Buffer)
    with pytest.raises(TypeError):
        Buffer()  # abstract, as fishyrl's


def test_without_validate_keys_new_and_missing_keys_are_tolerated(name):
    buf = SequentialBuffer(6, validate_keys=False, seed=0, name=name)
    buf.add({"obs": np.full(2, 0.0)})
    buf.add({"obs": np.full(2, 1.0), "reward": np.float32(5)})  # a new key: the buffer widens
    assert buf.name == name and set(buf.sample(1)) == {"obs", "reward"}
    buf.add({"reward": np.float32(7)})  # a missing key: zeros
    s = buf.sample(200, 3)
    assert s["obs"][0, :, 0].tolist() == [0, 1, 0] and s["reward"][0].tolist() == [0, 5, 7]
    assert buf.size == 3 and buf.capacity == 6
    other = SequentialBuffer.attach(name)  # (attached after the widening: it has both keys)
    assert set(other.sample(1)) == {"obs", "reward"}
    other.close()
    buf.reset()
    strict = SequentialBuffer(6, seed=0)
    strict.add({"obs": np.zeros(2)})
    with pytest.raises(ValueError, match="Key 'reward' not common between experience and buffer."):
        strict.add({"obs": np.zeros(2), "reward": 1.0})
    strict.reset()

"""state_dict/load_state_dict, clear, from_data, pickling."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import shmbuf


def test_state_dict_round_trip_gives_identical_samples(name):
    fields = {"x": ((2,), "float32"), "t": ((), "int64")}
    with shmbuf.Buffer.create(fields, 16, lanes=2, name=name, seed=5) as a:
        for i in range(20):
            a.add({"x": [i, -i], "t": i}, lane=i % 2)
        a.sample(3)
        state = a.state_dict()
        assert state["data"]["t"] is not a.engine.ring.arrays["t"]  # a copy, not a view
        expected = [a.sample(10)["t"].tolist() for _ in range(3)] + [a.sample_sequences(4, 3)["t"].tolist()]
        with shmbuf.Buffer.create(fields, 16, lanes=2, name=name + "b", seed=99) as b:
            b.load_state_dict(state)
            got = [b.sample(10)["t"].tolist() for _ in range(3)] + [b.sample_sequences(4, 3)["t"].tolist()]
            assert got == expected
            assert len(b) == len(a) and b.lane_sizes() == a.lane_sizes()
            b.add({"x": [0, 0], "t": 100}, lane=0)  # writes continue from the restored heads
            assert b.sample_sequences(1, 8, )["t"].shape == (1, 8)


def test_load_state_dict_rejects_other_shapes(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name) as a, \
            shmbuf.Buffer.create({"x": ((), "int64")}, 16, name=name + "b") as b:
        a.add({"x": 1})
        with pytest.raises(ValueError, match="capacity=8"):
            b.load_state_dict(a.state_dict())
        with pytest.raises(ValueError, match="not a shmbuf state_dict"):
            b.load_state_dict({"x": 1})
        assert len(b) == 0


def test_clear(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name) as buf:
        buf.extend({"x": np.arange(4)})
        buf.clear()
        assert len(buf) == 0 and not buf.is_full
        with pytest.raises(ValueError, match="empty"):
            buf.sample(1)
        buf.extend({"x": np.array([7, 8])})
        assert set(buf.sample(100)["x"].tolist()) == {7, 8}
        assert buf.sample_sequences(5, 2)["x"].tolist() == [[7, 8]] * 5


def test_from_data_follows_imitation_code(name):
    data = {"a": np.arange(6, dtype=np.int16), "b": np.ones((6, 2), np.float32)}
    with shmbuf.Buffer.from_data(data, name=name) as buf:
        assert buf.capacity == 6 and buf.is_full
        assert buf.fields == {"a": ((), np.dtype("int16")), "b": ((2,), np.dtype("float32"))}
        assert buf.engine.ring.arrays["a"] is not data["a"]
    with pytest.raises(ValueError, match="truncate_ok=True"):
        shmbuf.Buffer.from_data(data, capacity=4, name=name)
    with shmbuf.Buffer.from_data(data, capacity=4, truncate_ok=True, name=name) as buf:
        assert sorted(set(buf.sample(200)["a"].tolist())) == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="no keys"):
        shmbuf.Buffer.from_data({})
    with pytest.raises(ValueError, match="same number of rows"):
        shmbuf.Buffer.from_data({"a": np.arange(3), "b": np.arange(4)})


def test_pickles_as_its_name(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name) as buf:
        data = pickle.dumps(buf)
        assert len(data) < 200  # a name, not the contents
        buf.add({"x": 9})
        other = pickle.loads(data)
        assert other.name == name and other.sample(1)["x"][0] == 9
        other.close()
    with pytest.raises(FileNotFoundError):
        pickle.loads(data)


def test_closed_handle(name):
    buf = shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name)
    buf.close()
    buf.close()
    assert buf.closed and "closed" in repr(buf)
    for use in (lambda: buf.add({"x": 1}), lambda: buf.sample(1), lambda: len(buf),
                lambda: buf.sample_sequences(1, 1), buf.clear):
        with pytest.raises(ValueError, match=f"handle of buffer {name!r} is closed"):
            use()

"""sample and sample_sequences: uniformity, alignment, out=, seeds, windows, lanes."""

from __future__ import annotations

import numpy as np
import pytest

import shmbuf


def test_empty_buffer_raises(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name) as buf:
        with pytest.raises(ValueError, match="empty buffer"):
            buf.sample(1)
        with pytest.raises(ValueError, match="empty buffer"):
            buf.sample_sequences(1, 1)


def test_zero_and_oversized_samples(name):
    with shmbuf.Buffer.create({"x": ((2,), "int64")}, 8, name=name) as buf:
        buf.extend({"x": np.arange(6).reshape(3, 2)})
        assert buf.sample(0)["x"].shape == (0, 2)
        big = buf.sample(1000)["x"]
        assert big.shape == (1000, 2)
        assert {tuple(r) for r in big.tolist()} == {(0, 1), (2, 3), (4, 5)}


def test_rows_aligned_across_fields_and_dtypes_kept(name):
    fields = {"a": ((3,), "float32"), "b": ((), "int16"), "c": ((2, 2), "uint8"), "d": ((), bool)}
    with shmbuf.Buffer.create(fields, 50, name=name, seed=3) as buf:
        k = np.arange(50)
        buf.extend({"a": np.repeat(k[:, None], 3, 1), "b": k, "c": np.broadcast_to(k[:, None, None], (50, 2, 2)),
                    "d": k % 2 == 0})
        s = buf.sample(500)
        assert {v.dtype for v in s.values()} == {np.dtype(t) for _, t in fields.values()}
        key = s["b"]
        assert (s["a"] == key[:, None]).all() and (s["c"] == key[:, None, None]).all()
        assert (s["d"] == (key % 2 == 0)).all()


def test_uniform_over_rows(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 10, name=name, seed=0) as buf:
        buf.extend({"x": np.arange(3)})
        buf.extend({"x": np.arange(3, 13)})  # rows 3..12 survive
        counts = np.bincount(buf.sample(100_000)["x"], minlength=13)
        assert counts[:3].sum() == 0
        assert counts[3:].min() > 9_000 and counts[3:].max() < 11_000


def test_out_is_filled_in_place(name):
    with shmbuf.Buffer.create({"x": ((2,), "float32"), "y": ((), "int64")}, 10, name=name) as buf:
        buf.extend({"x": np.ones((5, 2)), "y": np.arange(5)})
        out = buf.empty_batch(7)
        res = buf.sample(7, out=out)
        assert res is out and set(out["y"].tolist()) <= set(range(5))
        seq_out = buf.empty_batch(3, 4)
        assert buf.sample_sequences(3, 4, out=seq_out)["y"].shape == (3, 4)
        assert all((np.diff(r) == 1).all() for r in seq_out["y"])
        with pytest.raises(ValueError, match=r"out\['x'\]: expected .* shape \(7, 2\)"):
            buf.sample(7, out={"x": np.empty((7, 3), np.float32), "y": np.empty(7, np.int64)})
        with pytest.raises(ValueError, match="dtype float32"):
            buf.sample(7, out={"x": np.empty((7, 2), np.float64), "y": np.empty(7, np.int64)})
        with pytest.raises(ValueError, match="missing field"):
            buf.sample(7, out={"x": np.empty((7, 2), np.float32)})


def test_out_in_another_key_order(name):
    with shmbuf.Buffer.create({"a": ((), "int64"), "b": ((), "int64")}, 10, name=name) as buf:
        buf.extend({"a": np.arange(10), "b": np.arange(10) * 10})
        out = {"b": np.empty(50, np.int64), "a": np.empty(50, np.int64)}
        buf.sample(50, out=out)
        assert (out["b"] == out["a"] * 10).all()
        seq = {"b": np.empty((5, 3), np.int64), "a": np.empty((5, 3), np.int64)}
        buf.sample_sequences(5, 3, out=seq)
        assert (seq["b"] == seq["a"] * 10).all()


def test_same_seed_same_samples(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 100, name=name, seed=42) as a:
        a.extend({"x": np.arange(100)})
        b = shmbuf.Buffer.attach(name, seed=42)
        assert a.sample(50)["x"].tolist() == b.sample(50)["x"].tolist()
        assert a.sample_sequences(5, 4)["x"].tolist() == b.sample_sequences(5, 4)["x"].tolist()
        c = shmbuf.Buffer.attach(name, seed=7)
        assert a.sample(50)["x"].tolist() != c.sample(50)["x"].tolist()
        b.close(), c.close()


@pytest.mark.parametrize("bad", [-1, 1.5, True, None])
def test_bad_sample_sizes(name, bad):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name) as buf:
        buf.add({"x": 1})
        with pytest.raises((TypeError, ValueError), match="n must be"):
            buf.sample(bad)


def test_sequences_never_cross_the_write_head(name):
    """fishyrl's verified example: capacity 5, steps 0..6, length 3."""
    with shmbuf.Buffer.create({"t": ((), "int64")}, 5, name=name, seed=0) as buf:
        for t in range(7):
            buf.add({"t": t})
        windows = {tuple(w) for w in buf.sample_sequences(2000, 3)["t"].tolist()}
        assert windows == {(2, 3, 4), (3, 4, 5), (4, 5, 6)}
        assert buf.sample_sequences(10, 5)["t"].tolist() == [[2, 3, 4, 5, 6]] * 10
        with pytest.raises(ValueError, match="3 consecutive rows"):
            shmbuf.Buffer.from_data({"t": np.arange(2)}).sample_sequences(1, 3)
        with pytest.raises(ValueError, match="length <= 5"):
            buf.sample_sequences(1, 6)


def test_lanes_keep_their_own_order(name):
    with shmbuf.Buffer.create({"t": ((), "int64"), "w": ((), "int64")}, 12, lanes=3, name=name,
                              seed=0) as buf:
        assert buf.lane_capacity == 4
        for step in range(6):  # interleaved writes from three "writers"
            for lane in range(3):
                buf.add({"t": step, "w": lane}, lane=lane)
        assert buf.lane_sizes() == [4, 4, 4] and len(buf) == 12 and buf.is_full
        seqs = buf.sample_sequences(600, 3)
        assert (seqs["w"] == seqs["w"][:, :1]).all(), "a window mixed lanes"
        assert {tuple(r) for r in seqs["t"].tolist()} == {(2, 3, 4), (3, 4, 5)}
        assert set(np.unique(seqs["w"]).tolist()) == {0, 1, 2}
        flat = buf.sample(3000)
        assert set(zip(flat["w"].tolist(), flat["t"].tolist())) == {
            (w, t) for w in range(3) for t in range(2, 6)}


def test_sample_is_uniform_over_unequal_lanes(name):
    with shmbuf.Buffer.create({"w": ((), "int64")}, 20, lanes=2, name=name, seed=1) as buf:
        buf.extend({"w": np.zeros(9, np.int64)}, lane=0)
        buf.extend({"w": np.ones(1, np.int64)}, lane=1)
        share = buf.sample(20_000)["w"].mean()
        assert 0.08 < share < 0.12  # 1 row of 10
        # windows of 2 exist only in lane 0
        assert (buf.sample_sequences(100, 2)["w"] == 0).all()


def test_auto_and_explicit_lane_claims(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 6, lanes=3, name=name) as a:
        b = shmbuf.Buffer.attach(name)
        c = shmbuf.Buffer.attach(name)
        b.add({"x": 1})  # claims a lane by itself
        assert b.lane == 0
        with c.writer() as w:
            assert w.lane == 1
            w.extend({"x": np.array([5, 6])})
        assert c.lane is None  # released
        assert a.claim_lane() == 1
        with pytest.raises(RuntimeError, match="claimed by live process"):
            c.claim_lane(0)
        assert c.claim_lane() == 2
        with pytest.raises(RuntimeError, match="all 3 lanes are claimed"):
            shmbuf.Buffer.attach(name).claim_lane()
        assert a.lane_sizes() == [1, 2, 0]
        b.close()
        assert shmbuf.Buffer.attach(name).claim_lane() == 0  # closing released it
        c.close()


@pytest.mark.both_storages
def test_sequences_of_one_lane_only_even_past_a_writer_stopped_mid_write(name, tmp_path):
    import os
    import signal

    from helpers import start_hanging_writer

    with shmbuf.Buffer.create({"x": ((), "int64")}, 40, lanes=2, name=name, seed=0) as buf:
        buf.extend({"x": np.arange(100, 110)}, lane=0)
        buf.extend({"x": np.arange(8)}, lane=1)
        proc = start_hanging_writer(name, "writing", tmp_path, lane=1, rows=4)  # 4 rows reserved, unpublished
        try:
            buf.extend({"x": np.arange(20, 26)}, lane=1)  # after them
            got = buf.sample_sequences(300, 2, lane=1)["x"]
            assert set(got.ravel().tolist()) <= set(range(8)) | set(range(20, 26))  # lane 1, published
            assert (np.diff(got, axis=1) == 1).all()  # never across the unpublished rows
            assert set(buf.sample_sequences(50, 3, lane=0)["x"].ravel().tolist()) <= set(range(100, 110))
            with pytest.raises(ValueError, match="lane 0 holds 10 rows"):
                buf.sample_sequences(1, 11, lane=0)
            with pytest.raises(ValueError, match="lane must be"):
                buf.sample_sequences(1, 1, lane=2)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(30)

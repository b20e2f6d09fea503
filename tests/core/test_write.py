"""add/extend: FIFO order, truncation, and validation that leaves the buffer unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import shmbuf

from conftest import MUJOCO


def contents(buf):
    """All current rows in write order (single lane), via a full-length sequence."""
    return buf.sample_sequences(1, len(buf))


def test_fifo_overwrites_oldest(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name) as buf:
        buf.extend({"x": np.array([0, 1, 2])})
        buf.extend({"x": np.array([3, 4, 5])})
        assert len(buf) == 4 and buf.is_full
        assert contents(buf)["x"].tolist() == [[2, 3, 4, 5]]
        # physical layout as in imitation's verified example: [4, 5, 2, 3]
        assert buf.engine.ring.arrays["x"].tolist() == [4, 5, 2, 3]
        for v in range(6, 20):
            buf.add({"x": v})
        assert contents(buf)["x"].tolist() == [[16, 17, 18, 19]]


def test_truncate_ok_keeps_last_capacity_rows(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name) as buf:
        buf.extend({"x": np.arange(3)})
        buf.extend({"x": np.arange(3, 6)})
        buf.extend({"x": np.arange(100, 110)}, truncate_ok=True)
        assert contents(buf)["x"].tolist() == [[106, 107, 108, 109]]
        assert buf.engine.ring.arrays["x"].tolist() == [108, 109, 106, 107]  # imitation's example
        with pytest.raises(ValueError, match="truncate_ok=True"):
            buf.extend({"x": np.arange(5)})
        assert contents(buf)["x"].tolist() == [[106, 107, 108, 109]]


def test_add_and_extend_shapes(name):
    with shmbuf.Buffer.create(MUJOCO, 10, name=name, seed=1) as buf:
        buf.add({"obs": np.arange(17), "action": [0.5] * 6, "reward": 2, "done": True})
        buf.extend({"obs": np.ones((2, 17)), "action": np.zeros((2, 6), np.float64),
                    "reward": [1.0, 2.0], "done": [False, True]})
        s = buf.sample_sequences(1, 3)
        assert s["obs"].dtype == np.float32 and s["obs"].shape == (1, 3, 17)
        assert s["obs"][0, 0].tolist() == list(range(17))
        assert s["reward"][0].tolist() == [2.0, 1.0, 2.0]
        assert s["done"][0].tolist() == [True, False, True]


def test_values_are_copied_in(name):
    with shmbuf.Buffer.create({"x": ((3,), "int64")}, 4, name=name) as buf:
        src = np.arange(6).reshape(2, 3)
        buf.extend({"x": src})
        src[:] = -1
        assert contents(buf)["x"][0].tolist() == [[0, 1, 2], [3, 4, 5]]


BAD_BATCHES = [
    ({"obs": np.zeros((2, 17)), "action": np.zeros((2, 6)), "reward": np.zeros(2)},
     ValueError, r"missing field\(s\) \['done'\]"),
    ({"obs": np.zeros((2, 17)), "action": np.zeros((2, 6)), "reward": np.zeros(2),
      "done": np.zeros(2, bool), "extra": np.zeros(2)}, ValueError, r"unexpected field\(s\) \['extra'\]"),
    ({"obs": np.zeros((2, 17)), "action": np.zeros((3, 6)), "reward": np.zeros(2),
      "done": np.zeros(2, bool)}, ValueError, "same number of rows"),
    ({"obs": np.zeros((0, 17)), "action": np.zeros((0, 6)), "reward": np.zeros(0),
      "done": np.zeros(0, bool)}, ValueError, "at least one row"),
    ({"obs": np.zeros((2, 16)), "action": np.zeros((2, 6)), "reward": np.zeros(2),
      "done": np.zeros(2, bool)}, ValueError, r"field 'obs': expected shape \(n, 17\).*got \(2, 16\)"),
    ({"obs": np.zeros(17), "action": np.zeros(6), "reward": 0.0, "done": False},
     ValueError, r"field 'obs': expected shape \(n, 17\)"),
    ({"obs": np.zeros((2, 17)), "action": np.zeros((2, 6)), "reward": np.zeros(2),
      "done": np.zeros(2, np.int64)}, TypeError, "cannot store int64 values in a bool field"),
    ({"obs": np.zeros((2, 17), complex), "action": np.zeros((2, 6)), "reward": np.zeros(2),
      "done": np.zeros(2, bool)}, TypeError, "field 'obs'"),
    ([1, 2], TypeError, "mapping"),
    ({"obs": np.zeros((2, 17)), "action": np.zeros((2, 6)), "reward": np.zeros(2),
      "done": np.zeros(2, bool), "extra": np.zeros(2)}, ValueError, "unexpected"),
]


def test_integers_that_fit_are_accepted_and_overflow_is_not(name):
    with shmbuf.Buffer.create({"u": ((), "uint8"), "i": ((), "int8")}, 4, name=name) as buf:
        buf.add({"u": 255, "i": -128})
        buf.extend({"u": np.array([0, 7]), "i": np.array([127, 0], np.int64)})
        with pytest.raises(ValueError, match=r"values from 0 to 300 do not fit in int8"):
            buf.extend({"u": np.array([1, 2]), "i": np.array([0, 300])})
        with pytest.raises(ValueError, match="do not fit in uint8"):
            buf.add({"u": -1, "i": 0})
        assert len(buf) == 3 and buf.sample_sequences(1, 3)["i"].tolist() == [[-128, 127, 0]]


CASTS = [  # (values, their dtype, the field's dtype): the casts gymnasium's values need
    ([0.5, -1e30, 3.4e38, np.nan, np.inf], "float64", "float32"),
    ([0.25, -2.5], "float32", "float64"),
    ([-(2 ** 31), 2 ** 31 - 1, 7], "int64", "int32"),
    ([0, 255], "int64", "uint8"),
    ([-5, 2 ** 62, 3], "int64", "float32"),
    ([-5, 2 ** 53 + 1], "int64", "float64"),
    ([0, 65535], "uint16", "int32"),
    ([True, False], "bool", "float32"),
    ([True, False], "bool", "int64"),
    ([-128, 127], "int8", "int64"),
]
REFUSED = [  # the second value would not survive its cast: an error, nothing written
    ([0.5, 1e39], "float64", "float32", ValueError, "would become inf"),
    ([0, 2 ** 31], "int64", "int32", ValueError, "wrap around"),
    ([3, -1], "int64", "uint32", ValueError, "wrap around"),
    ([0, 256], "uint16", "uint8", ValueError, "wrap around"),
    ([1.5, 2.0], "float64", "int64", TypeError, "cannot store float64"),
    ([1, 0], "int64", "bool", TypeError, "cannot store int64"),
]


@pytest.mark.parametrize("values, src, dst", CASTS)
def test_common_casts_store_what_numpy_stores(name, values, src, dst):
    """The C write path casts these itself (csrc/cast.c); the Python path with numpy:
    both store exactly ``astype``'s values, for add and extend, scalars and rows."""
    a = np.array(values, src)
    with shmbuf.Buffer.create({"v": ((), dst), "w": ((2,), dst)}, 16, name=name) as buf:
        buf.extend({"v": a, "w": np.stack([a, a], axis=1)})
        for x in a:
            buf.add({"v": x, "w": np.array([x, x])})
        want = np.concatenate([a, a]).astype(dst)
        got = {k: v[:len(want)] for k, v in buf.state_dict()["data"].items()}  # (one lane, in order)
        np.testing.assert_array_equal(got["v"], want)
        np.testing.assert_array_equal(got["w"], np.stack([want, want], axis=1))
        assert got["v"].tobytes() == want.tobytes()  # (NaN payloads and signed zeros too)


@pytest.mark.parametrize("values, src, dst, exc, match", REFUSED)
def test_casts_that_lose_values_are_refused_and_change_nothing(name, values, src, dst, exc, match):
    a = np.array(values, src)
    with shmbuf.Buffer.create({"v": ((), dst)}, 16, name=name) as buf:
        with pytest.raises(exc, match=match):
            buf.extend({"v": a})
        with pytest.raises(exc, match=match):
            buf.add({"v": a[1]})
        assert len(buf) == 0 and buf.total_added == 0


@pytest.mark.parametrize("batch, exc, match", BAD_BATCHES)
def test_bad_extend_changes_nothing(name, batch, exc, match):
    with shmbuf.Buffer.create(MUJOCO, 8, name=name, seed=0) as buf:
        good = {"obs": np.ones((3, 17)), "action": np.ones((3, 6)), "reward": np.arange(3.0),
                "done": np.array([False, False, True])}
        buf.extend(good)
        before = {k: v.copy() for k, v in buf.engine.ring.arrays.items()}
        stamps = buf.engine.ring.stamps.copy()
        with pytest.raises(exc, match=match):
            buf.extend(batch)
        assert len(buf) == 3
        assert np.array_equal(buf.engine.ring.stamps, stamps)
        for k, v in before.items():
            assert np.array_equal(buf.engine.ring.arrays[k], v)
        assert not buf.engine.ring.res_pid.any(), "a failed call left a reservation behind"


@pytest.mark.parametrize("row, match", [
    ({"obs": np.zeros((1, 17)), "action": np.zeros(6), "reward": 0.0, "done": False},
     r"expected one row of shape \(17,\)"),
    ({"obs": np.zeros(17), "action": np.zeros(6), "reward": [0.0], "done": False},
     r"field 'reward': expected one row of shape \(\)"),
    ({"obs": np.zeros(17), "action": np.zeros(6), "reward": 1.0, "done": 1}, "bool field"),
])
def test_bad_add_changes_nothing(name, row, match):
    with shmbuf.Buffer.create(MUJOCO, 8, name=name) as buf:
        with pytest.raises((ValueError, TypeError), match=match):
            buf.add(row)
        assert len(buf) == 0 and not buf.engine.ring.stamps.any()


def test_bad_lane(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, lanes=2, name=name) as buf:
        for lane in (2, -1, 1.0, True):
            with pytest.raises(ValueError, match=r"lane must be an int in \[0, 2\)"):
                buf.add({"x": 1}, lane=lane)
        assert len(buf) == 0


def test_interrupted_write_is_abandoned_not_published(name, set_hook):
    """A writer that fails half-way (here: an exception mid-copy) leaves no valid row."""
    with shmbuf.Buffer.create({"x": ((), "int64"), "y": ((), "int64")}, 8, name=name) as buf:
        buf.extend({"x": np.arange(3), "y": np.arange(3)})

        def boom(point):
            if point == "writing":
                raise KeyboardInterrupt
        set_hook(boom)
        with pytest.raises(KeyboardInterrupt):
            buf.extend({"x": np.arange(3, 5), "y": np.arange(3, 5)})
        set_hook(None)
        assert buf.engine.ring.stamps[3:5].tolist() == [0, 0]
        assert not buf.engine.ring.res_pid.any()
        assert set(buf.sample(200)["x"].tolist()) == {0, 1, 2}
        buf.extend({"x": np.arange(5, 8), "y": np.arange(5, 8)})
        assert set(buf.sample(400)["x"].tolist()) == {0, 1, 2, 5, 6, 7}


def test_prefault_maps_the_pages_once(name):
    import psutil

    me = psutil.Process()
    with shmbuf.Buffer.create({"x": ((1024,), "uint8")}, 64 * 1024, lanes=2, name=name):
        other = shmbuf.Buffer.attach(name)  # 64 MiB, never touched by this process
        rss = me.memory_info().rss
        other.add({"x": np.ones(1024, np.uint8)}, lane=1)  # the first write maps lane 1
        grown = me.memory_info().rss - rss
        assert 30 << 20 < grown < 40 << 20, grown  # half of 64 MiB
        assert list(other.engine.prefaulted) == [0, 1]
        other.prefault()  # now all of it
        assert me.memory_info().rss - rss > 60 << 20
        other.close()


@pytest.mark.parametrize("claimed", [True, False])
def test_add_each_puts_row_i_into_lane_i_and_checks_every_row_first(name, claimed):
    """add_each: one row per lane, the same rows as add() row by row would write (in
    one native call when this process claimed every lane: ``claimed``; else row by
    row); a bad row anywhere raises before any row is written."""
    fields = {"obs": ((3,), "float32"), "reward": ((), "float32"), "done": ((), "bool")}
    with shmbuf.Buffer.create(fields, 12, lanes=4, name=name) as buf:
        lanes = np.array([3, 0, 2], np.int64)
        others = [shmbuf.Buffer.attach(name) for _ in lanes] if claimed else []
        for other, lane in zip(others, lanes.tolist()):  # this process owns those lanes: one native call
            other.claim_lane(lane)
        buf.prefault()
        batch = {"obs": np.arange(9, dtype=np.float32).reshape(3, 3), "reward": np.array([1.0, 2.0, 3.0]),
                 "done": np.array([False, True, False])}
        for _ in range(2):
            buf.add_each(batch, lanes)
        assert buf.lane_sizes() == [2, 0, 2, 2]
        for lane, i in zip(lanes.tolist(), range(3)):
            rows = buf.sample_sequences(1, 2, lane=lane)
            assert rows["obs"][0].tolist() == [batch["obs"][i].tolist()] * 2
            assert rows["reward"][0].tolist() == [batch["reward"][i]] * 2 and rows["done"][0].tolist() == [batch["done"][i]] * 2
        bad = {**batch, "obs": np.array([[0, 0, 0], [0, 0, 0], [np.nan, 0, 0]], object)}
        for wrong in (bad, {**batch, "reward": np.array([1.0, 2.0])}, {"obs": batch["obs"]}):
            with pytest.raises((ValueError, TypeError)):
                buf.add_each(wrong, lanes)
            assert buf.lane_sizes() == [2, 0, 2, 2]  # nothing written
        with pytest.raises(ValueError):
            buf.add_each(batch, [0, 1, 9])  # no lane 9
        assert buf.lane_sizes() == [2, 0, 2, 2]
        for other in others:
            other.close()


# packed fields of sizes around every power of two up to 300 bytes: odd sizes put each
# field at another alignment in the row
COPY_SIZES = (1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 68, 255, 257, 300)


@pytest.mark.parametrize("chunk", [1, 64])
def test_packed_fields_of_every_size_are_written_byte_for_byte(name, chunk):
    """Rows of packed fields of many sizes and alignments, added one or 64 at a time
    through the wrap (the native path prefetches each write's rows and the next's): each
    slot holds exactly the bytes given (a copy that wrote past its field would clobber
    its neighbour's, which are checked too, and the row's padding)."""
    fields = {f"f{k}": ((k,), "uint8") for k in COPY_SIZES}
    rng = np.random.default_rng(chunk)
    cap, total = 200, 456                      # 2.28 laps: every write of 64 from row 192 wraps
    with shmbuf.Buffer.create(fields, cap, name=name) as buf:
        layout = buf.engine.layout
        assert all(f.packed for f in layout.fields)
        data = {k: rng.integers(0, 256, (total, n), dtype=np.uint8) for k, ((n,), _) in fields.items()}
        for lo in range(0, total, chunk):
            if chunk == 1:
                buf.add({k: v[lo] for k, v in data.items()})
            else:
                buf.extend({k: v[lo:lo + chunk] for k, v in data.items()})
        seqs = np.arange(total - cap, total)
        for k, v in data.items():
            assert (buf.engine.ring.arrays[k][seqs % cap] == v[seqs]).all(), k
        rows = np.frombuffer(buf.engine.seg.mmap, np.uint8, cap * layout.row_stride, layout.rows_offset)
        rows = rows.reshape(cap, layout.row_stride)
        ends = sorted((f.offset - layout.rows_offset, f.offset - layout.rows_offset + f.row_bytes)
                      for f in layout.fields)
        assert (rows[:, ends[-1][1]:] == 0).all()  # the row's padding after the last field: untouched

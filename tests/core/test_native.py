"""The two paths (C extension and pure Python) on the same segments, and lanes owned by
one process (written without the lock)."""

from __future__ import annotations

import multiprocessing as mp
import os
import struct

import numpy as np
import pytest

import shmbuf
from shmbuf.core import native, segment
from conftest import MUJOCO, shm_path
from helpers import start_hanging_writer

needs_native = pytest.mark.skipif(not native.available(), reason="needs the C extension")


def _handle(name: str, pure: bool, monkeypatch, seed: int = 0) -> shmbuf.Buffer:
    """A handle on the given path (the path is read when a handle is made)."""
    with monkeypatch.context() as m:
        m.setenv("SHMBUF_PURE_PYTHON", "1" if pure else "")
        buf = shmbuf.Buffer.attach(name, seed=seed)
    assert buf.native is not pure
    return buf


INPUTS = [  # what users pass: exact arrays, lists, Python numbers, other dtypes, numpy scalars
    {"obs": np.arange(17, dtype=np.float32), "action": np.ones(6, np.float32), "reward": 1.5, "done": True},
    {"obs": list(range(17)), "action": np.ones(6), "reward": 2, "done": np.bool_(False)},
    {"obs": np.arange(17.0), "action": np.zeros(6, np.float32), "reward": np.float32(3.25), "done": False},
    {"obs": np.arange(34, dtype=np.float32)[::2], "action": np.ones(6, np.float32), "reward": np.float64(-1e30),
     "done": True},
]


@needs_native
def test_both_paths_store_the_same_bytes_and_draw_the_same_samples(name, monkeypatch):
    made = [shmbuf.Buffer.create(MUJOCO, 40, name=f"{name}-{i}", lanes=2) for i in range(2)]
    try:
        a, b = (_handle(f"{name}-{i}", pure=bool(i), monkeypatch=monkeypatch, seed=7) for i in range(2))
        for buf in (a, b):
            for lane in (0, 1):
                for row in INPUTS * 3:
                    buf.add(row, lane=lane)
                buf.extend({k: np.stack([r[k] for r in INPUTS * 4]).astype(MUJOCO[k][1])
                            for k in MUJOCO}, lane=lane)
                buf.extend({k: np.asarray([r[k] for r in INPUTS]) for k in MUJOCO}, lane=lane)
        ra, rb = a.engine.ring, b.engine.ring
        assert np.array_equal(ra.stamps, rb.stamps) and np.array_equal(ra.lane_table, rb.lane_table)
        for k in MUJOCO:
            assert np.array_equal(ra.arrays[k], rb.arrays[k]), k
        for _ in range(3):
            sa, sb = a.sample(64), b.sample(64)
            qa, qb = a.sample_sequences(8, 5), b.sample_sequences(8, 5)
            for k in MUJOCO:
                assert np.array_equal(sa[k], sb[k]) and np.array_equal(qa[k], qb[k])
        a.close(), b.close()
    finally:
        for buf in made:
            buf.close()


@needs_native
@pytest.mark.parametrize("bad, error", [
    ({"obs": np.zeros(17, np.float32), "action": np.ones(6), "reward": 1.0, "done": 1}, TypeError),
    ({"obs": np.zeros(16, np.float32), "action": np.ones(6), "reward": 1.0, "done": True}, ValueError),
    ({"obs": np.zeros(17, np.float32), "action": np.ones(6), "reward": 1e39, "done": True}, ValueError),
    ({"obs": np.zeros(17, np.float32), "action": np.ones(6), "reward": 1.0}, ValueError),
    ({"obs": np.zeros(17, np.float32), "action": np.ones(6), "reward": 1.5, "done": True, "x": 1}, ValueError),
    ({"obs": np.zeros(17, np.float32), "action": np.ones(6), "reward": "1", "done": True}, TypeError),
    ({"obs": b"\0" * 68, "action": np.ones(6), "reward": 1.0, "done": True}, ValueError),
])
def test_both_paths_refuse_the_same_input_and_write_nothing(name, monkeypatch, bad, error):
    with shmbuf.Buffer.create(MUJOCO, 8, name=name) as owner:
        for pure in (False, True):
            buf = _handle(name, pure, monkeypatch)
            with pytest.raises(error):
                buf.add(bad)
            with pytest.raises((error, ValueError)):
                buf.extend({k: [v] for k, v in bad.items()})
            buf.close()
        assert len(owner) == 0 and not owner.engine.ring.stamps.any()


@needs_native
@pytest.mark.parametrize("writer_pure", [False, True], ids=["native writer", "python writer"])
def test_a_writer_on_one_path_and_a_sampler_on_the_other(name, monkeypatch, writer_pure):
    with shmbuf.Buffer.create({"x": ((3,), "int64"), "t": ((), "int64")}, 16, name=name) as owner:
        w = _handle(name, writer_pure, monkeypatch)
        s = _handle(name, not writer_pure, monkeypatch)
        for t in range(40):
            w.add({"x": [t, t, t], "t": t})
        batch = s.sample(200)
        assert set(batch["t"].tolist()) == set(range(24, 40))
        assert (batch["x"] == batch["t"][:, None]).all()
        seqs = s.sample_sequences(10, 4)["t"]
        assert (np.diff(seqs, axis=1) == 1).all()
        w.close(), s.close()
        assert len(owner) == 16


@needs_native
@pytest.mark.parametrize("start", [2**52 - 9, 2**62 - 50], ids=["around 2**52", "near 2**62"])
def test_both_paths_agree_on_huge_sequence_numbers(name, monkeypatch, start):
    """The native path maps sequence numbers to slots without a division below 2**52
    and with one above: the same slots as Python's % on both sides, wrapping included."""
    made = [shmbuf.Buffer.create({"t": ((), "int64")}, 7, name=f"{name}-{i}") for i in range(2)]
    try:
        for buf in made:  # as if 2**52 rows had been written (a restore renumbers this far)
            buf.engine.ring.lane_table[0, :2] = start
        a, b = (_handle(f"{name}-{i}", pure=bool(i), monkeypatch=monkeypatch, seed=3) for i in range(2))
        for buf in (a, b):
            for t in range(3):
                buf.add({"t": t})
            buf.extend({"t": np.arange(3, 10)})  # laps the ring twice, crossing 2**52
            buf.extend({"t": np.arange(10, 17)})
            buf.add({"t": 17})
        assert np.array_equal(a.engine.ring.stamps, b.engine.ring.stamps)
        assert np.array_equal(a.engine.ring.arrays["t"], b.engine.ring.arrays["t"])
        assert sorted(a.engine.ring.arrays["t"].tolist()) == list(range(11, 18))
        for buf in (a, b):
            assert set(buf.sample(300)["t"].tolist()) == set(range(11, 18))
            assert (np.diff(buf.sample_sequences(20, 3)["t"], axis=1) == 1).all()
        assert np.array_equal(a.sample(64)["t"], b.sample(64)["t"])
        a.close(), b.close()
    finally:
        for buf in made:
            buf.close()


# -- lanes owned by one process ------------------------------------------------------

def _claim_and_wait(name, lane, ready, done):
    buf = shmbuf.Buffer.attach(name)
    buf.claim_lane(lane)
    buf.add({"x": 1})
    ready.set()
    done.wait(60)
    buf.close()


def test_a_lane_claimed_by_a_live_process_refuses_other_writers(name):
    ctx = mp.get_context("fork")
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, lanes=2, name=name) as buf:
        ready, done = ctx.Event(), ctx.Event()
        p = ctx.Process(target=_claim_and_wait, args=(name, 0, ready, done))
        p.start()
        try:
            assert ready.wait(30)
            with pytest.raises(RuntimeError, match=f"lane 0 is claimed by live process {p.pid}"):
                buf.add({"x": 2}, lane=0)
            with pytest.raises(RuntimeError, match=f"lane 0 is claimed by live process {p.pid}"):
                buf.extend({"x": np.arange(3)}, lane=0)
            assert buf.lane_sizes() == [1, 0]  # refused before anything was reserved
            buf.add({"x": 3}, lane=1)  # an unclaimed lane: shared, under the lock
            with pytest.raises(RuntimeError, match="claimed by live processes"):
                buf.load_state_dict(buf.state_dict())
        finally:
            done.set()
            p.join(30)
        assert buf.lane_sizes() == [1, 1]
        buf.load_state_dict(buf.state_dict())  # released on close: restores work again


def test_an_owner_writes_while_the_header_lock_is_held(name):
    """Owners take no lock: a stopped lock holder blocks shared writers only."""
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, lanes=2, name=name) as buf, \
            shmbuf.Buffer.attach(name) as other:
        buf.claim_lane(0)
        with other.engine.lock.hold(5):
            buf.add({"x": 1})
            buf.extend({"x": np.arange(3)})
            with pytest.raises(shmbuf.LockTimeout):
                buf.add({"x": 9}, lane=1, timeout=0.2)
        assert buf.lane_sizes() == [4, 0]


def test_a_dead_owners_half_written_rows_are_never_sampled_and_its_lane_is_claimed_again(name, tmp_path):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, lanes=2, name=name, seed=0) as buf:
        buf.claim_lane(1)  # the writer below gets lane 0
        proc = start_hanging_writer(name, "writing", tmp_path, rows=3)  # claims lane 0, stops mid-copy
        try:
            lt = buf.engine.ring.lane_table
            assert lt[0, 2] == proc.pid and lt[0, 5] == 3  # claimed, a write of 3 rows in flight
            with pytest.raises(RuntimeError, match="claimed by live process"):
                buf.add({"x": 5}, lane=0)
        finally:
            proc.kill()
            proc.join(30)
        assert buf.lane_sizes() == [3, 0]
        with pytest.raises(ValueError, match="no published rows"):
            buf.sample(4)
        buf.add({"x": 7}, lane=0)  # a dead claimer's lane is shared again
        assert set(buf.sample(50)["x"].tolist()) == {7}
        other = shmbuf.Buffer.attach(name)
        assert other.claim_lane(0) == 0
        other.extend({"x": np.arange(100, 104)})  # wraps over the dead rows
        assert set(buf.sample(100)["x"].tolist()) == {100, 101, 102, 103}
        other.close()


def test_release_waits_for_nothing_and_the_lane_is_shared_again(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, lanes=2, name=name) as buf:
        with buf.writer(0) as w:
            w.extend({"x": np.arange(3)})
            assert buf.engine.ring.lane_table[0, 2] == os.getpid()
        assert buf.engine.ring.lane_table[0, 2] == 0
        buf.add({"x": 3}, lane=0)
        assert buf.lane_sizes() == [4, 0]


def test_attach_refuses_a_segment_of_another_format_version(name):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name):
        with open(shm_path(name), "r+b") as f:
            f.seek(8)
            f.write(struct.pack("<I", 1))
        with pytest.raises(shmbuf.FormatError, match="format version 1, but this shmbuf reads versions 4 to 6"):
            shmbuf.Buffer.attach(name)


@needs_native
def test_both_paths_write_and_sample_the_same_episodes(name, monkeypatch):
    """An EpisodeBuffer written by a vectorised writer on each path holds the same bytes,
    and handles of the same seed on each path draw the same transitions, n-step ones
    (the native path sums them in C), frame stacks, trajectories and whole episodes."""
    fields = {"obs": ((3,), "float32"), "action": ((), "int64"), "reward": ((), "float32")}
    made = [shmbuf.EpisodeBuffer.create(fields, 120, lanes=3, frame_stack=2, name=f"{name}-{i}")
            for i in range(2)]
    try:
        handles = []
        for i in range(2):
            with monkeypatch.context() as m:
                m.setenv("SHMBUF_PURE_PYTHON", "1" if i else "")
                handles.append(shmbuf.EpisodeBuffer.attach(f"{name}-{i}", seed=3))
            assert handles[-1].core.native is not bool(i)
        rng = np.random.default_rng(0)
        steps = [{"obs": rng.random((3, 3), np.float32), "action": rng.integers(0, 9, 3),
                  "reward": rng.random(3).astype(np.float32), "next_obs": rng.random((3, 3), np.float32)}
                 for _ in range(50)]
        ends = [(rng.random(3) < 0.1, rng.random(3) < 0.05) for _ in range(50)]
        for h in handles:
            with h.writer(envs=3) as w:
                for step, (term, trunc) in zip(steps, ends):
                    w.add(step, terminated=term, truncated=trunc)
        ra, rb = handles[0].engine.ring, handles[1].engine.ring
        assert np.array_equal(ra.stamps, rb.stamps) and np.array_equal(ra.lane_table, rb.lane_table)
        for k in ra.arrays:
            assert np.array_equal(ra.arrays[k], rb.arrays[k]), k
        a, b = handles
        for _ in range(3):
            for got in ((a.sample(32), b.sample(32)), (a.sample(32, n_step=3, gamma=0.9),
                                                       b.sample(32, n_step=3, gamma=0.9)),
                        (a.sample_trajectories(8, 5), b.sample_trajectories(8, 5))):
                for k in got[0]:
                    assert np.array_equal(got[0][k], got[1][k]), k
            ea, eb = a.sample_episodes(3), b.sample_episodes(3)
            assert all(np.array_equal(x[k], y[k]) for x, y in zip(ea, eb) for k in x)
        for h in handles:
            h.close()
    finally:
        for buf in made:
            buf.close()


@needs_native
def test_both_paths_relabel_the_same_goals(name, monkeypatch):
    """Handles of the same seed on each path draw the same hindsight goals with each
    strategy (the native path finds an episode's last row in C), over lanes that wrap,
    with episodes in progress."""
    from helpers import GOAL_OBS, GOALS, goal_reward
    from shmbuf.episodes import gather
    with shmbuf.EpisodeBuffer.create(GOALS, 90, lanes=3, observations=GOAL_OBS, name=name) as buf:
        rng = np.random.default_rng(1)
        no = np.zeros(3, bool)
        with buf.writer(envs=3) as w:
            for t in range(70):
                end = rng.random(3) < 0.15
                step = {"obs": np.full((3, 1), t), "achieved_goal": np.stack([np.arange(3), np.full(3, t)], 1),
                        "desired_goal": np.full((3, 2), -1), "reward": np.zeros(3),
                        "next_obs": np.full((3, 1), t + 1),
                        "next_achieved_goal": np.stack([np.arange(3), np.full(3, t + 1)], 1),
                        "next_desired_goal": np.full((3, 2), -1)}
                w.add(step, terminated=end, truncated=no)
        handles = []
        for pure in (False, True):
            with monkeypatch.context() as m:
                m.setenv("SHMBUF_PURE_PYTHON", "1" if pure else "")
                handles.append(shmbuf.EpisodeBuffer.attach(name, seed=5))
            assert handles[-1].core.native is not pure
        try:
            for strategy in ("future", "final", "episode"):
                got = []
                for h in handles:
                    h.her = shmbuf.HER(strategy, 0.7, reward_fn=goal_reward)
                    got.append(h.sample(200))
                assert (got[0]["desired_goal"] != -1).any()
                for k in got[0]:
                    assert np.array_equal(got[0][k], got[1][k]), (strategy, k)
            # the search itself, from every row of every lane
            ring, pure_ring = handles[0].engine.ring, handles[1].engine.ring
            lo, head = ring.window()
            lane = np.concatenate([np.full(head[i] - lo[i], i) for i in range(3)])
            end = np.concatenate([np.arange(lo[i], head[i]) for i in range(3)])
            start = ring.arrays["_start"][lane * ring.lane_capacity + end % ring.lane_capacity]
            want = gather.last_rows(ring, lane, end, start)
            assert np.array_equal(want, gather.last_rows(pure_ring, lane, end, start))
            memo = gather.Ends(ring)  # cold, then from the memo (ended episodes), the same
            assert np.array_equal(memo.last_rows(lane, end, start), want)
            assert (memo.start >= 0).any()
            assert np.array_equal(memo.last_rows(lane, end, start), want)
        finally:
            for h in handles:
                h.close()


@needs_native
def test_both_paths_keep_the_same_priority_trees_and_draw_the_same_rows(name, monkeypatch):
    """The C tree_set / tree_find and their numpy twins: the same updates leave the same
    trees (bit for bit), and handles of one seed draw the same rows and weights."""
    made = [shmbuf.Buffer.create({"x": ((), "int64")}, 100, lanes=2, priority=0.7, name=f"{name}-{i}")
            for i in range(2)]
    try:
        handles = []
        for i, pure in enumerate((False, True)):
            with monkeypatch.context() as m:
                m.setenv("SHMBUF_PURE_PYTHON", "1" if pure else "")
                handles.append(shmbuf.Buffer.attach(f"{name}-{i}", seed=4))
            assert handles[-1].native is not pure
        rng = np.random.default_rng(0)
        for step in range(30):
            rows, lane, p = np.arange(step * 7, step * 7 + 7), step % 2, rng.random(7) + 0.01
            new = rng.random(16) * 3 + 0.1
            got = []
            for h in handles:
                h.extend({"x": rows}, lane=lane, priority=p)
                got.append(h.sample(16, beta=0.5))
                h.update_priorities(got[-1]["index"], new)
            for k in got[0]:
                assert np.array_equal(got[0][k], got[1][k]), k
        ta, tb = handles[0].engine.priorities, handles[1].engine.priorities
        assert np.array_equal(ta.sum, tb.sum) and np.array_equal(ta.min, tb.min)
        assert np.array_equal(ta.seq, tb.seq)
        for h in handles:
            h.close()
    finally:
        for buf in made:
            buf.close()


def test_the_path_switch_takes_0_and_1_and_refuses_the_rest(name, monkeypatch):
    """Round 2, item 18: SHMBUF_PURE_PYTHON=0 is the native path (before: any non-empty
    value, "0" too, selected pure Python); anything but 0, 1 or empty is refused."""
    want = "native" if native.available() else "python"
    for value, path in (("0", want), ("", want), ("1", "python")):
        monkeypatch.setenv("SHMBUF_PURE_PYTHON", value)
        assert native.path() == path
        with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name) as b:
            assert (b.engine.native is not None) == (path == "native")
    for value in ("yes", "true", "2", " 1"):
        monkeypatch.setenv("SHMBUF_PURE_PYTHON", value)
        with pytest.raises(ValueError, match="expected 1 .* or 0"):
            shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name)
    assert not segment.list_names() or name not in segment.list_names()


@pytest.mark.one_path
@needs_native
def test_the_common_casts_are_written_by_c_itself(name, monkeypatch):
    """float64 rewards, int64 actions and bool flags into float32/int32/float fields do
    not fall back to the Python path (None: written; False: the Python path's turn),
    while a value that would not survive still does (the Python path then refuses it)."""
    fields = {"reward": ((), "float32"), "action": ((1,), "int32"), "done": ((), "float32")}
    monkeypatch.setenv("SHMBUF_PURE_PYTHON", "0")  # (this test is about the native path)
    with shmbuf.Buffer.create(fields, 16, name=name) as buf:
        c = buf.engine.native
        good = {"reward": np.float64(0.5), "action": np.array([3]), "done": np.True_}
        buf.add(good)  # (a handle's first write to a lane maps its pages, in Python)
        assert c.add({**good, "reward": 0.5}, None, None) is None
        assert c.add(good, None, None) is None  # np.float64: a float subclass
        assert c.add({**good, "reward": np.array(0.5)}, None, None) is None
        assert c.extend({"reward": np.ones(3), "action": np.ones((3, 1), np.int64),
                         "done": np.zeros(3, bool)}, None, None) is None
        assert c.add({**good, "reward": np.array(1e39)}, None, None) is False
        assert c.add({**good, "action": np.array([2 ** 40])}, None, None) is False
        assert len(buf) == 7


def test_the_c_constants_are_those_of_layout_and_stats():
    """The C parts keep their own copies of the segment's table columns and the stats
    region's words (shmbuf/core/csrc/ring.h): every one equals its Python definition."""
    import pathlib
    import re

    from shmbuf.core import layout

    from shmbuf.core import counters as stats

    text = (pathlib.Path(__file__).parents[2] / "shmbuf" / "core" / "csrc" / "ring.h").read_text()
    c = {k: int(v) for k, v in re.findall(r"\b([A-Z][A-Z_]*) = (\d+)\b", text)}
    c["MAX_SEQ"] = eval(re.search(r"#define MAX_SEQ (\(.*\))", text).group(1).replace("(int64_t)", ""))
    python = {name: getattr(layout, name) for name in (
        "LANE_HEAD", "LANE_BASE", "LANE_CLAIM_PID", "LANE_OWN_START", "LANE_OWN_COUNT", "RES_PID", "RES_CTIME",
        "RES_LANE", "RES_START", "RES_COUNT", "RES_TOKEN", "TABLE_WIDTH", "CTRL_LOCK_HOLDER", "MAX_SEQ")}
    python.update(LANE_STAT_WIDTH=stats.LANE_WORDS, LS_PID=stats.L_PID, LS_CTIME=stats.L_CTIME, LS_TIME=stats.L_TIME,
                  S_LOCKS=stats.S_LOCKS, S_LOCK_NS=stats.S_LOCK_NS, S_WRITES=stats.S_WRITES)
    assert {k: c.get(k) for k in python} == python


@needs_native
def test_arrays_are_read_from_their_objects_only_where_the_probe_confirmed_the_layout():
    """csrc/arrays.c reads an array's data, shape and dtype from the object only after
    two arrays whose every property Python knows read as expected there."""
    ext, a = native.extension(), np.empty((2, 3), np.int32)
    assert native.ARRAYS_READ_DIRECTLY  # this numpy lays its arrays out as numpy has since 1.7
    try:
        assert ext.probe_arrays(a, a, a.ctypes.data, a.dtype) is False  # the second is contiguous
        assert ext.probe_arrays(a, a[:, ::2], a.ctypes.data + 4, a.dtype) is False
        assert ext.probe_arrays(a, a[:, ::2], a.ctypes.data, np.dtype(np.int64)) is False
        assert ext.probe_arrays(1, 2, 0, a.dtype) is False  # not arrays: nothing read past the objects
    finally:
        assert ext.probe_arrays(a, a[:, ::2], a.ctypes.data, a.dtype) is True


@needs_native
@pytest.mark.parametrize("direct", [True, False])
def test_every_kind_of_array_is_stored_as_its_values_whether_read_directly_or_not(name, monkeypatch, direct):
    """Exact arrays take the direct read; views with an offset, strided, Fortran-ordered,
    byte-swapped and subclassed arrays take the buffer or the Python path; all store
    their values. ``direct=False``: the probe refused (another numpy): buffers only."""
    class Sub(np.ndarray):
        pass
    ext, probe = native.extension(), np.empty((2, 3), np.int32)
    fields = {"x": ((2, 3), "float32"), "n": ((), "int64")}
    base = np.arange(60, dtype=np.float32).reshape(10, 2, 3)
    batches = [base[:4], base[1:5], base[::2][:3], np.asfortranarray(base[:3]), base[:2].astype(">f4"),
               base[:3].view(Sub), base[4:5]]
    monkeypatch.setenv("SHMBUF_PURE_PYTHON", "0")
    try:
        if not direct:
            assert ext.probe_arrays(probe, probe, probe.ctypes.data, probe.dtype) is False
        with shmbuf.Buffer.create(fields, 64, name=name) as buf:
            want = []
            for x in batches:
                buf.extend({"x": x, "n": np.arange(len(x))})
                buf.add({"x": x[0], "n": np.int64(7)})
                want += [np.asarray(x, np.float32), np.asarray(x[:1], np.float32)]
            assert np.array_equal(buf.engine.ring.arrays["x"][:len(buf)], np.concatenate(want))
            assert buf.engine.native.extend({"x": base[:4], "n": np.arange(4)}, None, None) is None  # C wrote it
    finally:
        assert ext.probe_arrays(probe, probe[:, ::2], probe.ctypes.data, probe.dtype) is True

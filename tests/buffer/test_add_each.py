"""add_each (a row per lane, the envs of a vector env step) and the lane writer: all rows
or none, on every kind of buffer add works on, with lanes that are ints."""

from __future__ import annotations

import multiprocessing as mp
import re
import threading

import numpy as np
import pytest

import shmbuf
from shmbuf.core import ring as ring_module

X = {"x": ((), "int64")}


def _claim_and_wait(name, lane, ready, done):
    buf = shmbuf.Buffer.attach(name)
    buf.claim_lane(lane)
    ready.set()
    done.wait(60)
    buf.close()


@pytest.mark.parametrize("mine", [True, False])
def test_a_lane_of_another_live_process_refuses_every_row_before_any_is_written(name, mine):
    """Lane 2 is claimed by another live process: add_each into lanes 0, 1, 2 raises
    and writes nothing (it used to write lanes 0 and 1 first). ``mine``: this process
    claims lanes 0 and 1 (the native path's one call is tried first, and declines)."""
    ctx = mp.get_context("fork")
    with shmbuf.Buffer.create(X, 12, lanes=3, name=name) as buf:
        ready, done = ctx.Event(), ctx.Event()
        p = ctx.Process(target=_claim_and_wait, args=(name, 2, ready, done))
        p.start()
        others = []
        try:
            assert ready.wait(30)
            if mine:
                others = [shmbuf.Buffer.attach(name) for _ in range(2)]
                for lane, other in enumerate(others):
                    other.claim_lane(lane)
                buf.prefault()
            with pytest.raises(RuntimeError, match=rf"lane 2 is claimed by live process {p.pid}.*"
                                                   r"none of the 3 rows was written"):
                buf.add_each({"x": np.array([1, 2, 3])}, [0, 1, 2])
            assert buf.lane_sizes() == [0, 0, 0]
            buf.add_each({"x": np.array([1, 2])}, [0, 1])  # lanes nobody else claims: written
            assert buf.lane_sizes() == [1, 1, 0]
        finally:
            done.set()
            p.join(30)
            for other in others:
                other.close()


def test_the_rate_limit_is_passed_for_all_rows_at_once(name):
    """Room under the rate limit for 2 rows, not 3: add_each of 3 rows waits, then raises
    RateLimitTimeout with nothing written (it used to write 2 rows, then raise)."""
    rate = shmbuf.RateLimit(min_size=1, samples_per_insert=1, error_buffer=2)  # inserted - sampled <= 3
    with shmbuf.Buffer.create(X, 30, lanes=3, name=name, rate=rate, seed=0) as buf:
        buf.add({"x": 0}, lane=0)
        with pytest.raises(shmbuf.RateLimitTimeout, match="could not insert 3 rows.*none of the 3 rows was written"):
            buf.add_each({"x": np.array([1, 2, 3])}, [0, 1, 2], timeout=0.05)
        assert buf.lane_sizes() == [1, 0, 0]
        buf.sample(1)  # room for 3 now
        buf.add_each({"x": np.array([1, 2, 3])}, [0, 1, 2], timeout=0.05)
        assert buf.lane_sizes() == [2, 1, 1]


def test_a_queue_waits_for_room_in_every_lane_before_writing_any(name):
    """A queue whose lane 1 is full: add_each into lanes 0 and 1 raises WriteTimeout with
    nothing written; once a take made room, it writes both."""
    with shmbuf.Buffer.create(X, 4, lanes=2, name=name, mode="queue") as buf:
        buf.extend({"x": np.array([10, 11])}, lane=1)  # lane 1 (2 rows) is full
        with pytest.raises(shmbuf.WriteTimeout, match=r"queue is full.*lane 1.*none of the 2 rows was written"):
            buf.add_each({"x": np.array([1, 2])}, [0, 1], timeout=0.05)
        assert buf.lane_sizes() == [0, 2]
        assert buf.take(1)["x"].tolist() == [10]
        buf.add_each({"x": np.array([1, 2])}, [0, 1], timeout=0.05)
        assert sorted(buf.take(3)["x"].tolist()) == [1, 2, 11]


def test_a_write_stopped_by_another_thread_says_which_rows_were_written(name):
    """This process claims lanes 0 and 1; another thread of it is stopped inside a write to
    lane 1. add_each into lanes 0 and 1 cannot finish lane 1's row, and its error says
    which rows were written: lane 0's on the native path (its one call declines, the rows
    go one by one), none on the pure-Python path (whose owner writes of one process take
    turns: lane 0's waits too)."""
    with shmbuf.Buffer.create(X, 8, lanes=2, name=name) as buf, shmbuf.Buffer.attach(name) as other:
        buf.claim_lane(0)
        other.claim_lane(1)
        there, go = threading.Event(), threading.Event()
        stopper = threading.current_thread()

        def hook(point):
            if point == "writing" and threading.current_thread() is not stopper:
                there.set()
                go.wait(30)

        ring_module.set_hook(hook)
        t = threading.Thread(target=other.add, args=({"x": 9},), kwargs={"lane": 1})
        try:
            t.start()
            assert there.wait(30)
            said = r"rows 0\.\.0 of the 2 \(into lanes \[0\]\) were written before this error, rows 1\.\.1 were not" \
                if buf.engine.native is not None else "none of the 2 rows was written"
            with pytest.raises(shmbuf.WriteTimeout, match=said) as got:
                buf.add_each({"x": np.array([1, 2])}, np.array([0, 1]), timeout=0.1)
            assert re.search(r"another thread of this process is still writing to it after 0\.\d+ s", str(got.value))
        finally:
            go.set()
            t.join(30)
            ring_module.set_hook(None)
        assert buf.lane_sizes() == ([1, 1] if buf.engine.native is not None else [0, 1])


# -- every kind of buffer add writes -------------------------------------------------

KINDS = {
    "versions": ({"versions": True}, {"version": 3}),
    "priority": ({"priority": 0.6}, {"priority": 2.5}),
    "max_times_sampled": ({"max_times_sampled": 2}, {}),
    "queue": ({"mode": "queue"}, {}),
    "rate": ({"rate": shmbuf.RateLimit(min_size=1, samples_per_insert=1, error_buffer=10)}, {}),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_add_each_writes_the_rows_add_writes_on_every_kind_of_buffer(name, kind):
    """add_each on a buffer made with versions=, priority=, max_times_sampled=, a queue or
    a rate limit (it used to refuse all but the last): the same stored rows, hidden
    fields included, as add() of each row into its lane."""
    create, kw = KINDS[kind]
    fields = {"obs": ((2,), "float32"), "r": ((), "float32")}
    batch = {"obs": np.arange(6, dtype=np.float32).reshape(3, 2), "r": np.array([1.0, 2.0, 3.0])}
    lanes = [2, 0, 1]
    with shmbuf.Buffer.create(fields, 12, lanes=3, name=name, **create) as a, \
            shmbuf.Buffer.create(fields, 12, lanes=3, name=name + "-by-add", **create) as b:
        a.add_each(batch, lanes, **kw)
        for i, lane in enumerate(lanes):
            b.add({k: v[i] for k, v in batch.items()}, lane=lane, **kw)
        assert a.lane_sizes() == b.lane_sizes() == [1, 1, 1]
        for f in a.engine.fields:
            got, want = a.engine.view(f.name), b.engine.view(f.name)
            if f.name == "_queued":  # (the time each write began)
                assert ((got > 0) == (want > 0)).all()
            else:
                assert np.array_equal(got, want), f.name
        if kind == "priority":
            slots = np.arange(12)
            assert np.array_equal(a.engine.priorities.leaf_values(slots), b.engine.priorities.leaf_values(slots))


def test_add_each_refuses_version_and_priority_where_add_does(name):
    with shmbuf.Buffer.create(X, 6, lanes=2, name=name) as buf:
        with pytest.raises(ValueError, match="version= is for a buffer created with versions=True"):
            buf.add_each({"x": np.array([1, 2])}, [0, 1], version=1)
        with pytest.raises(ValueError, match="priority= is for a prioritized buffer"):
            buf.add_each({"x": np.array([1, 2])}, [0, 1], priority=1.0)
        assert buf.lane_sizes() == [0, 0]


# -- lanes are ints --------------------------------------------------------------------

@pytest.mark.parametrize("lanes", [[0.0, 1.9], np.array([0.0, 1.0]), [True, False], np.array([True, False]),
                                   ["0", "1"], "01", [[0, 1]], 1, [0, None]])
def test_lanes_that_are_not_ints_are_refused_and_nothing_is_written(name, lanes):
    with shmbuf.Buffer.create(X, 6, lanes=2, name=name) as buf:
        with pytest.raises(TypeError, match="lanes must be a sequence of ints, one lane per row"):
            buf.add_each({"x": np.array([1, 2])}, lanes)
        assert buf.lane_sizes() == [0, 0]
        buf.add_each({"x": np.array([1, 2])}, [np.int32(1), 0])  # ints of any integer type
        assert buf.lane_sizes() == [1, 1]


@pytest.mark.parametrize("lanes", [[0, 2], np.array([0, 2]), np.array([-1, 0])])
@pytest.mark.parametrize("mine", [True, False])
def test_lanes_out_of_range_are_refused_and_nothing_is_written(name, lanes, mine):
    """(``mine``: this process claims both lanes, so the native path's one call is tried
    first: it declines a lane it has not.)"""
    with shmbuf.Buffer.create(X, 6, lanes=2, name=name) as buf, shmbuf.Buffer.attach(name) as other:
        if mine:
            buf.claim_lane(0)
            other.claim_lane(1)
            buf.prefault()
        with pytest.raises(ValueError, match=r"lanes must be in \[0, 2\): this buffer has 2 lanes"):
            buf.add_each({"x": np.array([1, 2])}, lanes)
        assert buf.lane_sizes() == [0, 0]


# -- the lane writer -----------------------------------------------------------------

def test_the_lane_writer_takes_the_keywords_of_add_and_extend(name):
    with shmbuf.Buffer.create(X, 8, lanes=2, name=name, versions=True) as buf:
        with buf.writer(1) as w:
            w.add({"x": 1}, version=2, timeout=1.0)
            w.extend({"x": np.array([2, 3])}, version=5, truncate_ok=False)
        assert buf.sample_sequences(1, 3, lane=1)["version"].tolist() == [[2, 5, 5]]
    with shmbuf.Buffer.create(X, 8, name=name + "-p", priority=0.5) as buf:
        with buf.writer() as w:
            w.add({"x": 1}, priority=4.0)
            w.extend({"x": np.array([2, 3])}, priority=[1.0, 9.0])
        assert buf.engine.view("_priority")[:3].tolist() == [4.0, 1.0, 9.0]


# -- the episode writer's step: its rows and the final rows of the episodes that end --

@pytest.mark.parametrize("arrays", [True, False])
def test_an_episode_writers_step_and_its_final_rows_are_one_write(name, arrays):
    """Two envs, one of whose episode ends: 3 rows (the step of each, the final row of the
    ended one). With room under the rate limit for 2, the step raises RateLimitTimeout
    and writes none (it used to write the 2 steps, then time out on the final row);
    ``arrays``: given as arrays of the fields' dtypes (the native path's fast branch)."""
    rate = shmbuf.RateLimit(min_size=1, samples_per_insert=1, error_buffer=2)  # inserted - sampled <= 3
    fields = {"obs": ((2,), "float32"), "reward": ((), "float32")}
    with shmbuf.EpisodeBuffer.create(fields, 40, lanes=2, name=name, rate=rate, seed=0) as buf:
        with buf.writer(envs=2) as w:
            first = {"obs": np.zeros((2, 2), np.float32), "reward": np.zeros(2, np.float32)}
            w.add(first, terminated=np.zeros(2, bool), truncated=np.zeros(2, bool))  # 2 rows in, none sampled
            buf.core.sample(1)  # room for 2 more: not 3
            step = {"obs": np.ones((2, 2), np.float32), "reward": np.ones(2, np.float32),
                    "next_obs": np.full((2, 2), 5, np.float32)}
            if not arrays:
                step = {k: v.tolist() for k, v in step.items()}
            ends = np.array([True, False])
            sizes = buf.core.lane_sizes()
            with pytest.raises(shmbuf.RateLimitTimeout, match="could not insert 3 rows.*none of the 3 rows was written"):
                w.add(step, terminated=ends, truncated=np.zeros(2, bool), timeout=0.05)
            assert buf.core.lane_sizes() == sizes
            buf.core.sample(1)  # room for 3: the same step again, now written whole
            w.add(step, terminated=ends, truncated=np.zeros(2, bool), timeout=0.05)
            assert sum(buf.core.lane_sizes()) == sum(sizes) + 3
            ended = buf.core.sample_sequences(1, 3, lane=w.lanes[0])["obs"][0]
            assert ended.tolist() == [[0, 0], [1, 1], [5, 5]]  # its steps, then its final observation


# -- a Ctrl-C partway: which rows were written, and the version floor ---------------------


def _interrupt_at(point, nth, set_hook):
    """A real SIGINT at the ``nth`` time a write of this process reaches ``point``
    ("writing": the row is copied, not published, and is abandoned; "published": it is
    written, and stays so)."""
    import signal
    seen = []

    def hook(where):
        if where == point:
            seen.append(where)
            if len(seen) == nth:
                signal.raise_signal(signal.SIGINT)
    set_hook(hook)


def _said(exc):
    return "\n".join(getattr(exc, "__notes__", ())) or str(exc)


def _published(buf):
    """Per lane, the rows whose stamps say published (an abandoned row's reservation
    still counts in lane_sizes)."""
    stamps = buf.engine.ring.stamps.reshape(buf.lanes, -1)
    return ((stamps > 0) & (stamps % 2 == 0)).sum(1).tolist()


@pytest.mark.parametrize("point, written", [("writing", 1), ("published", 2)])
def test_a_ctrl_c_partway_says_which_rows_were_written(name, set_hook, point, written):
    """add_each into lanes 0, 1, 2, none of them this process's, so row by row on both
    paths; a real SIGINT lands in the second row's write, while it is copied (the row is
    abandoned) or right after it is published (it stays written: a count of the calls
    that returned says 1). The KeyboardInterrupt says which rows were written, in a note
    and in ``rows_written`` (it said nothing)."""
    with shmbuf.Buffer.create(X, 9, lanes=3, name=name) as buf:
        _interrupt_at(point, 2, set_hook)
        with pytest.raises(KeyboardInterrupt) as got:
            buf.add_each({"x": np.array([10, 11, 12])}, [0, 1, 2])
        set_hook(None)
        assert _published(buf) == [1] * written + [0] * (3 - written)
        assert got.value.rows_written == written
        assert (f"rows 0..{written - 1} of the 3 (into lanes {list(range(written))}) were written before this "
                f"error, rows {written}..2 were not") in _said(got.value)


@pytest.mark.parametrize("point, floor", [("writing", False), ("published", True)])
def test_the_version_floor_follows_the_rows_a_stopped_add_each_wrote(name, set_hook, point, floor):
    """versions=True: add_each of version 5 into lanes 0 and 1, stopped by a real SIGINT
    in its first row's write. Where that row was published, version 5 is the handle's
    floor (a later version 4 is refused: lane 0 would go 5, 4; it used to be written);
    where nothing was written, version 4 is still fine."""
    with shmbuf.Buffer.create(X, 8, lanes=2, name=name, versions=True) as buf:
        _interrupt_at(point, 1, set_hook)
        with pytest.raises(KeyboardInterrupt):
            buf.add_each({"x": np.array([1, 2])}, [0, 1], version=5)
        set_hook(None)
        assert _published(buf) == ([1, 0] if floor else [0, 0])
        if floor:
            with pytest.raises(ValueError, match="this handle wrote version 5, got 4"):
                buf.add_each({"x": np.array([3, 4])}, [0, 1], version=4)
            assert _published(buf) == [1, 0]
        else:
            buf.add_each({"x": np.array([3, 4])}, [0, 1], version=4)
            assert _published(buf) == [1, 1]


@pytest.mark.parametrize("how", ["add", "extend", "add_each"])
def test_a_write_whose_version_a_ctrl_c_kept_from_settling_is_settled_by_the_next(name, monkeypatch, how):
    """A Ctrl-C lands after the write returned, as its version is being made the
    handle's floor (the first thing of that step raises): the next write settles it
    first, so a lower version is still refused."""
    from shmbuf.versions.bound import Versions
    real, calls = Versions.done, []

    def interrupted(self):
        if self.mark is not None and not calls:
            calls.append(1)
            raise KeyboardInterrupt
        real(self)
    write = {"add": lambda b, v: b.add({"x": 1}, version=v),
             "extend": lambda b, v: b.extend({"x": np.arange(2)}, version=v),
             "add_each": lambda b, v: b.add_each({"x": np.arange(2)}, [0, 1], version=v)}[how]
    with shmbuf.Buffer.create(X, 8, lanes=2, name=name, versions=True) as buf:
        monkeypatch.setattr(Versions, "done", interrupted)
        with pytest.raises(KeyboardInterrupt):
            write(buf, 5)
        held = len(buf)
        assert calls and held > 0
        with pytest.raises(ValueError, match="this handle wrote version 5, got 4"):
            write(buf, 4)
        assert len(buf) == held

"""Newest first (``sampler="newest"``): the n most recent rows, newest first, read
through the one checked read path like every sampler (both paths: scripts/test runs
this file on each)."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

import shmbuf
from shmbuf.core.layout import published
from shmbuf.samplers.newest import newest_first

from helpers import STORM, start_hanging_writer, storm_rows, wait_for_file, write_and_wait, writers_and_samplers

GARBAGE = -7


def newest(name, capacity=8, **kw):
    return shmbuf.Buffer.create({"x": ((), "int64")}, capacity, name=name, sampler="newest", **kw)


def test_one_lane_gives_exactly_the_newest_rows_newest_first(name):
    with newest(name, 6) as buf:
        buf.extend({"x": np.arange(4)})
        assert buf.sample(4)["x"].tolist() == [3, 2, 1, 0]
        buf.extend({"x": np.arange(4, 10)})  # wraps: rows 4 .. 9 are held
        assert buf.sample(3)["x"].tolist() == [9, 8, 7]
        assert buf.sample(6)["x"].tolist() == [9, 8, 7, 6, 5, 4]
        assert buf.sample(0)["x"].shape == (0,)
        out = buf.empty_batch(2)
        assert buf.sample(2, out=out) is out and out["x"].tolist() == [9, 8]
        assert buf.stats()["rows_sampled"] == 4 + 3 + 6 + 2


def test_lanes_take_turns_by_age(name):
    with newest(name, 12, lanes=3) as buf:
        buf.extend({"x": [0, 1, 2, 3]}, lane=0)
        buf.extend({"x": [10]}, lane=1)
        buf.extend({"x": [20, 21]}, lane=2)
        assert buf.sample(7)["x"].tolist() == [3, 10, 21, 2, 20, 1, 0]
        assert buf.sample(2)["x"].tolist() == [3, 10]


def test_newest_first_order_of_the_windows():
    lanes, seqs = newest_first(np.array([0, 5, 2]), np.array([3, 6, 2]), 10)
    assert list(zip(lanes.tolist(), seqs.tolist())) == [(0, 2), (1, 5), (0, 1), (0, 0)]
    lanes, seqs = newest_first(np.array([0]), np.array([1000]), 3)
    assert seqs.tolist()[:3] == [999, 998, 997] and len(seqs) < 1000  # (the rows asked for, not all)


def test_more_rows_than_held_is_a_clear_error_and_changes_nothing(name):
    with newest(name) as buf:
        with pytest.raises(ValueError, match="the 1 newest rows: the buffer holds 0"):
            buf.sample(1)
        buf.extend({"x": np.arange(3)})
        with pytest.raises(ValueError, match="cannot sample the 5 newest rows: the buffer holds 3; add rows or ask"):
            buf.sample(5)
        assert buf.stats()["rows_sampled"] == 0
        with pytest.raises(ValueError, match="beta= is for a prioritized buffer"):
            buf.sample(1, beta=0.4)


def test_a_row_being_written_is_left_out_and_the_next_older_comes_in(name, break_protection):
    """Row 4, the newest, planted as a writer killed mid-copy leaves it (odd stamp,
    garbage values): it never comes out; with the read path's stamp check switched off
    it does, which proves that the check is what keeps it out."""
    with newest(name) as buf:
        buf.extend({"x": np.arange(5)})
        ring = buf.engine.ring
        ring.stamps[4] = published(4) - 1
        ring.arrays["x"][4] = GARBAGE
        assert buf.sample(3)["x"].tolist() == [3, 2, 1]
        with pytest.raises(ValueError, match="cannot sample the 5 newest rows: only 4 of the rows the buffer holds are published"):
            buf.sample(5)
        break_protection("stamp check")
        assert buf.sample(3)["x"].tolist() == [GARBAGE, 3, 2]


def test_a_live_writer_stopped_mid_write_is_waited_for_by_no_one(name, tmp_path):
    """A real writer process stopped inside its copy (rows reserved, not published):
    newest first returns the newest published rows, at once, never the reserved ones."""
    with newest(name, 16) as buf:
        buf.extend({"x": np.arange(4)})
        proc = start_hanging_writer(name, "writing", tmp_path, rows=3)
        try:
            assert len(buf) == 7  # reserved rows count as held
            assert buf.sample(4)["x"].tolist() == [3, 2, 1, 0]
        finally:
            proc.kill()
            proc.join(30)


def test_rows_only_live_writers_can_complete_are_waited_for_up_to_the_timeout(name, tmp_path):
    """4 rows published, 3 reserved by a live writer stopped inside its copy (len 7): a
    sample of 5 to 7 rows cannot be made of published rows alone. It waits for the
    writer up to its timeout and says so (SampleTimeout), never a ValueError (the call
    is valid: the rows are held, and come as soon as the writer goes on). Once the
    writer finishes, the same sample returns the newest rows; a writer that died
    instead leaves rows that never come: ValueError at once."""
    ctx = mp.get_context("spawn")
    with newest(name, 16) as buf:
        buf.extend({"x": np.arange(4)})
        flag, go = str(tmp_path / "flag"), str(tmp_path / "go")
        proc = ctx.Process(target=write_and_wait, args=(name, 3, flag, go))
        proc.start()
        try:
            wait_for_file(flag, proc, "the writer to stop inside its copy")
            assert len(buf) == 7 and buf.sample(4)["x"].tolist() == [3, 2, 1, 0]
            for n in (5, 7):
                with pytest.raises(shmbuf.SampleTimeout, match=rf"could not copy {n - 4} intact newest rows within "
                                   r"0.2 s: the buffer holds 7 rows, 4 of them published; live writers are still "
                                   r"writing the others \(the sample waited for them\)"):
                    buf.sample(n, timeout=0.2)
            with pytest.raises(ValueError, match="cannot sample the 8 newest rows: the buffer holds 7"):
                buf.sample(8)
            open(go, "w").close()
            assert buf.sample(7, timeout=60)["x"].tolist() == [102, 101, 100, 3, 2, 1, 0]
            proc.join(60)
            assert proc.exitcode == 0
        finally:
            proc.kill()
            proc.join(30)
    with newest(name + "-dead", 16) as buf:
        buf.extend({"x": np.arange(4)})
        proc = start_hanging_writer(name + "-dead", "writing", tmp_path, rows=3)
        proc.kill()
        proc.join(30)
        with pytest.raises(ValueError, match="cannot sample the 5 newest rows: only 4 of the rows the buffer holds "
                                             "are published"):
            buf.sample(5, timeout=60)


def test_every_handle_of_the_buffer_and_its_saves_sample_newest_first(name, tmp_path):
    with newest(name) as buf:
        buf.extend({"x": np.arange(5)})
        with shmbuf.Buffer.attach(name) as other:
            assert type(other.sampler).__name__ == "Newest" and other.sample(2)["x"].tolist() == [4, 3]
        buf.save(tmp_path / "save")
        with shmbuf.Buffer.load(tmp_path / "save", name=name + "-back") as back:
            assert back.sample(2)["x"].tolist() == [4, 3]


def test_create_checks_the_sampler(name):
    with pytest.raises(ValueError, match=r"sampler must be one of \[.*'newest'.*'uniform'\], .*; got 'lifo'"):
        shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name, sampler="lifo")
    with pytest.raises(ValueError, match="do not go together"):
        shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name, sampler="newest", mode="queue")
    with pytest.raises(ValueError, match="do not go together"):
        shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name, sampler="newest", priority=0.6)


def test_storm_writers_and_newest_first_samplers_never_see_a_torn_row(name):
    """Two writers wrap a small ring while two processes sample its newest rows, the
    very rows being written: every row they get is whole (its fields from one write).
    The deterministic proof that the check is what keeps torn rows out is the planted
    row above."""
    ctx = mp.get_context("spawn")
    with shmbuf.Buffer.create(STORM, 64, name=name, sampler="newest") as buf:
        buf.extend(storm_rows(9, np.arange(64)))
        sampled, _ = writers_and_samplers(name, ctx)
    assert all(torn == 0 for _, torn in sampled), sampled
    assert sum(checked for checked, _ in sampled) > 0

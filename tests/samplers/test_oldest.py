"""Oldest first (``sampler="oldest"``): the n oldest rows, oldest first, read through the
one checked read path like every sampler (both paths: scripts/test runs this file on
each)."""

from __future__ import annotations

import json
import multiprocessing as mp

import numpy as np
import pytest

import shmbuf
from shmbuf.core.layout import published
from shmbuf.samplers.oldest import Oldest, oldest_first

from helpers import STORM, start_hanging_writer, storm_rows, wait_for_file, write_and_wait, writers_and_samplers

GARBAGE = -7


def oldest(name, capacity=8, **kw):
    return shmbuf.Buffer.create({"x": ((), "int64")}, capacity, name=name, sampler="oldest", **kw)


def test_one_lane_gives_exactly_the_oldest_rows_oldest_first(name):
    with oldest(name, 6) as buf:
        buf.extend({"x": np.arange(4)})
        assert buf.sample(4)["x"].tolist() == [0, 1, 2, 3]
        buf.extend({"x": np.arange(4, 10)})  # wraps: rows 4 .. 9 are held
        assert buf.sample(3)["x"].tolist() == [4, 5, 6]
        assert buf.sample(6)["x"].tolist() == [4, 5, 6, 7, 8, 9]
        assert buf.sample(0)["x"].shape == (0,)
        out = buf.empty_batch(2)
        assert buf.sample(2, out=out) is out and out["x"].tolist() == [4, 5]
        assert buf.stats()["rows_sampled"] == 4 + 3 + 6 + 2


def test_lanes_take_turns_by_age(name):
    with oldest(name, 12, lanes=3) as buf:
        buf.extend({"x": [0, 1, 2, 3]}, lane=0)
        buf.extend({"x": [10]}, lane=1)
        buf.extend({"x": [20, 21]}, lane=2)
        assert buf.sample(7)["x"].tolist() == [0, 10, 20, 1, 21, 2, 3]
        assert buf.sample(2)["x"].tolist() == [0, 10]


def test_oldest_first_order_of_the_windows():
    lanes, seqs = oldest_first(np.array([0, 5, 2]), np.array([3, 6, 2]), 10)
    assert list(zip(lanes.tolist(), seqs.tolist())) == [(0, 0), (1, 5), (0, 1), (0, 2)]
    lanes, seqs = oldest_first(np.array([7]), np.array([1000]), 3)
    assert seqs.tolist()[:3] == [7, 8, 9] and len(seqs) < 993  # (the rows asked for, not all)


def test_it_takes_no_options():
    assert Oldest.options({}) == {} and json.dumps(Oldest.options({})) == "{}"
    with pytest.raises(ValueError, match=r"sampler 'oldest' takes no options, got \['tau'\]"):
        Oldest.options({"tau": 3.0})
    with pytest.raises(TypeError, match="must be a mapping"):
        Oldest.options(["tau"])


def test_more_rows_than_held_is_a_clear_error_and_changes_nothing(name):
    with oldest(name) as buf:
        with pytest.raises(ValueError, match="the 1 oldest rows: the buffer holds 0"):
            buf.sample(1)
        buf.extend({"x": np.arange(3)})
        rng = buf.engine.rng.bit_generator.state
        with pytest.raises(ValueError, match="cannot sample the 5 oldest rows: the buffer holds 3; add rows or ask"):
            buf.sample(5)
        with pytest.raises(ValueError, match="beta= is for a prioritized buffer"):
            buf.sample(1, beta=0.4)
        assert buf.stats()["rows_sampled"] == 0 and buf.engine.rng.bit_generator.state == rng


def test_a_row_being_written_is_left_out_and_the_next_newer_comes_in(name, break_protection):
    """Row 0, the oldest, planted as a writer killed mid-copy leaves it (odd stamp,
    garbage values): it never comes out; with the read path's stamp check switched off
    it does, which proves that the check is what keeps it out."""
    with oldest(name) as buf:
        buf.extend({"x": np.arange(5)})
        ring = buf.engine.ring
        ring.stamps[0] = published(0) - 1
        ring.arrays["x"][0] = GARBAGE
        assert buf.sample(3)["x"].tolist() == [1, 2, 3]
        with pytest.raises(ValueError, match=r"cannot sample the 5 oldest rows: the buffer holds 5 rows, 4 of them "
                                             r"published, and no live writer is writing the others"):
            buf.sample(5)
        break_protection("stamp check")
        assert buf.sample(3)["x"].tolist() == [GARBAGE, 1, 2]


def test_rows_overwritten_while_copied_are_drawn_again_from_a_new_look(name, tmp_path, monkeypatch, break_protection):
    """A full ring of 8 rows (0 .. 7). The sample draws rows 0 .. 3; before they are
    copied, a real writer process reserves rows 8 and 9 (the slots of rows 0 and 1) and
    stops inside its copy (odd stamps, its values already in the slots). The checked
    gather fails rows 0 and 1; the next look's oldest rows not yet in the batch are 4 and
    5: the sample is rows 2 .. 5, at once. Once the writer finishes, rows 2 .. 9 are
    held. With the stamp check switched off, the same steps return the writer's half
    written rows in place of rows 0 and 1: the check is what keeps them out."""
    ctx = mp.get_context("spawn")
    for broken in (False, True):
        tag = f"{name}-{int(broken)}"
        with oldest(tag, 8) as buf:
            buf.extend({"x": np.arange(8)})
            flag, go = str(tmp_path / f"flag{int(broken)}"), str(tmp_path / f"go{int(broken)}")
            proc = ctx.Process(target=write_and_wait, args=(tag, 2, flag, go))
            real, calls = buf.sampler.gather, []

            def gather(drawn, out):  # the writer overwrites the drawn rows before the first copy
                if not calls:
                    assert drawn[1].tolist() == [0, 1, 2, 3]
                    proc.start()
                    wait_for_file(flag, proc, "the writer to stop inside its copy")
                calls.append(drawn[1].tolist())
                return real(drawn, out)
            monkeypatch.setattr(buf.sampler, "gather", gather)
            try:
                if broken:
                    break_protection("stamp check")
                    assert buf.sample(4, timeout=60)["x"].tolist() == [100, 101, 2, 3]
                else:
                    assert buf.sample(4, timeout=60)["x"].tolist() == [2, 3, 4, 5]
                    assert calls == [[0, 1, 2, 3], [4, 5]]
                monkeypatch.undo()
                open(go, "w").close()
                proc.join(60)
                assert proc.exitcode == 0
                if not broken:
                    assert buf.sample(8)["x"].tolist() == [2, 3, 4, 5, 6, 7, 100, 101]
            finally:
                if proc.pid is not None:
                    proc.kill()
                    proc.join(30)


def test_rows_overwritten_by_a_finished_write_are_replaced_by_the_new_rows(name, tmp_path, monkeypatch):
    """A full ring of 8 rows; the sample draws all 8; before they are copied, a real
    writer process writes rows 8 and 9 (100, 101) over rows 0 and 1 and exits. The
    first look has no row left to take their place: the next look at the lanes has, and
    the sample is the 8 rows held now, oldest first."""
    ctx = mp.get_context("spawn")
    with oldest(name, 8) as buf:
        buf.extend({"x": np.arange(8)})
        flag, go = str(tmp_path / "flag"), str(tmp_path / "go")
        open(go, "w").close()  # (the writer goes through)
        proc = ctx.Process(target=write_and_wait, args=(name, 2, flag, go))
        real, calls = buf.sampler.gather, []

        def gather(drawn, out):
            if not calls:
                proc.start()
                proc.join(60)
                assert proc.exitcode == 0
            calls.append(drawn[1].tolist())
            return real(drawn, out)
        monkeypatch.setattr(buf.sampler, "gather", gather)
        try:
            assert buf.sample(8, timeout=60)["x"].tolist() == [2, 3, 4, 5, 6, 7, 100, 101]
            assert calls == [list(range(8)), [8, 9]]
        finally:
            if proc.pid is not None:
                proc.kill()
                proc.join(30)


def test_a_row_written_while_the_verdict_is_taken_keeps_the_sample_going(name, tmp_path, monkeypatch):
    """4 rows published, 3 reserved by a writer that died: a sample of 5 finds no live
    writer and takes its final gather. A row written by another handle during that
    gather (the window moves) means the missing rows may be there now: no ValueError
    (it would no longer be true); the next look takes the new row."""
    with oldest(name, 16) as buf:
        buf.extend({"x": np.arange(4)})
        proc = start_hanging_writer(name, "writing", tmp_path, rows=3)
        proc.kill()
        proc.join(30)
        real, finals = buf.sampler.gather, []

        def gather(drawn, out):
            if buf.sampler.final is not None and not finals:
                with shmbuf.Buffer.attach(name) as other:
                    other.extend({"x": [100]})
                finals.append(drawn[1].tolist())
            return real(drawn, out)
        monkeypatch.setattr(buf.sampler, "gather", gather)
        assert buf.sample(5, timeout=60)["x"].tolist() == [0, 1, 2, 3, 100]
        assert finals == [[4]]


def test_a_live_writer_stopped_mid_write_is_waited_for_by_no_one(name, tmp_path):
    """A real writer process stopped inside its copy (rows reserved, not published):
    oldest first returns the oldest published rows, at once, never the reserved ones."""
    with oldest(name, 16) as buf:
        buf.extend({"x": np.arange(4)})
        proc = start_hanging_writer(name, "writing", tmp_path, rows=3)
        try:
            assert len(buf) == 7  # reserved rows count as held
            assert buf.sample(4)["x"].tolist() == [0, 1, 2, 3]
        finally:
            proc.kill()
            proc.join(30)


def test_rows_only_live_writers_can_complete_are_waited_for_up_to_the_timeout(name, tmp_path):
    """4 rows published, 3 reserved by a live writer stopped inside its copy (len 7): a
    sample of 5 to 7 rows cannot be made of published rows alone. It waits for the
    writer up to its timeout and says so (SampleTimeout), never a ValueError (the call
    is valid: the rows are held, and come as soon as the writer goes on). Once the
    writer finishes, the same sample returns the oldest rows; a writer that died
    instead leaves rows that never come: ValueError at once."""
    ctx = mp.get_context("spawn")
    with oldest(name, 16) as buf:
        buf.extend({"x": np.arange(4)})
        flag, go = str(tmp_path / "flag"), str(tmp_path / "go")
        proc = ctx.Process(target=write_and_wait, args=(name, 3, flag, go))
        proc.start()
        try:
            wait_for_file(flag, proc, "the writer to stop inside its copy")
            assert len(buf) == 7 and buf.sample(4)["x"].tolist() == [0, 1, 2, 3]
            for n in (5, 7):
                with pytest.raises(shmbuf.SampleTimeout, match=rf"could not copy {n - 4} intact oldest rows within "
                                   r"0.2 s: the buffer holds 7 rows, 4 of them published; live writers are still "
                                   r"writing the others \(the sample waited for them\)"):
                    buf.sample(n, timeout=0.2)
            with pytest.raises(ValueError, match="cannot sample the 8 oldest rows: the buffer holds 7"):
                buf.sample(8)
            open(go, "w").close()
            assert buf.sample(7, timeout=60)["x"].tolist() == [0, 1, 2, 3, 100, 101, 102]
            proc.join(60)
            assert proc.exitcode == 0
        finally:
            proc.kill()
            proc.join(30)
    with oldest(name + "-dead", 16) as buf:
        buf.extend({"x": np.arange(4)})
        proc = start_hanging_writer(name + "-dead", "writing", tmp_path, rows=3)
        proc.kill()
        proc.join(30)
        with pytest.raises(ValueError, match="cannot sample the 5 oldest rows: the buffer holds 7 rows, 4 of them "
                                             "published, and no live writer is writing the others"):
            buf.sample(5, timeout=60)


def test_every_handle_of_the_buffer_and_its_saves_sample_oldest_first(name, tmp_path):
    with oldest(name) as buf:
        buf.extend({"x": np.arange(5)})
        with shmbuf.Buffer.attach(name) as other:
            assert type(other.sampler) is Oldest and other.sample(2)["x"].tolist() == [0, 1]
        buf.save(tmp_path / "save")
        with shmbuf.Buffer.load(tmp_path / "save", name=name + "-back") as back:
            assert type(back.sampler) is Oldest and back.sample(2)["x"].tolist() == [0, 1]


def test_create_checks_the_options(name):
    with pytest.raises(ValueError, match=r"sampler 'oldest' takes no options, got \['n'\]"):
        shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name, sampler=("oldest", {"n": 1}))
    with pytest.raises(ValueError, match="do not go together"):
        shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name, sampler="oldest", mode="queue")
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name, sampler=("oldest", {})) as buf:
        buf.extend({"x": np.arange(3)})
        assert type(buf.sampler) is Oldest and buf.sample(2)["x"].tolist() == [0, 1]


def test_storm_writers_and_oldest_first_samplers_never_see_a_torn_row(name):
    """Two writers wrap a small ring while two processes sample its oldest rows, the very
    rows the writers overwrite next: every row they get is whole (its fields from one
    write). The deterministic proofs that the check is what keeps torn rows out are the
    planted row and the writer stopped between the draw and the copy above."""
    ctx = mp.get_context("spawn")
    with shmbuf.Buffer.create(STORM, 64, name=name, sampler="oldest") as buf:
        buf.extend(storm_rows(9, np.arange(64)))
        sampled, _ = writers_and_samplers(name, ctx)
    assert all(torn == 0 for _, torn in sampled), sampled
    assert sum(checked for checked, _ in sampled) > 0

"""save / load: round trips, saves beside writers and samplers, damaged saves."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import time

import numpy as np
import pytest

import shmbuf
from shmbuf.core import segment
from shmbuf.persist import save as persist

import helpers

CTX = mp.get_context("spawn")


def _ours(name: str) -> list[str]:
    return [n for n in segment.list_names() if n.startswith(name)]


def test_buffer_round_trip_same_rows_order_and_samples(name, tmp_path):
    fields = {"x": ((2,), "float32"), "t": ((), "int64"), "ok": ((), bool)}
    with shmbuf.Buffer.create(fields, 16, lanes=2, name=name, seed=5) as a:
        for i in range(27):
            a.add({"x": [i, -i], "t": i, "ok": i % 3 == 0}, lane=i % 2)
        a.sample(3)
        summary = a.save(tmp_path / "s")
        assert summary["rows"] == 16 and summary["rows_left_out"] == 0 and summary["bytes"] > 0
        expected = [a.sample(10)["t"].tolist() for _ in range(3)] + [a.sample_sequences(4, 3)["t"].tolist()]
        with shmbuf.Buffer.load(tmp_path / "s", name=name + "b", restore_rng=True) as b:
            got = [b.sample(10)["t"].tolist() for _ in range(3)] + [b.sample_sequences(4, 3)["t"].tolist()]
            assert got == expected
            assert b.fields == a.fields and b.lane_sizes() == a.lane_sizes() and b.total_added == a.total_added
            assert (b.engine.ring.stamps == a.engine.ring.stamps).all()  # same slots, same sequence numbers
            assert b.sample(5)["ok"].dtype == np.bool_
            b.add({"x": [0, 0], "t": 100, "ok": True}, lane=0)  # writes go on after the saved rows
            assert b.sample_sequences(1, 8)["t"].shape == (1, 8)


def test_load_defaults_to_the_saved_name_and_refuses_a_taken_one(name, tmp_path):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name) as a:
        a.extend({"x": np.arange(3)})
        a.save(tmp_path / "s")
        with pytest.raises(FileExistsError):
            shmbuf.Buffer.load(tmp_path / "s")  # the saved name is a's, still live
        assert len(a) == 3 and sorted(set(a.sample(100)["x"].tolist())) == [0, 1, 2]
    with shmbuf.Buffer.load(tmp_path / "s") as b:  # a is gone: its name is free
        assert b.name == name and len(b) == 3 and not b.persist


def test_save_refuses_an_existing_path_unless_overwrite(name, tmp_path):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name) as a:
        a.extend({"x": np.arange(2)})
        a.save(tmp_path / "s")
        a.extend({"x": np.arange(2)})
        with pytest.raises(FileExistsError, match="overwrite=True"):
            a.save(tmp_path / "s")
        a.save(tmp_path / "s", overwrite=True)
        (tmp_path / "other").mkdir()
        with pytest.raises(FileExistsError, match="not a shmbuf save"):
            a.save(tmp_path / "other", overwrite=True)
    assert persist.read(tmp_path / "s")["heads"].tolist() == [4]
    assert sorted(os.listdir(tmp_path)) == ["other", "s"]  # no temporary directory left


def test_episode_buffer_round_trip(name, tmp_path):
    fields = helpers.EPISODE_FIELDS
    with shmbuf.EpisodeBuffer.create(fields, 64, lanes=2, name=name) as a:
        with a.writer(envs=2) as w:
            for t in range(30):
                w.add({"obs": np.full((2, 2), t), "action": [t, t], "reward": [1.0, 2.0],
                       "next_obs": np.full((2, 2), t + 1)},
                      terminated=[t % 7 == 6, False], truncated=[False, t % 11 == 10])
            a.save(tmp_path / "e")  # an episode in progress in each lane, too
        with shmbuf.EpisodeBuffer.attach(name, seed=3) as a2, \
                shmbuf.EpisodeBuffer.load(tmp_path / "e", name=name + "b", seed=3) as b:
            assert b.num_episodes == a2.num_episodes and len(b) == len(a2)
            for x, y in [(a2.sample(50, n_step=3, gamma=0.5), b.sample(50, n_step=3, gamma=0.5)),
                         (a2.sample_trajectories(6, 4), b.sample_trajectories(6, 4))]:
                assert x.keys() == y.keys()
                for k in x:
                    np.testing.assert_array_equal(x[k], y[k])
            ea, eb = a2.sample_episodes(5), b.sample_episodes(5)
            assert [e["action"].tolist() for e in ea] == [e["action"].tolist() for e in eb]
            with b.writer(envs=2) as w:  # new episodes get new numbers: none joins a saved one
                w.add({"obs": np.zeros((2, 2)), "action": [99, 99], "reward": [0.0, 0.0],
                       "next_obs": np.zeros((2, 2))}, terminated=[True, True], truncated=[False, False])
            assert b.num_episodes == a2.num_episodes + 2
        with pytest.raises(ValueError, match="not of an episode buffer"):
            shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name + "c").save(tmp_path / "plain")
            shmbuf.EpisodeBuffer.load(tmp_path / "plain", name=name + "d")
    assert not _ours(name)


def test_prioritized_round_trip_keeps_priorities_and_weights(name, tmp_path):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 64, priority=0.6, name=name, seed=1) as a:
        a.extend({"x": np.arange(40)}, priority=np.arange(1, 41))
        b0 = a.sample(16)
        a.update_priorities(b0["index"], np.linspace(0.1, 50, 16))
        a.extend({"x": np.arange(40, 48)})  # not synced into the trees yet: their own priority
        a.save(tmp_path / "p")
        expected = a.sample(200, beta=0.5)
        with shmbuf.Buffer.load(tmp_path / "p", name=name + "b", restore_rng=True) as b:
            got = b.sample(200, beta=0.5)
            for k in ("x", "weight", "index"):
                np.testing.assert_array_equal(got[k], expected[k])
            assert b.update_priorities(got["index"][:3], [1.0, 1.0, 1.0]) == 3


def test_rate_limit_counters_are_saved(name, tmp_path):
    rate = shmbuf.RateLimit(min_size=2, samples_per_insert=1.0, error_buffer=4.0)
    with shmbuf.Buffer.create({"x": ((), "int64")}, 16, rate=rate, name=name) as a:
        a.extend({"x": np.arange(4)})
        a.sample(3)
        a.save(tmp_path / "r")
    with shmbuf.Buffer.load(tmp_path / "r", name=name) as b:
        assert b.parts.specs["rate"] == rate.to_meta() and b.meta == {}  # (the library's part, not the user's)
        b.sample(1)  # 4 inserted, 3 + 1 sampled: within the limit
        with pytest.raises(shmbuf.RateLimitTimeout):
            b.sample(4, timeout=0.05)  # 4 inserted, 8 sampled: past the error buffer


def test_an_interrupted_save_leaves_nothing_behind(name, tmp_path, monkeypatch):
    def interrupt(self, nbytes):
        raise KeyboardInterrupt
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name) as a:
        a.extend({"x": np.arange(8)})
        monkeypatch.setattr(persist.Progress, "__call__", interrupt)
        with pytest.raises(KeyboardInterrupt):
            a.save(tmp_path / "s")
    assert os.listdir(tmp_path) == []


@pytest.mark.both_storages
@pytest.mark.timeout(120)
def test_a_save_killed_midway_never_loads(name, tmp_path):
    with shmbuf.Buffer.create({"x": ((1000,), "float64")}, 20_000, name=name) as a:
        a.extend({"x": np.ones((20_000, 1000))})
        dest, flag = tmp_path / "s", str(tmp_path / "flag")
        helpers.kill_when_there(helpers.save_and_hang, (name, str(dest), flag), flag, "the save never started")
        os.unlink(flag)
        assert not dest.exists()
        with pytest.raises(FileNotFoundError):
            shmbuf.Buffer.load(dest, name=name + "b")
        (left,) = [p for p in tmp_path.iterdir()]  # its temporary directory: no metadata, never loads
        with pytest.raises(ValueError, match="shmbuf.json is missing"):
            shmbuf.Buffer.load(left, name=name + "b")
    assert not _ours(name)


# -- damaged saves ------------------------------------------------------------------------


def _saved(name, tmp_path):
    with shmbuf.Buffer.create({"obs": ((3,), "float32"), "a": ((), "int64")}, 8, name=name) as a:
        a.extend({"obs": np.ones((5, 3)), "a": np.arange(5)})
        a.save(tmp_path / "s")
    return tmp_path / "s"


def _edit_meta(d, edit):
    meta = json.loads((d / "shmbuf.json").read_text())
    edit(meta)
    (d / "shmbuf.json").write_text(json.dumps(meta))


def _truncate(d):
    f = d / "field-001.npy"
    f.write_bytes(f.read_bytes()[:-9])


def _pickle_as_npy(d):
    (d / "field-001.npy").write_bytes(pickle.dumps(np.arange(8)))


def _object_npy(d):
    np.save(d / "field-001.npy", np.array([object()] * 8), allow_pickle=True)


def _edited_npy_shape(d):
    np.save(d / "field-001.npy", np.arange(9))


def _bad_stamps(d):
    s = np.load(d / "stamps.npy")
    s[0] = 2 * 5 + 2  # names row 5 in slot 0
    np.save(d / "stamps.npy", s)


DAMAGE = {
    "missing metadata": (lambda d: (d / "shmbuf.json").unlink(), "shmbuf.json is missing"),
    "metadata not json": (lambda d: (d / "shmbuf.json").write_text("{"), "not JSON"),
    "other version": (lambda d: _edit_meta(d, lambda m: m.update(format_version=99)), "format version 99"),
    "not a save": (lambda d: _edit_meta(d, lambda m: m.update(format="x")), "format"),
    "wrong dtype in metadata": (lambda d: _edit_meta(d, lambda m: m["fields"][1].update(dtype="<f4")), "holds int64"),
    "object dtype in metadata": (lambda d: _edit_meta(d, lambda m: m["fields"][1].update(dtype="|O")), "bad schema"),
    "edited shape in metadata": (lambda d: _edit_meta(d, lambda m: m["fields"][0].update(shape=[4])), "field-000.npy holds"),
    "edited capacity": (lambda d: _edit_meta(d, lambda m: m.update(capacity=9)), "holds"),
    "bad heads": (lambda d: _edit_meta(d, lambda m: m["lanes_state"].update(head=[-1])), "lanes_state.head"),
    "file outside": (lambda d: _edit_meta(d, lambda m: m["fields"][1].update(file="../x.npy")), "plain .npy"),
    "missing array": (lambda d: (d / "field-001.npy").unlink(), "field-001.npy is missing"),
    "truncated array": (_truncate, "not a readable .npy"),
    "pickle disguised as npy": (_pickle_as_npy, "not a readable .npy"),
    "object array": (_object_npy, "not a readable .npy"),
    "edited array shape": (_edited_npy_shape, "holds int64 \\(9,\\)"),
    "stamps naming other slots": (_bad_stamps, "name no row of their slot"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_saves_give_clear_errors_and_create_nothing(name, tmp_path, damage):
    d = _saved(name, tmp_path)
    edit, why = DAMAGE[damage]
    edit(d)
    with pytest.raises(ValueError, match=why):
        shmbuf.Buffer.load(d, name=name)
    assert not _ours(name)


def test_files_the_format_does_not_name_are_ignored(name, tmp_path):
    d = _saved(name, tmp_path)
    (d / "notes.txt").write_text("hello")
    np.save(d / "field-007.npy", np.arange(3))
    with shmbuf.Buffer.load(d, name=name) as b:
        assert len(b) == 5


# -- beside writers and samplers ---------------------------------------------------------------


def test_a_save_does_not_block_writers_and_keeps_only_rows_published_before_it(name, tmp_path, monkeypatch):
    """Deterministic: the save stops after its first chunk; meanwhile another process
    writes (with a short timeout) and samples. Those rows are not in the save."""
    with shmbuf.Buffer.create({"x": ((), "int64")}, 64, name=name) as a:
        a.extend({"x": np.arange(20)})
        calls = []

        def during(self, nbytes):
            if not calls:
                p = CTX.Process(target=helpers.write_range, args=(name, 100, 110))
                p.start()
                p.join(60)
                calls.append(p.exitcode)
        monkeypatch.setattr(persist.Progress, "__call__", during)
        a.save(tmp_path / "s")
        assert calls == [0]
        assert len(a) == 30
    with shmbuf.Buffer.load(tmp_path / "s", name=name) as b:
        assert len(b) == 20 and set(b.sample(500)["x"].tolist()) == set(range(20))


@pytest.mark.timeout(120)
def test_save_during_a_storm_holds_only_whole_published_rows_in_lane_order(name, tmp_path):
    n_writers = 2
    with shmbuf.Buffer.create(helpers.STORM, 4096, lanes=n_writers, name=name) as buf:
        ready, stop, results = CTX.Event(), CTX.Event(), CTX.Queue()
        procs = [CTX.Process(target=helpers.storm_writer, args=(name, w, 16, 30, ready, stop, results))
                 for w in range(n_writers)]
        procs.append(CTX.Process(target=helpers.storm_sampler, args=(name, 3, ready, results)))
        for p in procs:
            p.start()
        try:
            while len(buf) < buf.capacity:
                assert all(p.is_alive() for p in procs)
                ready.set()
                time.sleep(0.05)
            saves = []
            for i in range(6):
                saves.append(buf.save(tmp_path / f"s{i}"))
        finally:
            stop.set()
            for p in procs:
                p.join(60)
        assert [p.exitcode for p in procs] == [0] * len(procs)
        assert sum(s["rows"] for s in saves) > 0
        for i, s in enumerate(saves):
            got = persist.read(tmp_path / f"s{i}")
            stamps = np.asarray(got["stamps"])
            kept = np.flatnonzero(stamps)
            rows = {k: np.asarray(v)[kept] for k, v in got["data"].items()}
            assert helpers.storm_torn(rows) == 0
            key = rows["a"][:, 0]
            seq = stamps[kept] // 2 - 1
            assert (key % 1_000_000_000 == seq).all()  # each row is the one its stamp names
            lane = kept // buf.lane_capacity
            for la in range(n_writers):  # one writer per lane, rows in its write order
                assert len(set((key[lane == la] // 1_000_000_000).tolist())) <= 1
            heads = got["heads"]
            assert (seq < heads[lane]).all() and (seq >= heads[lane] - buf.lane_capacity).all()
            with shmbuf.Buffer.load(tmp_path / f"s{i}", name=f"{name}-l{i}") as b:
                if s["rows"]:
                    assert helpers.storm_torn(b.sample(500)) == 0
                else:  # (a save that kept no row: every row was overwritten while it copied)
                    with pytest.raises(ValueError, match="empty buffer"):
                        b.sample(1)


# -- round 2: holes, temporaries, sizes, nesting, links, permissions -----------------

X = {"x": ((), "int64")}


@pytest.mark.both_storages
def test_a_loaded_lane_holds_exactly_the_published_rows_consecutively(name, tmp_path):
    """Round 2, item 7: a save taken while a writer was stopped inside its write (its 2
    rows reserved in the middle of the lane, rows written after them) leaves those rows
    out; the loaded lane closes the hole: every row it counts is published, in order, so
    a sequence as long as the buffer can be sampled (before: "no published rows ...
    reserved by a writer that died")."""
    with shmbuf.Buffer.create(X, 32, name=name, seed=0) as buf:
        buf.extend({"x": np.arange(6)})
        helpers.kill_when_there(helpers.write_and_hang, (name, "writing", str(tmp_path / "w"), None, 2),
                                tmp_path / "w", "the writer to stop inside its write")
        buf.extend({"x": np.arange(6, 14)})
        got = buf.save(tmp_path / "s")
        assert got["rows"] == 14 and got["rows_left_out"] == 2
        with pytest.raises(ValueError, match="no lane holds 14 consecutive published rows: the longest run "
                                             "of published rows is 8, and 2 rows"):
            buf.sample_sequences(1, 14, timeout=1.0)  # (the live buffer: the error says what is true)
    with shmbuf.Buffer.load(tmp_path / "s", name=name + "-l") as b:
        assert len(b) == 14 and b.lane_sizes() == [14]
        assert b.sample_sequences(3, 14)["x"].tolist() == [list(range(14))] * 3
        stamps = b.engine.ring.stamps[:14]
        assert (stamps == 2 * np.arange(14) + 2).all() and (b.engine.ring.stamps[14:] == 0).all()
        assert b.state_dict()["heads"].tolist() == [14]


@pytest.mark.both_storages
def test_a_loaded_episode_lane_closes_the_hole_of_a_writer_that_died(name, tmp_path):
    """The same for an episode buffer: episode A's writer died inside its 4th step; a new
    writer then wrote episode B into the lane. Loaded, B's rows move down over the hole and
    their episode moves with them: B is whole, its steps and returns as written, and A (cut
    short by its writer's death) ends at its third step."""
    fields = {"obs": ((1,), "float32"), "reward": ((), "float32")}
    with shmbuf.EpisodeBuffer.create(fields, 16, name=name, seed=0) as buf:
        helpers.kill_when_there(helpers.episode_steps_then_hang_in_write, (name, str(tmp_path / "w"), 3),
                                tmp_path / "w", "the episode writer to stop inside its write")
        with buf.writer() as w:
            w.add_episode({"obs": [[10], [11], [12], [13]], "reward": [1, 2, 4, 8], "next_obs": [14]})
        buf.save(tmp_path / "s")
    with shmbuf.EpisodeBuffer.load(tmp_path / "s", name=name + "-l") as b:
        assert len(b.core) == 8  # A's 3 steps, B's 4 and its final row: no hole
        (ep,) = b.sample_episodes(1)
        assert ep["obs"][:, 0].tolist() == [10, 11, 12, 13] and ep["next_obs"][-1].tolist() == [14]
        t = b.sample_trajectories(200, 4)
        ends = {int(o): (ts.tolist(), r.tolist()) for o, ts, r in
                zip(t["obs"][:, -1, 0], t["timestep"], t["returns_to_go"])}
        assert ends[13] == ([1, 2, 3, 4], [15, 14, 12, 8]) and ends[10] == ([0, 0, 0, 1], [0, 0, 0, 15])
        assert set(ends) <= {0, 1, 10, 11, 12, 13}


def test_temporaries_of_a_killed_save_are_cleared_by_the_next_save_and_gc(name, tmp_path):
    """Round 2, item 9: a save SIGKILLed while writing leaves its hidden temporary
    directory; the next save into the same parent removes it (its save files only), and
    so does ``shmbuf gc DIR``. A live process's temporary and other files are left."""
    with shmbuf.Buffer.create(X, 64, name=name, seed=0) as buf:
        buf.extend({"x": np.arange(64)})
        helpers.kill_when_there(helpers.save_and_hang, (name, str(tmp_path / "s0"), str(tmp_path / "f0")),
                                tmp_path / "f0", "the save to stop while writing")
        (left,) = persist.temporaries(tmp_path)
        assert left.name.startswith(".s0.shmbuf-tmp-") and any(left.iterdir())
        (left / "notes.txt").write_text("not a save file")
        dead = tmp_path / f".x.shmbuf-tmp-{os.getpid()}-0.000-0123abcd"  # (this pid, another start: dead)
        live = tmp_path / f".y.shmbuf-tmp-{os.getpid()}-{helpers.start_time():.3f}-0123abcd"
        for d in (dead, live):
            d.mkdir()
            (d / "stamps.npy").write_bytes(b"x")
        buf.save(tmp_path / "s")
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["s", left.name, live.name, "f0"])
        assert [p.name for p in left.iterdir()] == ["notes.txt"]  # its save files went, not the rest
        (left / "notes.txt").unlink()  # (the next save removes the empty directory)
        helpers.kill_when_there(helpers.save_and_hang, (name, str(tmp_path / "s9"), str(tmp_path / "f9")),
                                tmp_path / "f9", "the save to stop while writing")
    assert not left.exists()
    res = helpers.cli("gc", "--dry-run", str(tmp_path))
    assert res.returncode == 0 and res.stdout.count("would remove") == 1 and ".s9.shmbuf-tmp-" in res.stdout
    res = helpers.cli("gc", str(tmp_path))
    assert res.returncode == 0 and "removed 1 temporary directory" in res.stdout, res.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["s", live.name, "f0", "f9"])
    res = helpers.cli("gc", str(tmp_path / "nothing"))
    assert res.returncode == 1 and "not a directory" in res.stderr


def test_a_save_claiming_a_huge_buffer_is_refused_from_its_metadata(name, tmp_path, monkeypatch):
    """Round 2, item 10: a few kB of sparse .npy files claiming 2**27 rows (2 GiB of
    segment) where /dev/shm has 256 MiB free: refused with ShmSpaceError before any array
    is built; the process's peak memory does not grow (before: the load built
    capacity-sized arrays first; with 2**31 rows it was killed for memory)."""
    import resource

    from numpy.lib import format as npformat

    monkeypatch.setattr(segment, "free_bytes", lambda path=segment.SHM_DIR: 256 << 20)  # (whatever this machine has)

    with shmbuf.Buffer.create(X, 8, name=name) as buf:
        buf.extend({"x": np.arange(8)})
        buf.save(tmp_path / "s")
    d = tmp_path / "s"
    meta = json.loads((d / "shmbuf.json").read_text())
    big = 2**27
    meta["capacity"] = big
    (d / "shmbuf.json").write_text(json.dumps(meta))
    for f, dtype in (("stamps.npy", np.int64), ("field-000.npy", np.int64)):
        with open(d / f, "wb") as out:
            npformat.write_array_header_2_0(out, {"descr": "<i8", "fortran_order": False, "shape": (big,)})
            out.truncate(out.tell() + big * 8)  # sparse: 16 GiB claimed, nothing on disk
    assert sum(f.stat().st_blocks for f in d.iterdir()) * 512 < 1 << 20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # (KiB)
    with pytest.raises(segment.ShmSpaceError, match="needs 2,147,"):
        shmbuf.Buffer.load(d, name=name)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 256 << 10
    assert not _ours(name)


def test_deeply_nested_metadata_is_a_clear_error(name, tmp_path):
    """Round 2, item 11: a shmbuf.json nested 100,000 levels deep (in the file, or in its
    meta) is a ValueError from load and one line from ``shmbuf load``."""
    with shmbuf.Buffer.create(X, 8, name=name) as buf:
        buf.extend({"x": np.arange(8)})
        buf.save(tmp_path / "s")
    meta = (tmp_path / "s" / "shmbuf.json").read_text()
    deep = "[" * 100_000 + "]" * 100_000
    assert '"user": {}' in meta  # (the user's meta, where the deep value goes)
    for where, text in (("file", deep), ("meta", meta.replace('"user": {}', '"user": {"a": ' + deep + "}", 1))):
        (tmp_path / "s" / "shmbuf.json").write_text(text)
        with pytest.raises(ValueError, match="not a loadable shmbuf save"):
            shmbuf.Buffer.load(tmp_path / "s", name=name)
        res = helpers.cli("load", str(tmp_path / "s"), name)
        assert res.returncode == 1 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, (where, res.stderr)
    assert not _ours(name)


def test_overwrite_never_writes_through_a_link_nor_deletes_what_is_not_a_save(name, tmp_path):
    """Round 2, item 13: save(overwrite=True) onto a symbolic link (to a save, or to any
    directory) is refused and changes nothing; a save directory holding other files is
    not replaced (that would delete them)."""
    with shmbuf.Buffer.create(X, 8, name=name) as buf:
        buf.extend({"x": np.arange(8)})
        buf.save(tmp_path / "real")
        other = tmp_path / "other"
        other.mkdir()
        (other / "keep.txt").write_text("mine")
        for target in (tmp_path / "real", other):
            link = tmp_path / f"link-{target.name}"
            link.symlink_to(target)
            before = sorted(p.name for p in target.iterdir())
            with pytest.raises(FileExistsError, match="symbolic link"):
                buf.save(link, overwrite=True)
            assert link.is_symlink() and sorted(p.name for p in target.iterdir()) == before
        (tmp_path / "real" / "notes.txt").write_text("not part of the save")
        with pytest.raises(FileExistsError, match="notes.txt"):
            buf.save(tmp_path / "real", overwrite=True)
        assert (tmp_path / "real" / "notes.txt").read_text() == "not part of the save"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["link-other", "link-real", "other", "real"]


def test_saves_are_readable_by_their_owner_alone(name, tmp_path):
    """Round 2, item 16: the directory 0700 and every file 0600 whatever the umask, like
    the segment (0600); on every path that writes them (save, shmbuf save, HDF5 export is
    tested with the extras)."""
    old = os.umask(0o002)
    try:
        with shmbuf.Buffer.create(X, 8, name=name, priority=0.6) as buf:
            buf.extend({"x": np.arange(8)})
            buf.sample(2)
            buf.save(tmp_path / "s")
            res = helpers.cli("save", name, str(tmp_path / "c"))
            assert res.returncode == 0, res.stderr
    finally:
        os.umask(old)
    for d in (tmp_path / "s", tmp_path / "c"):
        assert d.stat().st_mode & 0o777 == 0o700
        files = {f.name: f.stat().st_mode & 0o777 for f in d.iterdir()}
        assert "priority.npy" in files and set(files.values()) == {0o600}, files


def test_a_save_loads_into_a_file(name, tmp_path):
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name) as buf:
        buf.extend({"x": np.arange(6)})
        buf.save(str(tmp_path / "save"), progress=False)
    p = str(tmp_path / "loaded.shmbuf")
    with shmbuf.Buffer.load(str(tmp_path / "save"), name=p, progress=False) as back:
        assert back.name == p and len(back) == 6
    with shmbuf.Buffer.attach(p) as again:
        assert set(again.sample(200)["x"].tolist()) == set(range(6))
        again.unlink()


def test_a_save_gives_back_the_users_meta_as_given_and_the_capabilities_as_made(name, tmp_path):
    """Trust round 4, item 2: load passed the saved meta, the user's keys and the
    library's in one dict, back to create as meta=, so a user's {"sampler": "newest"}
    or {"versions": True} became a capability on load (and the library's settings came
    back in the user's meta). Now each goes back where it came from."""
    user = {"sampler": "newest", "versions": True, "note": [1, {"a": None}]}
    with shmbuf.Buffer.create({"x": ((), "int64")}, 16, name=name, seed=0, meta=user, max_times_sampled=2) as a:
        a.extend({"x": np.arange(10)})
        a.save(tmp_path / "s")
    with shmbuf.Buffer.load(tmp_path / "s", name=name) as b:
        assert b.meta == user
        assert (b.max_times_sampled, b.versioned, type(b.sampler).__name__) == (2, False, "Limited")
        b.add({"x": 10})
        assert len(b) == 11


def test_a_save_of_the_previous_format_loads_as_it_was_made(name, tmp_path):
    """Format 1 kept one flat meta, read by the library whole: such a save loads with the
    capabilities it was made with, its whole meta the user's (as before); a format it
    never wrote is refused, naming it."""
    flat = {"sampler": "newest", "run": 7}
    with shmbuf.Buffer.create({"x": ((), "int64")}, 8, name=name, sampler="newest") as a:
        a.extend({"x": np.arange(8)})
        a.save(tmp_path / "s")
    _edit_meta(tmp_path / "s", lambda m: m.update(format_version=1, meta=flat))
    with shmbuf.Buffer.load(tmp_path / "s", name=name) as b:
        assert b.meta == flat and type(b.sampler).__name__ == "Newest"
        assert sorted(b.sample(3)["x"].tolist()) == [5, 6, 7]
    mixed = {"sampler": "uniform", "parts": {"sampler": {"name": "newest", "options": {}}}}  # (a user's "parts")
    _edit_meta(tmp_path / "s", lambda m: m.update(format_version=1, meta=mixed))
    with shmbuf.Buffer.load(tmp_path / "s", name=name) as b:
        assert b.meta == mixed and type(b.sampler).__name__ == "Uniform" and b.parts.specs == {}
    _edit_meta(tmp_path / "s", lambda m: m.update(format_version=2, meta={"sampler": "newest", "user": {"run": 7}}))
    with shmbuf.Buffer.load(tmp_path / "s", name=name) as b:
        assert b.meta == {"run": 7} and type(b.sampler).__name__ == "Newest"
    _edit_meta(tmp_path / "s", lambda m: m.update(format_version=2, meta=flat))
    with pytest.raises(ValueError, match="meta has no object under 'user'"):
        shmbuf.Buffer.load(tmp_path / "s", name=name)
    _edit_meta(tmp_path / "s", lambda m: m.update(format_version=0))
    with pytest.raises(ValueError, match="format version 0; this shmbuf .* reads versions 1 to 4"):
        shmbuf.Buffer.load(tmp_path / "s", name=name)
    assert not _ours(name)

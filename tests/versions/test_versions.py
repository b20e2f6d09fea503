"""Policy versions (Buffer.create(versions=True)): a version per row, samples by staleness
(both paths: scripts/test runs this file on each)."""

from __future__ import annotations

import numpy as np
import pytest

import shmbuf

from helpers import cli
from shmbuf.core.layout import published

X = {"x": ((), "int64")}


def versioned(name, capacity=64, **kw):
    return shmbuf.Buffer.create(X, capacity, name=name, versions=True, seed=0, **kw)


def fill(buf, versions, per=4, lane=None):
    """``per`` rows of each version, x = 10 * version + i."""
    for v in versions:
        buf.extend({"x": 10 * v + np.arange(per)}, version=v, lane=lane)


def test_rows_carry_their_version_through_samples_saves_and_state(name, tmp_path):
    with versioned(name) as buf:
        buf.add({"x": 7}, version=1)
        fill(buf, [2, 3])
        b = buf.sample(200)
        assert set(b["version"].tolist()) == {1, 2, 3}
        assert (b["version"] == np.where(b["x"] == 7, 1, b["x"] // 10)).all()
        assert buf.fields["version"] == ((), np.dtype(np.int64))
        state = buf.state_dict()
        buf.save(tmp_path / "save")
        with shmbuf.Buffer.load(tmp_path / "save", name=name + "-back") as back:
            assert sorted(set(back.sample(100, min_version=3)["x"].tolist())) == [30, 31, 32, 33]
            back.add({"x": 40}, version=4)  # a new handle: its own versions go on
        with shmbuf.Buffer.create(buf.fields, 64, name=name + "-state") as other:
            other.load_state_dict(state)
            assert set(other.sample(100)["version"].tolist()) == {1, 2, 3}


def test_the_window_is_exact_at_its_edges(name):
    with versioned(name) as buf:
        fill(buf, [1, 2, 3, 4, 5])
        for v in range(1, 6):
            assert set(buf.sample(300, min_version=v)["version"].tolist()) == set(range(v, 6))
        assert set(buf.sample(300, max_staleness=0)["version"].tolist()) == {5}
        assert set(buf.sample(300, max_staleness=2)["version"].tolist()) == {3, 4, 5}
        assert set(buf.sample(300, max_staleness=1, version=3)["version"].tolist()) == {2, 3, 4, 5}
        assert set(buf.sample(300, max_staleness=9)["version"].tolist()) == {1, 2, 3, 4, 5}
        assert set(buf.sample(300, min_version=2)["version"].tolist()) == {2, 3, 4, 5}  # (the bound goes back)
        with pytest.raises(shmbuf.SampleTimeout, match=r"no row has a version >= 6 \(the buffer holds 20 rows, "
                                                         r"the newest of version 5\)"):
            buf.sample(1, min_version=6, timeout=0.05)


def test_lanes_each_keep_their_own_recent_rows_and_old_rows_leave_the_ring(name):
    with versioned(name, capacity=32, lanes=4) as buf:  # 8 rows a lane
        for lane in range(4):
            w = shmbuf.Buffer.attach(name)
            fill(w, [lane + 1, lane + 5], per=4, lane=lane)
            w.close()
        assert set(buf.sample(500, min_version=5)["version"].tolist()) == {5, 6, 7, 8}
        assert set(buf.sample(500, min_version=4)["version"].tolist()) == {4, 5, 6, 7, 8}
        w = shmbuf.Buffer.attach(name)
        fill(w, [9, 10], per=4, lane=0)  # lane 0's rows of versions 1 and 5 are overwritten
        w.close()
        got = buf.sample(500, min_version=5)
        assert set(got["version"].tolist()) == {6, 7, 8, 9, 10}
        assert set(got["x"][got["version"] == 9].tolist()) == {90, 91, 92, 93}


def test_writes_without_a_version_or_going_backwards_change_nothing(name):
    with versioned(name) as buf:
        fill(buf, [3])
        before = buf.total_added
        for bad, match in [({}, "pass version= to add/extend, or bind"),
                           ({"version": 2}, "versions never go backwards: this handle wrote version 3, got 2"),
                           ({"version": -1}, r"version must be an int >= 0, got -1"),
                           ({"version": 1.5}, r"version must be an int >= 0, got 1.5"),
                           ({"version": True}, r"version must be an int >= 0, got True"),
                           ({"version": "4"}, r"version must be an int >= 0, got '4'")]:
            with pytest.raises(ValueError, match=match):
                buf.add({"x": 1}, **bad)
            with pytest.raises(ValueError, match=match):
                buf.extend({"x": [1, 2]}, **bad)
        with pytest.raises(ValueError, match="'version' is kept by shmbuf"):
            buf.add({"x": 1, "version": 4}, version=4)
        assert buf.total_added == before
        state = buf.engine.rng.bit_generator.state
        for bad, match in [({"min_version": -2}, "min_version must be an int >= 0"),
                           ({"max_staleness": 1.0}, "max_staleness must be an int >= 0"),
                           ({"min_version": 1, "max_staleness": 1}, "pass min_version= alone"),
                           ({"min_version": 1, "beta": 0.4}, "are for a replay buffer without priority=")]:
            with pytest.raises(ValueError, match=match):
                buf.sample(4, **bad)
        assert buf.engine.rng.bit_generator.state == state


def test_a_buffer_without_versions_says_so(name):
    with shmbuf.Buffer.create(X, 8, name=name) as buf:
        buf.add({"x": 1})
        with pytest.raises(ValueError, match="version= is for a buffer created with versions=True"):
            buf.add({"x": 1}, version=1)
        with pytest.raises(ValueError, match="are for a buffer created with versions=True"):
            buf.sample(1, max_staleness=1)
        with pytest.raises(ValueError, match="bind\\(\\) is for a buffer created with versions=True"):
            buf.bind(None)
    with pytest.raises(ValueError, match="without 'version'"):
        shmbuf.Buffer.create({"version": ((), "int64")}, 8, name=name, versions=True)
    with pytest.raises(TypeError, match="versions must be True or False"):
        shmbuf.Buffer.create(X, 8, name=name, versions=1)


def test_a_bound_weights_gives_the_version_and_the_newest(name):
    with versioned(name) as buf, shmbuf.Weights.create(name + "-w", {"w": np.zeros(2)}) as weights:
        weights.publish({"w": np.ones(2)})  # version 1
        buf.bind(weights)
        buf.extend({"x": [10, 11]})
        weights.publish({"w": np.ones(2)})
        weights.publish({"w": np.ones(2)})  # version 3
        buf.add({"x": 30})
        assert sorted(set(buf.sample(100)["version"].tolist())) == [1, 3]
        assert set(buf.sample(100, max_staleness=0)["x"].tolist()) == {30}
        assert set(buf.sample(100, max_staleness=2)["x"].tolist()) == {10, 11, 30}
        weights.unlink()


def test_a_row_being_written_never_comes_out(name, break_protection):
    """Row 12 (version 4) planted as a writer killed mid-copy leaves it: a sample of recent
    rows never returns it; with the read path's stamp check off it does."""
    with versioned(name) as buf:
        fill(buf, [1, 2, 3, 4])
        ring = buf.engine.ring
        ring.stamps[12] = published(12) - 1
        ring.arrays["x"][12] = -7
        assert -7 not in buf.sample(500, min_version=4)["x"].tolist()
        break_protection("stamp check")
        assert -7 in buf.sample(500, min_version=4)["x"].tolist()


def test_stats_and_shmbuf_stat_say_each_lanes_newest_version_and_the_sampled_staleness(name):
    with versioned(name, capacity=16, lanes=2) as buf:
        fill(buf, [2, 5], per=2, lane=1)
        stats = buf.stats()
        assert [d["newest_version"] for d in stats["lanes"]] == [None, 5] and stats["sampled_staleness"] is None
        b = buf.sample(50, max_staleness=3)  # versions 2 (staleness 3) and 5 (0)
        want = {"rows": 50, "mean": float((5 - b["version"]).mean()), "max": int((5 - b["version"]).max())}
        assert buf.stats()["sampled_staleness"] == want and want["max"] == 3
        buf.sample(10)  # (a sample that asks nothing of versions is not counted)
        assert buf.stats()["sampled_staleness"] == want
        out = cli("stat", name).stdout
        assert f"staleness of the rows sampled by version: mean {want['mean']:.2f}, max 3 (50 rows)" in out
        lines = out.splitlines()
        head = next(i for i, line in enumerate(lines) if line.startswith("LANE"))
        assert lines[head].split()[-1] == "VERSION" and lines[head + 1].split()[-1] == "-" \
            and lines[head + 2].split()[-1] == "5"
    with shmbuf.Buffer.create(X, 8, name=name + "-plain") as plain:
        assert "newest_version" not in plain.stats()["lanes"][0] and "sampled_staleness" not in plain.stats()
        assert "VERSION" not in cli("stat", name + "-plain").stdout


def test_a_queues_lag_limited_takes_count_their_staleness(name):
    with shmbuf.Buffer.create(X, 32, name=name, mode="queue", versions=True) as q:
        fill(q, [1, 2, 3])
        q.take(8, max_staleness=1)  # versions 2 (staleness 1), 3 (0); version 1 passed over
        stats = q.stats()
        assert stats["sampled_staleness"] == {"rows": 8, "mean": 0.5, "max": 1} and stats["rows_stale"] == 4
        assert "4 stale rows passed over by takes" in cli("stat", name).stdout


def test_a_clear_starts_the_search_over(name):
    with versioned(name) as buf:
        fill(buf, [1, 2, 3])
        assert set(buf.sample(100, min_version=3)["x"].tolist()) == {30, 31, 32, 33}
        buf.clear()
        with shmbuf.Buffer.attach(name) as w:  # (a new writer: its versions start anew)
            fill(w, [1])
        assert set(buf.sample(100, min_version=1)["x"].tolist()) == {10, 11, 12, 13}
        with pytest.raises(shmbuf.SampleTimeout, match="no row has a version >= 3"):
            buf.sample(1, min_version=3, timeout=0.05)


def test_a_lane_shared_by_writers_of_other_versions_never_gives_an_older_row(name):
    """Two handles write one lane, so its versions go 1, 5, 1: the search is then only a
    guide, and the version checked on the copy keeps every row below the bound out."""
    with versioned(name) as a, shmbuf.Buffer.attach(name) as b:
        a.extend({"x": [10, 11]}, version=1)
        b.extend({"x": [50, 51]}, version=5)
        a.extend({"x": [12, 13]}, version=1)
        assert set(a.sample(300, min_version=5)["x"].tolist()) == {50, 51}


def test_a_write_that_fails_moves_no_version_floor(name):
    with versioned(name) as buf:
        buf.add({"x": 1}, version=2)
        with pytest.raises(ValueError):
            buf.extend({"x": np.zeros((2, 3))}, version=9)  # a bad batch: nothing written
        with pytest.raises(ValueError):
            buf.add({"y": 1}, version=9)
        buf.add({"x": 2}, version=3)  # (9 was never written: 3 is not going backwards)
        with pytest.raises(ValueError, match="versions never go backwards: this handle wrote version 3, got 2"):
            buf.add({"x": 3}, version=2)
        assert len(buf) == 2


def test_freshness_weighs_rows_by_staleness_and_weights_undo_it(name):
    """freshness=True keeps a row of staleness s with probability 1/(s+1): versions 2, 3, 4
    come in proportion 1/3 : 1/2 : 1; ``weight`` (1/probability, the stalest allowed 1)
    makes a weighted mean that of a uniform sample (3.0)."""
    with versioned(name, capacity=400, lanes=4) as buf:
        for v in range(5):
            for lane in range(4):
                buf.extend({"x": np.arange(20)}, version=v, lane=lane)  # (a lane a writer: any handle may)
        b = buf.sample(60_000, max_staleness=2, freshness=True)
        share = np.bincount(b["version"], minlength=5)[2:] / len(b["version"])
        assert np.allclose(share, np.array([1 / 3, 1 / 2, 1]) / (11 / 6), atol=0.01), share
        assert sorted(set(zip(b["version"].tolist(), b["weight"].round(6).tolist()))) == \
            [(2, 1.0), (3, round(2 / 3, 6)), (4, round(1 / 3, 6))]
        assert abs(np.average(b["version"], weights=b["weight"]) - 3.0) < 0.02
        exp = buf.sample(30_000, freshness=lambda s: np.exp(-s.astype(float)))  # no bound: every version
        counts = np.bincount(exp["version"], minlength=5)
        assert (np.diff(counts) > 0).all() and abs(counts[4] / counts[3] - np.e) < 0.15
        assert set(buf.sample(200, min_version=4, freshness=True)["weight"].tolist()) == {1.0}


def test_bad_freshness_is_a_clear_error_that_changes_nothing(name):
    with versioned(name) as buf:
        fill(buf, [1, 2, 3])
        state = buf.engine.rng.bit_generator.state
        for bad, err, msg in ((lambda s: s * 2.0, ValueError, r"each in \[0, 1\]"),
                              (lambda s: np.zeros(2), ValueError, "weights of its shape"),
                              (lambda s: 0.0 * s, ValueError, "one above 0"),
                              ("yes", TypeError, "freshness must be True or a callable")):
            with pytest.raises(err, match=msg):
                buf.sample(3, freshness=bad)
        with pytest.raises(ValueError, match="out= is not supported with freshness="):
            buf.sample(2, freshness=True, out=buf.empty_batch(2))
        with pytest.raises(ValueError, match=r"freshness= weighs at most 1048576 versions; this sample spans"):
            buf.sample(1, freshness=True, version=1 << 21)
        assert buf.engine.rng.bit_generator.state == state and buf.stats()["rows_sampled"] == 0


def test_rows_since_and_newest_version_say_what_a_sample_draws_from(name):
    with versioned(name, capacity=32, lanes=2) as buf:
        assert buf.newest_version is None and buf.rows_since(0) == 0
        fill(buf, [1, 2], lane=0)
        with shmbuf.Buffer.attach(name) as other:
            fill(other, [3], per=2, lane=1)
        assert buf.newest_version == 3
        assert [buf.rows_since(v) for v in range(5)] == [10, 10, 6, 2, 0]
        with pytest.raises(ValueError, match="min_version must be an int >= 0"):
            buf.rows_since(-1)
    with shmbuf.Buffer.create(X, 8, name=name + "-plain") as plain:
        with pytest.raises(ValueError, match="are for a buffer created with versions=True"):
            plain.rows_since(0)


def test_a_restore_with_the_same_window_moves_the_newest_version(name):
    """The newest row's version is remembered per window; a restore that leaves every
    lane's window as it was still changes it (and a sample by staleness sees that)."""
    with versioned(name, capacity=16) as buf, versioned(name + "-b", capacity=16) as other:
        fill(buf, [1, 2])
        fill(other, [5, 6])
        assert set(buf.sample(50, max_staleness=0)["version"].tolist()) == {2}
        buf.load_state_dict(other.state_dict())
        assert set(buf.sample(50, max_staleness=0)["version"].tolist()) == {6}

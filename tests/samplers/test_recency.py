"""Recency-weighted sampling (``sampler=("recency", {"tau": ...})``): rows drawn with
probability proportional to exp(-age / tau), with importance weights, read through the
one checked read path (both paths: scripts/test runs this file on each)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import shmbuf
from shmbuf.core import read
from shmbuf.samplers.recency import EXACT_AFTER, Recency, draw_ages

from helpers import start_hanging_writer


def recency(name, capacity=16, tau=4.0, **kw):
    return shmbuf.Buffer.create({"x": ((), "int64")}, capacity, name=name, sampler=("recency", {"tau": tau}), **kw)


def exact(sizes, tau):
    """Every row's (lane, age) and its draw probability, one by one."""
    rows = [(lane, age) for lane, size in enumerate(sizes) for age in range(size)]
    w = np.array([math.exp(-age / tau) for _, age in rows])
    return rows, w / w.sum()


def assert_counts(counts, p, n):
    """Each count within 5 standard deviations (plus one) of ``n * p``: a sample of ``n``
    draws by ``p`` passes but once in about 3 million."""
    expected = n * p
    tolerance = 5 * np.sqrt(expected * (1 - p)) + 1
    assert (np.abs(counts - expected) <= tolerance).all(), (counts, expected.round(), tolerance.round())


def test_options_are_checked_and_normalized():
    assert Recency.options({"tau": 3}) == {"tau": 3.0} and type(Recency.options({"tau": 3})["tau"]) is float
    assert json.loads(json.dumps(Recency.options({"tau": np.float32(0.5)}))) == {"tau": 0.5}
    with pytest.raises(ValueError, match=r"needs the option 'tau' \(rows: a row's weight is exp\(-age / tau\)\)"):
        Recency.options({})
    with pytest.raises(ValueError, match=r"takes the option 'tau' only, got \['beta', 'taus'\]"):
        Recency.options({"tau": 1.0, "taus": 2.0, "beta": 1})
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=rf"option 'tau' of sampler 'recency' must be a finite number of rows > 0, got {bad!r}"):
            Recency.options({"tau": bad})
    for bad in (True, "10", None, [1.0]):
        with pytest.raises(TypeError, match=r"option 'tau' of sampler 'recency' must be a number of rows > 0, got "):
            Recency.options({"tau": bad})
    with pytest.raises(TypeError, match="must be a mapping such as"):
        Recency.options(10.0)


def test_create_checks_tau(name):
    with pytest.raises(ValueError, match="needs the option 'tau'"):
        shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name, sampler="recency")
    with pytest.raises(ValueError, match="must be a finite number of rows > 0, got -2.0"):
        recency(name, tau=-2.0)
    with pytest.raises(ValueError, match="do not go together"):
        shmbuf.Buffer.create({"x": ((), "int64")}, 4, name=name, sampler=("recency", {"tau": 1.0}), priority=0.6)


def test_the_draw_inverts_the_cdf_of_each_lane_exactly():
    """draw_ages against the inverse CDF computed row by row, on the same uniform
    numbers: the same lane and age for every draw (lanes of sizes 7, 0, 3 and 12)."""
    sizes, tau = np.array([7, 0, 3, 12]), 2.5
    lanes, ages = draw_ages(np.random.default_rng(1), 10_000, sizes, tau)
    u = np.random.default_rng(1).random((2, 10_000))
    rows, p = exact(sizes, tau)
    lane_p = np.array([sum(q for (lane, _), q in zip(rows, p) if lane == i) for i in range(len(sizes))])
    want_lanes = np.cumsum(lane_p).searchsorted(u[0] * lane_p.sum(), side="right")
    want_ages = [int(np.cumsum(np.exp(-np.arange(sizes[i]) / tau) / np.exp(-np.arange(sizes[i]) / tau).sum())
                     .searchsorted(v, side="right")) for i, v in zip(want_lanes, u[1])]
    assert lanes.tolist() == want_lanes.tolist() and ages.tolist() == want_ages
    lanes, ages = draw_ages(np.random.default_rng(2), 1000, np.array([5]), 1e-3)  # tau far below a row: the newest
    assert (ages == 0).all()
    lanes, ages = draw_ages(np.random.default_rng(2), 100_000, np.array([4]), 1e12)  # tau far above: uniform
    assert_counts(np.bincount(ages, minlength=4), np.full(4, 0.25), 100_000)


def test_one_lane_is_drawn_by_exp_of_minus_age_over_tau(name):
    n = 200_000
    with recency(name, 20, tau=4.0, seed=0) as buf:
        buf.extend({"x": np.arange(20)})
        got = buf.sample(n)
        assert set(got) == {"x", "weight"} and got["x"].shape == got["weight"].shape == (n,)
        _, p = exact([20], 4.0)
        assert_counts(np.bincount(19 - got["x"], minlength=20), p, n)
        assert buf.stats()["rows_sampled"] == n


def test_two_lanes_of_different_sizes_and_the_weights(name):
    """Lane 0 holds 10 rows (x 0 .. 9), lane 1 three (x 100 .. 102): every row of both is
    drawn with probability exp(-age / tau) over the sum of all 13 rows' weights, and its
    weight is (P_min / P) ** beta, P_min the oldest row of lane 0's."""
    n, tau = 100_000, 3.0
    with recency(name, 20, tau=tau, lanes=2, seed=1) as buf:
        buf.extend({"x": np.arange(10)}, lane=0)
        buf.extend({"x": np.arange(100, 103)}, lane=1)
        rows, p = exact([10, 3], tau)
        xs = np.array([9 - age if lane == 0 else 102 - age for lane, age in rows])
        got = buf.sample(n)
        assert_counts((got["x"][:, None] == xs[None, :]).sum(axis=0), p, n)
        index = {int(x): i for i, x in enumerate(xs)}
        for beta in (None, 0.5, 0.0, 1):  # (None: the default, 1.0)
            b = got if beta is None else buf.sample(2000, beta=beta)
            want = (p.min() / p[[index[int(x)] for x in b["x"]]]) ** (1.0 if beta is None else beta)
            np.testing.assert_allclose(b["weight"], want, rtol=1e-12)
            assert b["weight"].max() <= 1.0
        assert (buf.sample(100, beta=0.0)["weight"] == 1.0).all()
        assert buf.sample(100_000)["weight"].min() == pytest.approx(p.min() / p.max())  # the newest rows' weight


def test_bad_beta_and_out_are_refused_and_change_nothing(name):
    with recency(name, seed=0) as buf:
        buf.extend({"x": np.arange(8)})
        rng = buf.engine.rng.bit_generator.state
        for bad in (1.5, -0.1, float("nan")):
            with pytest.raises(ValueError, match=rf"beta= is the exponent of the importance weights \(P_min / P\) \*\* "
                                                 rf"beta: a float in \[0, 1\], got {bad!r}"):
                buf.sample(4, beta=bad)
        for bad in (True, "1"):
            with pytest.raises(TypeError, match=r"a float in \[0, 1\]"):
                buf.sample(4, beta=bad)
        with pytest.raises(ValueError, match="out= is not supported by the recency sampler"):
            buf.sample(2, out=buf.empty_batch(2))
        assert buf.stats()["rows_sampled"] == 0 and buf.engine.rng.bit_generator.state == rng
    with recency(name + "-empty") as buf:
        with pytest.raises(ValueError, match="cannot sample from an empty buffer: add rows first"):
            buf.sample(1)


def test_a_handle_that_attaches_samples_the_same_way(name, tmp_path):
    """The sampler and its tau are recorded in the segment: a handle that attaches with
    the same seed draws the same rows with the same weights; so does a loaded save."""
    with recency(name, 20, tau=5.0, seed=3) as buf:
        buf.extend({"x": np.arange(20)})
        mine = buf.sample(500)
        with shmbuf.Buffer.attach(name, seed=3) as other:
            assert type(other.sampler) is Recency and other.sampler.tau == 5.0
            theirs = other.sample(500)
        assert mine["x"].tolist() == theirs["x"].tolist() and mine["weight"].tolist() == theirs["weight"].tolist()
        buf.save(tmp_path / "save")
        with shmbuf.Buffer.load(tmp_path / "save", name=name + "-back") as back:
            assert type(back.sampler) is Recency and back.sampler.tau == 5.0


def test_a_row_being_written_never_comes_out_and_the_sample_returns(name, tmp_path, monkeypatch, break_protection):
    """Rows 0 .. 7 published; a real writer process stops inside its copy of row 8 (its
    value 10008 already in the slot, its stamp odd): the newest row, which tau=1 draws
    about 63% of the time. It never comes out, and the sample returns by round 5 (rounds
    0 .. 4 drawn by the weights, round 5 from the published rows only; the read path's
    rounds counted by its hook). With the stamp check switched off, it comes out."""
    with recency(name, 16, tau=1.0, seed=0) as buf:
        buf.extend({"x": np.arange(8)})
        proc = start_hanging_writer(name, "writing", tmp_path, rows=1)
        try:
            assert len(buf) == 9
            rounds = []
            monkeypatch.setattr(read, "HOOK", rounds.append)
            got = buf.sample(500, timeout=60)
            assert 10008 not in got["x"] and set(got["x"].tolist()) <= set(range(8))
            assert 1 <= len(rounds) and max(rounds) <= 5 == EXACT_AFTER + 1, rounds  # (rounds 0 .. 4 by the weights, 5 exact)
            monkeypatch.setattr(read, "HOOK", None)
            break_protection("stamp check")
            assert 10008 in buf.sample(500, timeout=60)["x"]
        finally:
            proc.kill()
            proc.join(30)


def test_rows_that_only_live_writers_hold_are_waited_for_and_dead_writers_rows_never(name, tmp_path):
    with recency(name, 16) as buf:
        proc = start_hanging_writer(name, "writing", tmp_path, rows=3)
        try:
            with pytest.raises(shmbuf.SampleTimeout, match=r"could not copy 5 intact rows drawn by recency within "
                                                          r"0.2 s: none of the 3 rows the buffer holds is published; "
                                                          r"live writers are still writing them"):
                buf.sample(5, timeout=0.2)
        finally:
            proc.kill()
            proc.join(30)
        with pytest.raises(ValueError, match=r"none of the 3 rows the buffer holds is published, and no live writer "
                                             r"is writing one \(rows reserved by writers that died"):
            buf.sample(5, timeout=60)
        buf.extend({"x": [7]})
        assert buf.sample(5, timeout=60)["x"].tolist() == [7] * 5

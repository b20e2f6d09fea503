"""Prioritized replay (Buffer.create(priority=a)): exact probabilities and weights, new
rows at the largest priority, stale updates dropped, bad priorities refused, writers
and learners in other processes at once, a process killed inside a tree change."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

import shmbuf
import helpers
from helpers import EPISODE_FIELDS, STORM, check_trees, kill_when_there, simple_episode

X = {"x": ((), "int64")}


def _set(buf, priorities):
    """Give the rows x = 0 .. k-1 (each sampled at least once) these priorities."""
    k = len(priorities)
    seen = {}
    while len(seen) < k:
        b = buf.sample(64)
        for x, idx in zip(b["x"].tolist(), b["index"]):
            seen[x] = idx
    assert buf.update_priorities(np.array([seen[x] for x in range(k)]), priorities) == k


def test_probabilities_and_weights_follow_the_formulas(name):
    """p ** a with a = 0.5 of priorities 1, 4, 9, 16 is 1, 2, 3, 4: P = 0.1 .. 0.4; the
    weight of row i is (N P(i)) ** -b over the largest weight, the minimum priority's."""
    with shmbuf.Buffer.create(X, 4, priority=0.5, seed=0, name=name) as buf:
        buf.extend({"x": np.arange(4)})
        b = buf.sample(50)
        assert (b["weight"] == 1).all()  # every row at priority 1 before any update
        _set(buf, [1.0, 4.0, 9.0, 16.0])
        b = buf.sample(40_000, beta=0.7)
        freq = np.bincount(b["x"], minlength=4) / len(b["x"])
        assert np.allclose(freq, [0.1, 0.2, 0.3, 0.4], atol=0.01), freq
        P = np.array([0.1, 0.2, 0.3, 0.4])
        w = (4 * P) ** -0.7 / ((4 * P) ** -0.7).max()
        assert np.allclose(b["weight"], w[b["x"]], rtol=1e-12, atol=0)
        assert b["weight"].dtype == np.float64 and b["index"].shape == (40_000, 2)
        assert (b["index"][:, 0] == b["x"]).all()  # one lane: slot = row here
        check_trees(buf.engine.priorities)


def test_frequencies_match_the_priorities_over_many_rows(name):
    """200 rows over 4 lanes, priorities from a wide range (given by the writers): the
    sampled counts fit P(i) (a chi-square statistic far below its 0.999 quantile for
    199 degrees of freedom, about 270) and every row's weight is the formula's."""
    rng = np.random.default_rng(1)
    p = rng.uniform(0.05, 20.0, 200)
    with shmbuf.Buffer.create(X, 200, lanes=4, priority=0.7, seed=0, name=name) as buf:
        for lane in range(4):
            rows = np.arange(lane * 50, lane * 50 + 50)
            buf.extend({"x": rows}, lane=lane, priority=p[rows])
        b = buf.sample(200_000, beta=0.5)
        want = p ** 0.7 / (p ** 0.7).sum()
        counts = np.bincount(b["x"], minlength=200)
        chi2 = ((counts - want * len(b["x"])) ** 2 / (want * len(b["x"]))).sum()
        assert chi2 < 270, chi2
        w = (200 * want) ** -0.5 / ((200 * want) ** -0.5).max()
        assert np.allclose(b["weight"], w[b["x"]], rtol=1e-12, atol=0)


def test_new_rows_enter_at_the_largest_priority_ever_set_or_their_own(name):
    with shmbuf.Buffer.create(X, 8, priority=1.0, seed=0, name=name) as buf:
        buf.extend({"x": np.arange(2)})
        _set(buf, [3.0, 1.0])
        buf.add({"x": 2})  # the largest so far: 3
        buf.extend({"x": [3, 4]}, priority=[6.0, 2.0])
        buf.add({"x": 5}, priority=7.0)
        b = buf.sample(60_000)
        freq = np.bincount(b["x"], minlength=6) / len(b["x"])
        assert np.allclose(freq, np.array([3, 1, 3, 6, 2, 7]) / 22, atol=0.01), freq
        buf.extend({"x": [6]})  # the largest priority set (a writer's count too): 7
        buf.sample(1)  # (rows enter the trees when the next sample or update syncs them)
        assert buf.engine.priorities.sum[1] == 29


def test_bad_priorities_are_refused_and_change_nothing(name):
    with shmbuf.Buffer.create(X, 8, priority=0.6, seed=0, name=name) as buf:
        buf.extend({"x": np.arange(4)})
        b = buf.sample(4)
        before = buf.engine.priorities.sum.copy(), buf.engine.priorities.seq.copy()
        for bad in ([1, 2, 0, 1], [1, -1, 1, 1], [1, np.nan, 1, 1], [np.inf, 1, 1, 1], [1, 2, 3]):
            with pytest.raises(ValueError, match="priorit"):
                buf.update_priorities(b["index"], bad)
        for index in (b["index"][:, 0], b["index"].astype(float), np.array([[99, 0]] * 4)):
            with pytest.raises(ValueError, match="index|slot"):
                buf.update_priorities(index, [1, 1, 1, 1])
        for bad in (0.0, -2.0, float("nan")):
            with pytest.raises(ValueError, match="priorit"):
                buf.add({"x": 9}, priority=bad)
        with pytest.raises(ValueError, match="priorit"):
            buf.extend({"x": [9, 9]}, priority=[1.0, float("inf")])
        with pytest.raises(ValueError, match="kept by shmbuf"):
            buf.add({"x": 9, "_priority": 1.0})
        assert len(buf) == 4 and buf.total_added == 4
        assert np.array_equal(buf.engine.priorities.sum, before[0]) and np.array_equal(buf.engine.priorities.seq, before[1])
    with shmbuf.Buffer.create(X, 8, name=name) as plain:
        for call in (lambda: plain.sample(2, beta=0.4), lambda: plain.add({"x": 1}, priority=2.0),
                     lambda: plain.update_priorities(np.zeros((1, 2), np.int64), [1.0])):
            with pytest.raises(ValueError, match="prioritized buffer"):
                call()
    for bad in (-0.5, float("inf"), "0.6", True):
        with pytest.raises(ValueError, match="exponent"):
            shmbuf.Buffer.create(X, 8, priority=bad, name=name)
    with shmbuf.Buffer.create(X, 8, priority=0.6, name=name) as buf:  # beta= is named as beta=
        buf.add({"x": 1})
        for bad in (-1.0, float("nan"), "0.4", True):
            with pytest.raises(ValueError, match=r"^beta= is the exponent b of the importance weights"):
                buf.sample(2, beta=bad)
    her = shmbuf.HER(reward_fn=lambda a, d, i: a[:, 0])
    with pytest.raises(ValueError, match="not supported"):
        shmbuf.EpisodeBuffer.create(helpers.GOALS, 8, priority=0.6, name=name, observations=helpers.GOAL_OBS,
                                    her=her)
    assert name not in shmbuf.core.segment.list_names()


def test_priorities_whose_p_to_the_a_would_make_the_sum_infinite_are_refused_and_change_nothing(name, tmp_path):
    """Round 4: finite priorities whose p**a, or the trees' sum, overflowed to inf (1e308
    twice with a = 1; 1e200 with a = 2) were taken, and every later sample in every
    process then waited out its timeout (the draws scale by an infinite sum). Now p**a
    above the largest float64 over the leaves (so the sum of every leaf stays finite) is
    refused, at add, extend and update, nothing changed; and so is a p**a that underflows
    to 0 (a row never drawn). The largest accepted in every slot still samples; a save
    holding larger leaves does not load."""
    top = float(np.finfo(np.float64).max) / 8  # 8 leaves
    with shmbuf.Buffer.create(X, 8, priority=1.0, seed=0, name=name, timeout=2.0) as buf:
        buf.extend({"x": np.arange(4)})
        b = buf.sample(2)
        trees = buf.engine.priorities
        before = trees.sum.copy(), trees.seq.copy(), trees.headf.copy(), buf.engine.rng.bit_generator.state
        for call in (lambda: buf.update_priorities(b["index"], [1e308, 1e308]),
                     lambda: buf.update_priorities(b["index"], [1.0, top * 1.01]),
                     lambda: buf.add({"x": 9}, priority=1e308),
                     lambda: buf.extend({"x": [9, 9]}, priority=[1.0, 1e308]),
                     lambda: buf.extend({"x": [9, 9]}, priority=1e308)):
            with pytest.raises(ValueError, match=r"p\*\*a must be at most 2.24712e\+307 in a buffer of 8 rows .*"
                                                 r"pass priorities <= 2.24712e\+307"):
                call()
        assert len(buf) == 4 and buf.total_added == 4
        assert np.array_equal(trees.sum, before[0]) and np.array_equal(trees.seq, before[1])
        assert np.array_equal(trees.headf, before[2]) and buf.engine.rng.bit_generator.state == before[3]
        assert set(buf.sample(400)["x"].tolist()) == {0, 1, 2, 3}  # sampled, not a timeout
        buf.extend({"x": np.arange(8)}, priority=top)  # the largest, in every slot: the sum is finite
        buf.sample(1)
        assert np.isfinite(trees.sum[1]) and trees.sum[1] == 8 * top
        got = buf.sample(800)
        assert set(got["x"].tolist()) == set(range(8)) and np.isfinite(got["weight"]).all()
        buf.save(tmp_path / "s")
    with shmbuf.Buffer.create(X, 8, priority=2.0, seed=0, name=name) as buf:  # a = 2: p**a overflows alone
        buf.extend({"x": np.arange(2)})
        b = buf.sample(2)
        before = buf.engine.priorities.sum.copy()
        with pytest.raises(ValueError, match=r"at most .* with a = 2: pass priorities <= 4.74038e\+153"):
            buf.update_priorities(b["index"], [1e200, 1.0])
        with pytest.raises(ValueError, match=r"give p\*\*a = 0 with a = 2 .* could never be drawn"):
            buf.update_priorities(b["index"], [1e-200, 1.0])  # (1e-400: 0, an empty leaf)
        with pytest.raises(ValueError, match=r"could never be drawn"):
            buf.add({"x": 9}, priority=1e-200)
        assert np.array_equal(buf.engine.priorities.sum, before) and len(buf) == 2
    leaf = np.load(tmp_path / "s" / "priority.npy")  # a save whose leaves sum to inf (an older version's)
    leaf[:2] = 1e308
    np.save(tmp_path / "s" / "priority.npy", leaf)
    with pytest.raises(ValueError, match=r"priority.npy holds negative leaves or leaves above 2.24712e\+307"):
        shmbuf.Buffer.load(tmp_path / "s", name=name)
    assert name not in shmbuf.core.segment.list_names()


def test_an_update_for_an_overwritten_row_is_dropped(name):
    """A writer in another process overwrites the sampled rows' slots between the sample
    and the update: the update changes nothing, and the new rows keep their priority."""
    with shmbuf.Buffer.create(X, 4, priority=1.0, seed=0, name=name) as buf:
        buf.extend({"x": np.arange(4)})
        b = buf.sample(8)
        p = mp.get_context("spawn").Process(target=helpers.write_range, args=(name, 100, 104))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        assert buf.update_priorities(b["index"], np.full(8, 1000.0)) == 0
        b2 = buf.sample(4000)
        assert set(b2["x"].tolist()) == {100, 101, 102, 103}
        assert (b2["weight"] == 1).all()  # all at priority 1: none got 1000
        assert buf.update_priorities(b2["index"][:1], [5.0]) == 1  # a fresh handle applies


def test_a_sample_after_clear_sees_only_new_rows(name):
    with shmbuf.Buffer.create(X, 8, priority=1.0, seed=0, name=name) as buf:
        buf.extend({"x": np.arange(6)})
        buf.sample(4)
        buf.clear()
        with pytest.raises(ValueError, match="empty"):
            buf.sample(4)
        buf.extend({"x": [7, 8]})
        assert set(buf.sample(500)["x"].tolist()) == {7, 8}
        check_trees(buf.engine.priorities)


@pytest.mark.both_storages
def test_writers_and_learners_in_other_processes_keep_the_trees_whole(name):
    """Two writer processes add storm rows (64 per call, wrapping a small ring) while two
    learner processes sample by priority and update, and this one too: no torn row, and
    afterwards every inner node equals the sum (the minimum) of its children."""
    ctx = mp.get_context("spawn")
    with shmbuf.Buffer.create(STORM, 512, priority=0.6, seed=0, name=name) as buf:
        buf.extend(helpers.storm_rows(9, np.arange(64)))
        ready, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=helpers.storm_writer, args=(name, w, 64, 3.0, ready, stop, results))
                 for w in range(2)]
        procs += [ctx.Process(target=helpers.prio_learner, args=(name, 3.0, ready, results)) for _ in range(2)]
        got = helpers.run_together(procs, ready, results)
        learners = [g for g in got if g[0] == "learner"]
        assert all(torn == 0 for _, _, _, torn in learners)
        assert sum(applied for _, _, applied, _ in learners) > 0
        assert helpers.storm_torn(buf.sample(2000)) == 0
        check_trees(buf.engine.priorities)
        t = buf.engine.priorities
        leaves = t.sum[t.leaves:t.leaves + t.capacity]
        assert ((leaves > 0) == (t.seq > 0)).all()  # a leaf for every row, none for no row


@pytest.mark.both_storages
def test_a_process_killed_inside_a_tree_change_leaves_a_usable_buffer(name, tmp_path):
    """Deterministic: a process stops between setting leaves and their ancestors (the
    header lock held, the version odd) and is SIGKILLed there. The next sampler takes
    the lock the kernel released, rebuilds the inner nodes, and samples."""
    with shmbuf.Buffer.create(X, 16, priority=1.0, seed=0, name=name) as buf:
        buf.extend({"x": np.arange(16)})
        buf.sample(1)  # synced: the child's change is its update
        flag = tmp_path / "half"
        kill_when_there(helpers.prio_update_then_hang, (name, str(flag)), flag,
                        "the updater never got inside its change")
        assert int(buf.engine.priorities.head[0]) % 2 == 1  # left half done
        b = buf.sample(2000, timeout=10)
        check_trees(buf.engine.priorities)
        assert np.isclose(buf.engine.priorities.sum[1], buf.engine.priorities.sum[16:32].sum())
        assert buf.engine.priorities.sum[16:32].max() == 50.0  # the dead process's leaves count
        assert (np.bincount(b["x"], minlength=16) > 0).all()
        assert buf.update_priorities(b["index"][:3], [2.0, 2.0, 2.0]) == 3
        check_trees(buf.engine.priorities)


def test_prioritized_buffer_state_round_trip_and_fields(name):
    with shmbuf.Buffer.create(X, 8, priority=0.6, seed=0, name=name) as buf:
        assert buf.fields == {"x": ((), np.dtype("int64"))}
        buf.extend({"x": np.arange(5)}, priority=2.0)
        state = buf.state_dict()
        with shmbuf.Buffer.create(buf.fields, 8, priority=0.6, seed=0, name=name + "-b") as other:
            other.load_state_dict(state)
            assert sorted(set(other.sample(300)["x"].tolist())) == [0, 1, 2, 3, 4]
            assert "_priority" not in other.sample_sequences(2, 2)




def test_episode_transitions_are_drawn_by_the_priority_of_their_step(name):
    """Prioritized one-step and n-step transitions of an EpisodeBuffer: final rows and
    steps still waiting for their next observation are never drawn; the rest in
    proportion to their priority, with the weights of the formula."""
    with shmbuf.EpisodeBuffer.create(EPISODE_FIELDS, 40, lanes=2, priority=1.0, seed=0, name=name) as buf:
        buf.add_episode(simple_episode(0, [1, 2, 4, 8]), terminated=True)  # steps 0..3, final row 4
        with buf.writer(envs=1) as w:  # (the other lane) an episode in progress: obs 10, 11
            for t in (10, 11):
                w.add({"obs": np.full((1, 2), t, np.float32), "action": np.zeros(1, np.int64),
                       "reward": np.ones(1, np.float32)}, terminated=np.zeros(1, bool), truncated=np.zeros(1, bool))
            b = buf.sample(5000)
            assert set(b["obs"][:, 0].tolist()) == {0, 1, 2, 3, 10}  # not 4 (final) nor 11 (no next yet)
            first = {int(o): idx for o, idx in zip(b["obs"][:, 0], b["index"])}
            assert buf.update_priorities(np.array([first[0], first[10]]), [6.0, 2.0]) == 2
            b = buf.sample(40_000, beta=1.0)
            freq = {o: np.mean(b["obs"][:, 0] == o) for o in (0, 1, 2, 3, 10)}
            assert np.allclose([freq[o] for o in (0, 1, 2, 3, 10)], np.array([6, 1, 1, 1, 2]) / 11, atol=0.01)
            assert np.allclose(b["weight"], 1 / np.where(b["obs"][:, 0] == 0, 6, np.where(b["obs"][:, 0] == 10, 2, 1)))
            b = buf.sample(3000, n_step=3, gamma=0.5)
            got = set(zip(b["obs"][:, 0].tolist(), b["reward"].tolist(), b["steps"].tolist()))
            assert got == {(0, 3, 3), (1, 6, 3), (2, 8, 2), (3, 8, 1)}  # seed scenario 43's numbers
            w.add({"obs": np.full((1, 2), 12, np.float32), "action": np.zeros(1, np.int64),
                   "reward": np.ones(1, np.float32), "next_obs": np.full((1, 2), 13, np.float32)},
                  terminated=np.ones(1, bool), truncated=np.zeros(1, bool))  # its final row: no priority
        assert set(buf.sample(3000)["obs"][:, 0].tolist()) == {0, 1, 2, 3, 10, 11, 12}
        t = buf.engine.priorities
        leaves = t.sum[t.leaves:t.leaves + t.capacity]
        finals = (buf.engine.ring.arrays["_flags"] & 4) != 0
        assert (leaves[finals & (t.seq > 0)] == 0).all() and (leaves[~finals & (t.seq > 0)] > 0).all()
        check_trees(t)


def test_a_rate_limit_holds_prioritized_samples_too(name):
    limit = shmbuf.RateLimit(min_size=4, samples_per_insert=1.0, error_buffer=8.0)
    with shmbuf.Buffer.create(X, 16, priority=0.6, rate=limit, seed=0, name=name) as buf:
        buf.extend({"x": [0, 1, 2]})
        with pytest.raises(shmbuf.RateLimitTimeout):
            buf.sample(1, timeout=0.05)  # fewer than min_size rows inserted
        buf.extend({"x": [3, 4, 5, 6]}, priority=2.0)
        assert len(buf.sample(8, timeout=1)["weight"]) == 8
        with pytest.raises(shmbuf.RateLimitTimeout):
            buf.sample(8, timeout=0.05)  # ahead of the writers by more than the error buffer


@pytest.mark.both_storages
@pytest.mark.parametrize("where", ["set", "after set"])
def test_a_learner_killed_inside_the_sync_loses_no_row(name, tmp_path, where):
    """Round 2, item 5: 8 rows at priority 1 (synced), 8 new ones at 1000; a learner is
    SIGKILLed inside the sync that gives the new ones their leaves. The next sync does it
    again: the new rows are drawn 1000/1001 of the time (before the fix: never, because
    ``synced`` had moved past them before their leaves were set)."""
    with shmbuf.Buffer.create(X, 16, priority=1.0, seed=0, name=name) as buf:
        buf.extend({"x": np.arange(8)}, priority=np.ones(8))
        buf.sample(1)
        buf.extend({"x": np.arange(8, 16)}, priority=np.full(8, 1000.0))
        kill_when_there(helpers.prio_sync_then_hang, (name, str(tmp_path / "in-sync"), where),
                        tmp_path / "in-sync", "the learner to stop inside the sync")
        x = np.concatenate([buf.sample(64)["x"] for _ in range(50)])
        check_trees(buf.engine.priorities)
    assert (x >= 8).sum() > 0.98 * len(x), np.bincount(x, minlength=16)


@pytest.mark.both_storages
def test_a_dead_writers_row_does_not_hold_the_sync_back(name, tmp_path):
    """Round 2, item 6: a writer SIGKILLed with a row reserved leaves it unpublished for
    good. The sync passes over it at once: rows written after it are synced up to the
    head, so a sync reads only the rows new since the last one (before the fix: every
    sync read again from the dead row, a whole lap on a large buffer)."""
    with shmbuf.Buffer.create(X, 64, priority=0.6, seed=0, name=name) as buf:
        buf.extend({"x": np.arange(4)})
        for point in ("reserved", "writing"):
            kill_when_there(helpers.write_and_hang, (name, point, str(tmp_path / point), None, 1),
                            tmp_path / point, f"the writer to stop at {point!r}")
            buf.extend({"x": np.arange(10)})
            buf.sample(8)
            assert int(buf.engine.priorities.synced[0, 0]) == buf.total_added  # nothing left to read again
        assert (buf.sample(500)["x"] < 10).all()


@pytest.mark.both_storages
def test_a_live_writers_row_holds_the_sync_back_until_it_is_published(name, tmp_path):
    """The other side of item 6: a row a live writer has reserved (here stopped inside its
    write) is not passed over; once published it gets its leaf, and is drawn by its
    priority (1000 beside 1s)."""
    ctx = mp.get_context("fork")
    flag, go = str(tmp_path / "writing"), str(tmp_path / "go")
    with shmbuf.Buffer.create(X, 64, priority=1.0, seed=0, name=name) as buf:
        buf.extend({"x": np.arange(4)}, priority=np.ones(4))
        child = ctx.Process(target=helpers.add_rows_paused, args=(name, 99, 1000.0, "writing", flag, go))
        child.start()
        try:
            helpers.wait_for_file(flag, child, "the writer to stop inside its write")
            buf.extend({"x": np.arange(5, 9)}, priority=np.ones(4))
            assert 99 not in buf.sample(200)["x"]
            assert int(buf.engine.priorities.synced[0, 0]) == 4  # held at the row in flight
        finally:
            open(go, "w").close()
            child.join(30)
        assert child.exitcode == 0
        x = buf.sample(1000)["x"]
    assert (x == 99).sum() > 900, np.bincount(x)


@pytest.mark.both_storages
@pytest.mark.parametrize("point,fate", [("reserved", "killed"), ("writing", "killed"), ("writing", "stopped")])
def test_a_row_overwritten_by_a_write_not_published_leaves_the_trees(name, tmp_path, point, fate):
    """Row 0 holds almost all the mass (p**a half the largest a leaf may hold); the write
    of the row after it in its slot stops at ``point`` (the writer SIGKILLed there, or
    stopped there, alive). Row 0 has left the window: the sync takes its leaf out, and
    samples get rows 1..7 (before: every draw landed on row 0's leaf and was redrawn,
    SampleTimeout; and the trees' total counted a row no longer there). A stopped
    writer's row, once published, gets its leaf."""
    from shmbuf.priority.trees import largest_leaf

    flag, go = str(tmp_path / "there"), str(tmp_path / "go")
    with shmbuf.Buffer.create(X, 8, priority=1.0, seed=0, name=name) as buf:
        buf.add({"x": 0}, priority=largest_leaf(8) / 2)
        buf.extend({"x": np.arange(1, 8)}, priority=np.ones(7))
        assert buf.sample(4)["x"].tolist() == [0, 0, 0, 0]  # synced: row 0's leaf is in
        child = mp.get_context("fork").Process(target=helpers.add_rows_paused,
                                                args=(name, 99, 3.0, point, flag, go))
        child.start()
        try:
            helpers.wait_for_file(flag, child, f"the writer to stop at {point!r}")
            if fate == "killed":
                child.kill()
                child.join(30)
            x = buf.sample(200, timeout=2.0)["x"]
            t = buf.engine.priorities
            check_trees(t)
            assert set(x.tolist()) <= set(range(1, 8)) and t.sum[1] == 7.0, (np.bincount(x), t.sum[1])
        finally:
            open(go, "w").close()
            child.join(30)
        if fate == "stopped":
            assert child.exitcode == 0
            x = buf.sample(1000)["x"]
            assert 0 not in x and 200 < (x == 99).sum() < 400, np.bincount(x)  # 3 of the 10 of mass
            check_trees(buf.engine.priorities)

"""Hindsight relabelling (shmbuf.HER) on an EpisodeBuffer: which goals each strategy
takes (garage's and SB3's "future": strictly later observations of the same episode),
rewards recomputed in one call per batch, never a goal from another episode or from
a step not written yet, goals read torn-read proof while a writer wraps the ring."""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest

import shmbuf
import helpers
from helpers import GOAL_OBS, GOALS, goal_episode, goal_reward, goal_step, kill_when_there


def _her(strategy="future", ratio=1.0, **kw):
    return shmbuf.HER(strategy, ratio, reward_fn=kw.pop("reward_fn", goal_reward), **kw)


def _buffer(name, her, capacity=200, **kw):
    return shmbuf.EpisodeBuffer.create(GOALS, capacity, name=name, seed=0, observations=GOAL_OBS, her=her, **kw)


def _relabelled(b):
    return (b["desired_goal"] != -1).any(axis=1)


def _check_goals(b, lengths, strategy, live=False):
    """Every relabelled transition: a goal of its own episode, in the range of its
    strategy, the same in next_desired_goal, and its reward recomputed from it.
    ``live``: episodes may be in progress (their final goal: the newest so far)."""
    rel = _relabelled(b)
    ep, t = b["achieved_goal"][:, 0], b["obs"][:, 0]
    goal_ep, j = b["desired_goal"][:, 0], b["desired_goal"][:, 1]
    last = np.array([lengths[e] for e in ep])
    assert (goal_ep[rel] == ep[rel]).all()  # the same episode
    if strategy == "future":
        assert ((j[rel] > t[rel]) & (j[rel] <= last[rel])).all()  # strictly later, written
    elif strategy == "final" and not live:
        assert (j[rel] == last[rel]).all()
    elif strategy == "final":
        assert ((j[rel] > t[rel]) & (j[rel] <= last[rel])).all()
    else:
        assert ((j[rel] >= 1) & (j[rel] <= last[rel])).all()
    assert (b["next_desired_goal"] == b["desired_goal"]).all()
    assert (b["next_achieved_goal"][:, 1] == t + 1).all()
    assert (b["reward"][rel] == goal_reward(b["next_achieved_goal"][rel], b["desired_goal"][rel], {})).all()
    assert (b["reward"][~rel] == -1).all() and (b["desired_goal"][~rel] == -1).all()


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_each_strategy_takes_goals_of_its_range_in_the_same_episode(name, strategy):
    lengths = {0: 4, 1: 1, 2: 6}
    with _buffer(name, _her(strategy)) as buf:
        for ep, steps in lengths.items():
            buf.add_episode(goal_episode(ep, steps))
        b = buf.sample(4000)
        assert _relabelled(b).all()  # ratio 1
        _check_goals(b, lengths, strategy)
        # the whole range is reached: every (step, goal) pair the strategy allows
        pairs = set(zip(b["achieved_goal"][:, 0].tolist(), b["obs"][:, 0].tolist(), b["desired_goal"][:, 1].tolist()))
        want = {"future": lambda T, t: range(t + 1, T + 1), "final": lambda T, t: [T],
                "episode": lambda T, t: range(1, T + 1)}[strategy]
        assert pairs == {(e, t, j) for e, T in lengths.items() for t in range(T) for j in want(T, t)}


def test_future_goals_are_uniform_over_the_later_observations(name):
    """Garage's "future": j ~ randint(t + 1, T + 1): for step 0 of a 4-step episode,
    each of the 4 later goals about a quarter of the time."""
    with _buffer(name, _her("future")) as buf:
        buf.add_episode(goal_episode(0, 4))
        b = buf.sample(20_000)
        j = b["desired_goal"][b["obs"][:, 0] == 0, 1]
        counts = np.bincount(j, minlength=5)[1:] / len(j)
        assert np.allclose(counts, 0.25, atol=0.03), counts


def test_the_ratio_of_relabelled_transitions(name):
    with _buffer(name, _her("future", ratio=0.8)) as buf:
        buf.add_episode(goal_episode(0, 5))
        assert _relabelled(buf.sample(1000)).sum() == 800  # the count: exact where ratio * n is whole
        ones = [int(_relabelled(buf.sample(1))[0]) for _ in range(2000)]  # 0.8 of a row: rounded at random
        assert abs(np.mean(ones) - 0.8) < 0.04
        buf.her = _her("future", ratio=0.0)
        assert not _relabelled(buf.sample(500)).any()
        buf.her = None  # the plain sampler, n-step included
        assert not _relabelled(buf.sample(500, n_step=2)).any()


def test_reward_fn_is_called_once_per_batch_with_the_relabelled_rows(name):
    calls = []

    def reward_fn(achieved, desired, info):
        calls.append((achieved.shape, desired.shape, info))
        return goal_reward(achieved, desired, info)

    with _buffer(name, _her("future", ratio=0.5, reward_fn=reward_fn)) as buf:
        buf.add_episode(goal_episode(0, 5))
        buf.sample(256)
        assert calls == [((128, 2), (128, 2), {})]


def test_goals_of_an_episode_in_progress_come_only_from_steps_written(name):
    """After each step of an episode still running, "future" goals reach its newest
    observation at most, and "final" takes that newest one."""
    with _buffer(name, _her("future")) as buf:
        w = buf.writer()
        for s in range(1, 6):
            w.add(goal_step(3, s - 1), terminated=False, truncated=False)
            if s == 1:
                continue  # one step: no transition yet
            written = {3: s - 1}  # observations 0 .. s-1 are written; the newest has no next yet
            for strategy in ("future", "final"):
                buf.her = _her(strategy)
                b = buf.sample(500)
                assert _relabelled(b).all()
                _check_goals(b, written, strategy)


@pytest.mark.both_storages
def test_goals_never_come_from_a_row_being_written(name, tmp_path):
    """Deterministic: a writer stops forever in the middle of writing observation 4 of
    an episode in progress (its row reserved, half copied) and is killed there. No goal
    is ever read from that row, for any strategy; the learner does not wait for it."""
    with _buffer(name, _her("future")) as buf:
        flag = tmp_path / "writing"
        kill_when_there(helpers.goal_writer_hang_in_write, (name, str(flag), 4), flag,
                        "the writer never reached the middle of a write")
        for strategy in ("future", "final", "episode"):
            buf.her = _her(strategy)
            b = buf.sample(1000, timeout=10)
            assert set(b["obs"][:, 0].tolist()) == {0, 1, 2}  # step 3 waits for its next observation
            assert _relabelled(b).all()  # each got a goal (none given up on)
            _check_goals(b, {7: 3}, strategy)


def test_a_goal_row_overwritten_after_the_search_is_never_taken(name, monkeypatch):
    """Deterministic: right after the relabeller has found where each sampled episode
    ends, a writer wraps the ring over most of that episode. The goals then read from
    overwritten rows are refused (the stamp and episode checks) and drawn again among
    the rows left; no transition gets a goal of the episode that overwrote them."""
    from shmbuf.episodes import her as her_module
    real, calls = her_module.gather.last_rows, []

    def last_rows_then_wrap(*args):
        last = real(*args)
        if not calls:
            buf.add_episode(goal_episode(1, 30))  # rows 21 .. 51: slots 21 .. 39, then 0 .. 11
        calls.append(len(last))
        return last

    with _buffer(name, _her("future"), capacity=40) as buf:
        buf.add_episode(goal_episode(0, 20))
        monkeypatch.setattr(her_module.gather, "last_rows", last_rows_then_wrap)
        b = buf.sample(300)
        assert (b["achieved_goal"][:, 0] == 0).all()  # sampled before the wrap
        _check_goals(b, {0: 20}, "future")
        assert (b["desired_goal"][_relabelled(b), 1] > 11).all()  # the rows left


def test_goals_stay_in_their_episode_while_a_writer_wraps_the_ring(name):
    """A writer process adds episodes step by step into a ring of 40 rows (it wraps
    every few episodes); the learner samples with every strategy meanwhile. Each
    relabelled goal is of the transition's own episode, strictly later for "future",
    never past that episode's end; every row is intact."""
    ctx = mp.get_context("spawn")
    with _buffer(name, _her("future", ratio=0.7), capacity=40) as buf:
        ready, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
        proc = ctx.Process(target=helpers.goal_writer, args=(name, 20.0, ready, stop, results))
        proc.start()
        try:
            ready.set()
            lengths = {e: 1 + (e * 7) % 12 for e in range(1_000_000)}
            deadline = time.monotonic() + 60
            while buf.transition_count < 10:
                assert time.monotonic() < deadline and proc.is_alive(), "the writer wrote nothing"
                time.sleep(0.01)
            checked = 0
            while checked < 30_000:
                for strategy in ("future", "final", "episode"):
                    buf.her = _her(strategy, ratio=0.7)
                    b = buf.sample(500, timeout=30)
                    assert (b["obs"][:, 0] == b["achieved_goal"][:, 1]).all()  # intact rows
                    _check_goals(b, lengths, strategy, live=True)
                    checked += 500
        finally:
            stop.set()
            episodes = results.get(timeout=60)
            proc.join(30)
        assert episodes > 10  # it wrapped


def test_another_process_attaches_with_its_own_her(name):
    """A function cannot be shared: a handle attached without her= samples plainly, one
    attached with it relabels; pickling carries the name only."""
    import pickle
    with _buffer(name, _her("final")) as buf:
        buf.add_episode(goal_episode(0, 3))
        with shmbuf.EpisodeBuffer.attach(name) as plain:
            assert plain.her is None and not _relabelled(plain.sample(100)).any()
        with shmbuf.EpisodeBuffer.attach(name, her=_her("final")) as other:
            _check_goals(other.sample(100), {0: 3}, "final")
        other = pickle.loads(pickle.dumps(buf))
        try:
            assert other.her is None
        finally:
            other.close()


def test_bad_configurations_are_refused_before_anything_is_created(name):
    from shmbuf.core import segment
    for bad, err in [(dict(strategy="later"), ValueError), (dict(ratio=1.5), ValueError),
                     (dict(ratio=float("nan")), ValueError), (dict(ratio=True), ValueError),
                     (dict(reward_fn=None), TypeError)]:
        kw = dict(strategy="future", ratio=0.5, reward_fn=goal_reward) | bad
        with pytest.raises(err):
            shmbuf.HER(**kw)
    for her, match in [(_her(achieved="desired_goal2"), "observation field"),
                       (_her(desired="nope"), "name a field"),
                       (_her(achieved="obs"), "same shape"),
                       ]:
        with pytest.raises(ValueError, match=match):
            _buffer(name, her)
        assert name not in segment.list_names()
    f = {k: v for k, v in GOALS.items()}
    with pytest.raises(ValueError, match="reward"):
        shmbuf.EpisodeBuffer.create(f, 16, name=name, observations=GOAL_OBS, reward=None, her=_her())
    with pytest.raises(ValueError, match="frame_stack"):
        shmbuf.EpisodeBuffer.create(f, 16, name=name, observations=GOAL_OBS, frame_stack=2, her=_her())
    assert name not in segment.list_names()
    with _buffer(name, None) as buf:
        with pytest.raises(TypeError, match="shmbuf.HER"):
            buf.her = goal_reward
        buf.add_episode(goal_episode(0, 3))
        buf.her = _her()
        with pytest.raises(ValueError, match="one-step"):
            buf.sample(4, n_step=2)
        buf.her = _her(reward_fn=lambda a, d, info: np.zeros(3))
        with pytest.raises(ValueError, match="one reward per transition"):
            buf.sample(8)

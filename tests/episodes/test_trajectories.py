"""The trajectory sampler's proof, deterministically: the sampler is stopped at a chosen
point of its reads (between its copy of the window and its read of the episode's tail,
or inside the copy itself), another writer acts there, and every value it then returns
must still be true (or the call must wait, never fail with a wrong answer)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

import numpy as np
import pytest

import shmbuf
from helpers import hang_at, wait_for_file
from shmbuf.core import gather

pytestmark = pytest.mark.timeout(120)

F = {"obs": ((1,), "float32"), "reward": ((), "float32")}


def _episode(first, rewards):
    t = np.arange(len(rewards), dtype=np.float32)
    return {"obs": (first + t)[:, None], "reward": rewards, "next_obs": [first + len(rewards)]}


def _after_the_window_copy(monkeypatch, ring, act):
    """Run ``act()`` once, right after the sampler's checked copy of a trajectory's
    window (the copy that takes the ``obs`` field), before anything else is read."""
    real, done = gather.copy_windows, []

    def copy(ring_, lane, first, length, lo, out, *args, **kw):
        ok = real(ring_, lane, first, length, lo, out, *args, **kw)
        if not done and isinstance(out[ring.index["obs"]], np.ndarray):
            done.append(True)
            ok = act(np.ones(len(first), bool) if ok is None else ok.copy())
        return ok
    monkeypatch.setattr(gather, "copy_windows", copy)


def _draw_end(monkeypatch, end):
    """The trajectories' end steps: always row ``end`` of lane 0."""
    real = gather.draw_windows

    def draw(ring, rng, n, length, pool, only=None):
        real(ring, rng, n, length, pool, only)  # (the RNG moves as usual)
        return np.zeros(n, np.int64), np.full(n, end, np.int64), None
    monkeypatch.setattr(gather, "draw_windows", draw)


def test_the_tail_wrapped_over_after_the_window_copy_is_never_summed_short(name, monkeypatch):
    """Round 2, item 1: rewards 1, 2, 4 (rows 0-3 of a 4-row ring); right after the
    window is copied, a writer wraps the ring over the episode's tail. The sum of the rest
    of the episode cannot be proven any more, so the trajectory is drawn again (from
    the new episode): 7 and 6 for steps 0 and 1 of the first episode, never 1 and 2."""
    with shmbuf.EpisodeBuffer.create(F, 4, name=name, seed=0) as buf:
        buf.add_episode(_episode(0, [1, 2, 4]), terminated=True)
        ring = buf.engine.ring

        def wrap(ok):
            buf.add_episode(_episode(100, [10, 20, 40]), terminated=True)  # rows 4-7: all four slots
            return ok
        _after_the_window_copy(monkeypatch, ring, wrap)
        t = buf.sample_trajectories(16, 1)
    true = {0: 7, 1: 6, 2: 4, 100: 70, 101: 60, 102: 40}
    got = {int(o): float(r) for o, r in zip(t["obs"][:, 0, 0], t["returns_to_go"][:, 0])}
    assert got == {k: true[k] for k in got}, got
    assert set(got) <= {100, 101, 102}  # the first draw was redrawn, after the wrap


@pytest.mark.both_storages
def test_a_row_being_written_over_an_ended_episode_never_breaks_the_tail_search(name, tmp_path):
    """Round 2, item 2: the ring's only lap in progress is one episode whose writer is
    stopped inside its write (its rows reserved and stamped odd, their ``_start`` still
    the previous lap's); the previous lap held an ended episode whose end the sampler had
    remembered. Every window is rejected, and the call waits and times out; it never
    searches the tail with the stale episode (that raised "repeats may not contain
    negative values")."""
    ctx = mp.get_context("fork")
    with shmbuf.EpisodeBuffer.create(F, 16, name=name, seed=0) as buf:
        with buf.writer() as w:  # (then the lane is free for the child)
            w.add_episode(_episode(0, [1, 1, 1, 1, 1]), terminated=True)   # rows 0-5
            w.add_episode(_episode(10, [1] * 9), terminated=True)          # rows 6-15
        buf.sample_trajectories(300, 2)  # the sampler remembers where both episodes end
        flag = str(tmp_path / "writing")
        child = ctx.Process(target=_write_episode_and_hang, args=(name, flag, 15))
        child.start()
        try:
            wait_for_file(flag, child, "the writer to stop inside its write")
            with pytest.raises(shmbuf.SampleTimeout):
                buf.sample_trajectories(8, 3, timeout=0.5)
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.join(30)
        with pytest.raises(shmbuf.SampleTimeout):  # its writer is dead: nothing is ever published
            buf.sample_trajectories(8, 3, timeout=0.2)


def _write_episode_and_hang(name, flag, steps):
    buf = shmbuf.EpisodeBuffer.attach(name)
    hang_at("writing", flag)
    buf.add_episode(_episode(200, [1] * steps), terminated=True)  # rows 16-31: every slot


def test_padding_is_only_ever_at_the_front(name, monkeypatch):
    """Round 2, item 3: the copy of a window finds row 6 of rows 3..10 torn (a writer
    overwriting it while it was copied), and the writer's lap then evicts rows 0..6. The
    rows before the torn one were copied intact but are evicted too: they are padding,
    never a hole in the middle of the mask (1 1 1 0 1 1 1 1)."""
    with shmbuf.EpisodeBuffer.create(F, 16, name=name, seed=0) as buf:
        buf.add_episode(_episode(0, list(range(1, 16))), terminated=True)  # rows 0-15
        ring = buf.engine.ring

        def torn_then_evicted(ok):
            ok[3] = False  # row 6 of the window 3..10
            buf.add_episode(_episode(100, [1] * 6), terminated=True)  # rows 16-22: evicts 0..6
            return ok
        _draw_end(monkeypatch, 10)
        _after_the_window_copy(monkeypatch, ring, torn_then_evicted)
        t = buf.sample_trajectories(1, 8)
    assert t["mask"][0].tolist() == [False] * 4 + [True] * 4
    assert t["obs"][0, :, 0].tolist() == [0, 0, 0, 0, 7, 8, 9, 10]
    assert t["timestep"][0].tolist() == [0, 0, 0, 0, 8, 9, 10, 11]
    assert t["returns_to_go"][0].tolist() == [0, 0, 0, 0] + [sum(range(k, 16)) for k in (8, 9, 10, 11)]


def test_a_torn_row_inside_the_window_redraws_it(name, monkeypatch):
    """A row that failed its check but is still inside the lane's window was torn, not
    evicted: the window is drawn again, never returned with that row as padding."""
    with shmbuf.EpisodeBuffer.create(F, 16, name=name, seed=0) as buf:
        buf.add_episode(_episode(0, list(range(1, 10))), terminated=True)  # rows 0-9
        ring = buf.engine.ring
        calls = []

        def torn(ok):
            calls.append(True)
            ok[2] = False  # row 5 of the window 3..8, inside the lane's window 0..9
            return ok
        _draw_end(monkeypatch, 8)
        _after_the_window_copy(monkeypatch, ring, torn)
        t = buf.sample_trajectories(1, 6)
    assert calls == [True]
    assert t["mask"][0].all() and t["obs"][0, :, 0].tolist() == [3, 4, 5, 6, 7, 8]

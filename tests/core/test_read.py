"""The one read path: every sampler, and the copy of a save or a state_dict, reads
through the checked gather.

Deterministic: a row is planted in the segment as a writer would leave it mid-write (its
stamp odd, its values garbage), with no process running. Every sampler must never
return it; with the suite's ``break_protection("stamp check")`` (the one switch in the
read path) every sampler must return it. A sampler that copied rows unchecked fails the
first half; one that kept a check of its own, beside the read path's, fails the second.
"""

from __future__ import annotations

import tempfile

import numpy as np
import pytest

import shmbuf
from shmbuf.persist import save as persist
from shmbuf.core.layout import published

GARBAGE = -7.0  # the torn row's value in every field


def plant_torn_row(buf, slot: int, fields: list[str]) -> None:
    """Row ``slot`` of lane 0 as a writer killed mid-copy leaves it: stamp odd (being
    written), values garbage."""
    ring = buf.engine.ring
    seq = int(ring.stamps[slot] - 2) // 2
    assert ring.stamps[slot] == published(seq)
    ring.stamps[slot] = published(seq) - 1
    for f in fields:
        ring.arrays[f][slot] = GARBAGE


def core_buffer(name, **kw):
    buf = shmbuf.Buffer.create({"x": ((2,), "float32")}, 16, name=name, seed=0, **kw)
    buf.extend({"x": np.tile(np.arange(16, dtype=np.float32)[:, None], 2)})
    if "priority" in kw:
        buf.sample(1)  # the trees hold every row (a sample syncs them): the slot is drawn
    plant_torn_row(buf, 5, ["x"])
    return buf


def episode_buffer(name, **kw):
    fields = {"obs": ((1,), "float32"), "achieved_goal": ((1,), "float32"),
              "desired_goal": ((1,), "float32"), "reward": ((), "float32")}
    buf = shmbuf.EpisodeBuffer.create(fields, 64, name=name, seed=0,
                                      observations=["obs", "achieved_goal", "desired_goal"], **kw)
    for e in range(4):
        t = np.arange(6, dtype=np.float32)[:, None] + 10 * e
        buf.add_episode({"obs": t[:5], "achieved_goal": t[:5], "desired_goal": t[:5],
                         "reward": np.ones(5), "next_obs": t[5], "next_achieved_goal": t[5],
                         "next_desired_goal": t[5]})
    plant_torn_row(buf.core, 8, ["obs", "achieved_goal", "desired_goal", "reward"])
    return buf


def her():
    return shmbuf.HER("future", ratio=1.0, reward_fn=lambda a, d, info: np.zeros(len(a)))


SAMPLERS = {
    "uniform rows": (core_buffer, {}, lambda b: [b.sample(200, timeout=1)["x"]]),
    "sequences": (core_buffer, {}, lambda b: [b.sample_sequences(50, 3, timeout=1)["x"]]),
    "by priority": (core_buffer, {"priority": 0.6}, lambda b: [b.sample(200, timeout=1)["x"]]),
    "transitions": (episode_buffer, {}, lambda b: list(b.sample(200, timeout=1).values())),
    "n-step transitions": (episode_buffer, {}, lambda b: list(b.sample(200, n_step=3, timeout=1).values())),
    "transitions by priority": (episode_buffer, {"priority": 0.6},
                                lambda b: list(b.sample(200, timeout=1).values())),
    "trajectories": (episode_buffer, {}, lambda b: list(b.sample_trajectories(50, 4, timeout=1).values())),
    "whole episodes": (episode_buffer, {}, lambda b: [a for ep in b.sample_episodes(20, timeout=1)
                                                      for a in ep.values()]),
    "HER goals": (episode_buffer, {"her": her()}, lambda b: list(b.sample(200, timeout=1).values())),
}


def kept_rows(got) -> list:
    """The rows a copy of the whole buffer kept (their stamp is not 0)."""
    return [a[got["stamps"] > 0] for a in got["data"].values()]


def saved_rows(b) -> list:
    with tempfile.TemporaryDirectory() as d:
        b.save(d + "/save")
        return [np.array(a) for a in kept_rows(persist.read(d + "/save"))]


SAMPLERS.update({
    "state_dict": (core_buffer, {}, lambda b: kept_rows(b.state_dict())),
    "an episode buffer's state_dict": (episode_buffer, {}, lambda b: kept_rows(b.core.state_dict())),
    "save": (core_buffer, {}, saved_rows),
})


def garbage_in(arrays) -> bool:
    return any(np.asarray(a).dtype.kind == "f" and (np.asarray(a) == GARBAGE).any() for a in arrays)


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_no_sampler_returns_a_row_being_written(name, sampler):
    make, kw, sample = SAMPLERS[sampler]
    with make(name, **kw) as buf:
        for _ in range(5):
            assert not garbage_in(sample(buf))


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_every_sampler_returns_it_once_the_read_paths_check_is_off(name, sampler, break_protection):
    """The proof that every sampler goes through the one checked gather: switch its
    stamp check off and the planted row comes out."""
    make, kw, sample = SAMPLERS[sampler]
    with make(name, **kw) as buf:
        break_protection("stamp check")
        assert any(garbage_in(sample(buf)) for _ in range(5))


def test_redraws_that_are_not_torn_reads_have_their_own_counter(name, monkeypatch):
    """A row overwritten before its copy began, or not yet published, is drawn again
    without a torn read: ``redraws`` counts it, ``torn_read_retries`` does not (both
    paths). A row whose stamp changes during the copy is a torn read."""
    from shmbuf.core import gather
    from shmbuf.core.gather import copy_windows
    with core_buffer(name) as buf:  # 16 rows in a ring of 16
        ring = buf.engine.ring
        out = [np.empty((1,) + f.shape, f.dtype) for f in ring.layout.fields]

        def counts():
            s = buf.stats()
            return s["torn_read_retries"], s["redraws"]
        assert counts() == (0, 0)
        buf.add({"x": [99, 99]})  # row 16 takes row 0's slot
        assert copy_windows(ring, 0, np.array([0]), 1, None, out).tolist() == [False]
        assert counts() == (0, 1)
        assert copy_windows(ring, 0, np.array([17]), 1, None, out).tolist() == [False]  # not written
        assert counts() == (0, 2)
        assert copy_windows(ring, 0, np.array([16]), 1, None, out) is None and out[0][0, 0] == 99
        assert counts() == (0, 2)
        native, ring.native = ring.native, None  # the Python gather, stopped mid-copy:
        real = gather.filters

        def writer_meanwhile(*args):  # between the two stamp reads, a writer takes row 16's slot
            ring.stamps[0] = published(16) + 1
            return real(*args)
        monkeypatch.setattr(gather, "filters", writer_meanwhile)
        try:
            assert copy_windows(ring, 0, np.array([16]), 1, None, out).tolist() == [False]
        finally:
            ring.native = native
            ring.stamps[0] = published(16)
        assert counts() == (1, 2)

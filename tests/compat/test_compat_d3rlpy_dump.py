"""d3rlpy-facade dump / load in d3rlpy's HDF5 layout (seed-semantics 1.5, F6; needs h5py)."""

from __future__ import annotations

import io

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

from shmbuf.compat.d3rlpy import Episode, FIFOBuffer, InfiniteBuffer, ReplayBuffer, dump, load  # noqa: E402

pytestmark = pytest.mark.extras


def test_dump_and_load_keep_every_episode_and_array(name):
    rng = np.random.default_rng(0)
    eps = [Episode(rng.random((5, 3)).astype(np.float32), rng.integers(0, 4, (5, 1)),
                   rng.random((5, 1)).astype(np.float32), True),
           Episode(rng.random((4, 3)).astype(np.float32), rng.integers(0, 4, (4, 1)),
                   np.array([[1], [2], [3], [0]], np.float32), False)]  # (a cut episode's last reward: 0)
    with ReplayBuffer(InfiniteBuffer(), episodes=eps, name=name) as buf:
        f = io.BytesIO()
        buf.dump(f)
        with h5py.File(io.BytesIO(f.getvalue()), "r") as h5:
            assert h5["version"][()] in (b"2.1", "2.1") and int(h5["num_episodes"][()]) == 2
            assert [c.decode() for c in h5["columns"][()]] == ["observations", "actions", "rewards", "terminated"]
        f.seek(0)
        with ReplayBuffer.load(f, FIFOBuffer(100), name=name + "l") as again:
            assert again.transition_count == buf.transition_count == 5 + 3
            for a, b in zip(again.episodes, eps):
                assert np.array_equal(a.observations, b.observations) and np.array_equal(a.actions, b.actions)
                assert np.array_equal(a.rewards, b.rewards) and a.terminated == b.terminated
            again.unlink()
        f.seek(0)
        with ReplayBuffer.load(f, FIFOBuffer(7), name=name + "s") as small:  # a smaller FIFO keeps the newest
            assert small.transition_count == 7 and small.size() == 2  # 7: the first episode partly evicted
            small.unlink()
        f.seek(0)
        loaded = load(Episode, f)  # d3rlpy.dataset.load(episode_cls, f)
        assert [e.transition_count for e in loaded] == [5, 3] and np.array_equal(loaded[1].rewards, eps[1].rewards)
        g = io.BytesIO()
        dump(loaded, g)  # d3rlpy.dataset.dump(episodes, f)
        assert g.getvalue()[:8] == f.getvalue()[:8] and len(load(Episode, io.BytesIO(g.getvalue()))) == 2
        buf.unlink()


def test_an_obsolete_version_and_an_empty_buffer_are_refused(name, tmp_path):
    path = tmp_path / "old.h5"
    with h5py.File(path, "w") as h5:
        h5.create_dataset("version", data="2.0")
    with open(path, "rb") as f, pytest.raises(ValueError, match="version=2.0 has been obsolete."):
        ReplayBuffer.load(f, FIFOBuffer(10))
    empty = ReplayBuffer(FIFOBuffer(10), episodes=[Episode(np.zeros((2, 1)), np.zeros((2, 1)),
                                                           np.zeros((2, 1)), False)], name=name)
    empty.close()
    with ReplayBuffer(FIFOBuffer(10), episodes=[Episode(np.zeros((1, 1)), np.zeros((1, 1)), np.zeros((1, 1)), False)],
                      name=name + "e") as buf:
        with pytest.raises(IndexError):
            buf.dump(io.BytesIO())
        buf.unlink()

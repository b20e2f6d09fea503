"""The batch pool (shmbuf/core/pool.py): default calls reuse mapped memory, never memory
that a live batch (or anything made from it) still uses, and hold a bounded amount."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import shmbuf
from shmbuf.core import pool

ROW = 4096  # bytes a row of "x": 64 rows make a batch past pool.SMALL
FIELDS = {"x": ((ROW // 8,), "int64"), "k": ((), "int64")}


@pytest.fixture
def limit():
    """Set the pool's limit for one test; the old one (and no held blocks) afterwards."""
    old = shmbuf.pool_limit(0)  # (no blocks of earlier tests)
    yield shmbuf.pool_limit
    shmbuf.pool_limit(0)
    shmbuf.pool_limit(old)


def _filled(name, capacity=256, **kw):
    buf = shmbuf.Buffer.create(FIELDS, capacity, name=name, seed=0, **kw)
    k = np.arange(capacity)
    buf.extend({"x": np.repeat(k[:, None], ROW // 8, 1), "k": k})
    return buf


def _busy():
    """How many of the pool's blocks something outside it uses."""
    return sum(pool.POOL.refs(i) != pool.POOL.idle for i in range(len(pool.POOL.blocks)))


def _intact(batch):
    """Every row of the batch still holds the values of its row ``k``."""
    return bool((batch["x"] == batch["k"][:, None]).all())


def test_a_dropped_batch_memory_is_reused_and_a_live_one_never_is(name, limit):
    limit(64 << 20)
    with _filled(name) as buf:
        first = buf.sample(64)
        assert pool.owns([first["x"]])
        at = first["x"].ctypes.data
        second = buf.sample(64)
        assert not np.shares_memory(first["x"], second["x"])  # first is alive
        del first
        third = buf.sample(64)
        assert third["x"].ctypes.data == at  # the memory of the dropped batch, mapped already
        assert _intact(second) and _intact(third)


def test_batches_kept_alive_across_many_samples_keep_every_value(name, limit):
    limit(8 << 20)  # about 30 batches: the pool runs full and batches past it are fresh
    rng = np.random.default_rng(1)
    with _filled(name) as buf:
        kept = []
        for i in range(400):
            b = buf.sample(int(rng.integers(60, 130)))
            kept.append((b, b["k"].copy()))
            if len(kept) > 40:  # drop some at random, keep the rest alive
                del kept[int(rng.integers(0, len(kept)))]
            if i % 50 == 0:
                for b, k in kept:  # nothing kept was written over by a later sample
                    assert (b["k"] == k).all() and _intact(b)
        for b, k in kept:
            assert (b["k"] == k).all() and _intact(b)
        assert pool.POOL.held() <= 8 << 20


def test_views_tensors_and_buffers_made_from_a_batch_keep_its_memory(name, limit):
    limit(64 << 20)
    with _filled(name) as buf:
        b = buf.sample(64)
        tail, mv, frame = b["x"][32:], memoryview(b["k"]), np.frombuffer(b["x"], np.uint8)
        del b
        for _ in range(5):
            other = buf.sample(64)
            for made in (tail, np.asarray(mv), frame):
                assert not np.shares_memory(made, other["x"]) and not np.shares_memory(made, other["k"])
        del tail, mv, frame, other, made
        assert _busy() == 0  # all free again once nothing made from them lives


def test_the_pool_never_holds_more_than_its_limit_and_zero_turns_it_off(name, limit):
    limit(3 * 64 * (ROW + 8) + 1024)  # room for three batches of 64 rows
    with _filled(name) as buf:
        live = [buf.sample(64) for _ in range(6)]
        assert sum(pool.owns([b["x"]]) for b in live) == 3  # three pooled, three fresh
        assert pool.POOL.held() <= limit()
        assert all(_intact(b) for b in live)
        del live
        for _ in range(50):  # reused: nothing grows
            buf.sample(64)
            assert pool.POOL.held() <= limit()
        limit(0)
        assert pool.POOL.held() == 0
        b = buf.sample(64)
        assert not pool.owns([b["x"]]) and _intact(b)


def test_a_lower_limit_lets_busy_blocks_go_once_they_are_free(name, limit):
    limit(64 << 20)
    with _filled(name) as buf:
        b = buf.sample(64)
        limit(0)
        assert pool.POOL.held() > 0  # b still uses its block: it stays
        del b
        buf.sample(64)  # (the next request lets it go)
        assert pool.POOL.held() == 0


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_a_bad_limit_is_refused_and_changes_nothing(bad, limit):
    before = limit()
    with pytest.raises(ValueError, match="int >= 0"):
        limit(bad)
    assert limit() == before


def test_small_batches_are_plain_arrays(name, limit):
    limit(64 << 20)
    with _filled(name) as buf:
        assert not pool.owns(list(buf.sample(2).values()))  # 8 KiB: below pool.SMALL


def test_threads_sampling_at_once_never_share_a_block(name, limit):
    limit(16 << 20)
    errors = []

    def learner(buf):
        kept = []
        for _ in range(100):
            b = buf.sample(64)
            kept = (kept + [(b, b["k"].copy())])[-5:]
            if not all((b["k"] == k).all() and _intact(b) for b, k in kept):
                errors.append("a kept batch changed")
    with _filled(name) as buf:
        threads = [threading.Thread(target=learner, args=(buf,)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors


def test_sequences_episodes_and_takes_come_from_the_pool_and_never_alias(name, limit):
    limit(64 << 20)
    with _filled(name) as buf:
        s1 = buf.sample_sequences(8, 8)
        s2 = buf.sample_sequences(8, 8)
        assert pool.owns([s1["x"]]) and not np.shares_memory(s1["x"], s2["x"])
        assert (s1["x"][:, :, 0] == s1["k"]).all()
    with shmbuf.EpisodeBuffer.create({"obs": ((ROW // 4,), "float32"), "reward": ((), "float32")}, 512,
                                     name=name + "e", seed=0) as ebuf:
        for ep in range(4):
            steps = np.arange(100, dtype=np.float32) + 1000 * ep
            obs = np.repeat(steps[:, None], ROW // 4, 1)
            ebuf.add_episode({"obs": obs, "reward": steps, "next_obs": obs + 1})
        t1, t2 = ebuf.sample(64), ebuf.sample(64)
        assert pool.owns([t1["obs"]]) and not np.shares_memory(t1["obs"], t2["obs"])
        assert (t1["obs"][:, 0] == t1["reward"]).all() and (t1["next_obs"][:, 0] == t1["reward"] + 1).all()
        j1 = ebuf.sample_trajectories(4, 32)
        j2 = ebuf.sample_trajectories(4, 32)
        assert pool.owns([j1["obs"]]) and not np.shares_memory(j1["obs"], j2["obs"])
    with _filled(name + "q", mode="queue") as q:
        a, b = q.take(64), q.take(64)
        assert pool.owns([a["x"]]) and not np.shares_memory(a["x"], b["x"])
        assert a["k"].tolist() == list(range(64)) and b["k"].tolist() == list(range(64, 128))
        assert _intact(a) and _intact(b)

"""A queue's lag limit (``take(max_staleness=k)`` on a queue created with
``versions=True``): stale rows are passed over, counted and never delivered; every
other row is delivered exactly once (both paths: scripts/test runs this file on each)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

import numpy as np
import pytest

import shmbuf
from shmbuf.queue import protocol as queue_protocol

from helpers import (QUEUE_FIELDS, lagged_taker, queue_rows, queue_taker, read_log, stop_and_join, wait_for_file,
                     versioned_writer)

X = {"x": ((), "int64")}
CTX = mp.get_context("spawn")


def queue(name, capacity=64, lanes=1, fields=X):
    return shmbuf.Buffer.create(fields, capacity, name=name, lanes=lanes, mode="queue", versions=True)


def fill(q, versions, per=4, lane=None):
    for v in versions:
        q.extend({"x": 10 * v + np.arange(per)}, version=v, lane=lane)


@pytest.mark.both_storages
def test_stale_rows_are_passed_over_counted_and_never_delivered(name):
    with queue(name) as q:
        fill(q, [1, 2, 3, 4, 5])
        b = q.take(8, max_staleness=1)  # the newest is 5: versions 4 and 5
        assert b["x"].tolist() == [40, 41, 42, 43, 50, 51, 52, 53] and b["version"].tolist() == [4] * 4 + [5] * 4
        stats = q.stats()
        assert (stats["rows_stale"], stats["rows_taken"], stats["rows_skipped"], len(q)) == (12, 8, 0, 0)
        with pytest.raises(shmbuf.SampleTimeout, match="the queue holds 0 row"):
            q.take(1, timeout=0.05)  # (a plain take: the stale rows are gone)
        fill(q, [6, 7], per=2)
        assert q.take(2, min_version=7)["x"].tolist() == [70, 71]
        assert q.stats()["rows_stale"] == 14


def test_the_bound_is_exact_at_its_edges_and_a_take_that_waits_keeps_fresh_rows(name):
    with queue(name) as q:
        fill(q, [1, 2, 3])
        assert q.take(4, min_version=2)["x"].tolist() == [20, 21, 22, 23]  # 1 passed over, 3 still there
        assert q.stats()["rows_stale"] == 4 and len(q) == 4
        with pytest.raises(shmbuf.SampleTimeout, match=r"rows of version < 4 are passed over"):
            q.take(1, min_version=4, timeout=0.05)  # every row left is stale: passed over, even so
        assert q.stats()["rows_stale"] == 8 and len(q) == 0
        fill(q, [4])
        with pytest.raises(shmbuf.SampleTimeout):
            q.take(5, max_staleness=0, timeout=0.05)  # 4 fresh rows, 5 wanted: the 4 stay
        assert len(q) == 4 and q.take(4, max_staleness=0)["x"].tolist() == [40, 41, 42, 43]


def test_lanes_keep_their_order_and_each_passes_over_its_own_stale_rows(name):
    with queue(name, 32, lanes=2) as q, shmbuf.Buffer.attach(name) as other:  # (a writer a lane)
        fill(q, [1], lane=0)
        fill(other, [1], lane=1)
        fill(q, [2], lane=0)
        other.extend({"x": [99]}, version=1, lane=1)  # lane 1's second write: still version 1
        fill(other, [3], lane=1)
        got = q.take(8, max_staleness=1)  # the newest is 3: versions 2, 3; lane 1's 1s passed over
        assert got["x"].tolist() == [20, 21, 22, 23, 30, 31, 32, 33]
        assert q.stats()["rows_stale"] == 9


def test_a_dead_takers_stale_rows_are_passed_over_and_its_fresh_ones_delivered_once(name, tmp_path):
    """A taker SIGKILLed holding 4 claimed rows (versions 1 and 2) gives them back; a take
    with a lag limit then passes over the given-back row of version 1 and delivers the
    rest once; no later take delivers the stale one."""
    with queue(name, 32, fields=QUEUE_FIELDS) as q:
        q.extend(queue_rows(0, 0, 1), version=1)
        q.extend(queue_rows(0, 1, 4), version=2)
        flag = str(tmp_path / "flag")
        p = CTX.Process(target=queue_taker, args=(name, str(tmp_path / "t.log"), str(tmp_path / "stop"), 4,
                                                 "claimed", flag))
        p.start()
        wait_for_file(flag, p, "the taker to stop at claimed")
        os.kill(p.pid, signal.SIGKILL)
        p.join(30)
        q.extend(queue_rows(0, 4, 6), version=3)
        b = q.take(5, max_staleness=1)
        assert b["i"].tolist() == [1, 2, 3, 4, 5] and b["version"].tolist() == [2, 2, 2, 3, 3]
        stats = q.stats()
        assert (stats["rows_given_back"], stats["rows_stale"], len(q)) == (4, 1, 0)
        with pytest.raises(shmbuf.SampleTimeout):
            q.take(1, timeout=0.05)


def interleaved(q, other):
    """Rows i = 0 .. 6 into lane 0, shared by two handles (versions never go backwards
    per handle): versions 1, 2, 2, 1, 1, 2, 1. With min_version=2 the rows to deliver
    are 1, 2 and 5; 0 is stale before them, 3 and 4 between them, 6 after them."""
    q.extend(queue_rows(0, 0, 1), version=1)
    q.extend(queue_rows(0, 1, 3), version=2)
    other.extend(queue_rows(0, 3, 5), version=1)
    q.extend(queue_rows(0, 5, 6), version=2)
    other.extend(queue_rows(0, 6, 7), version=1)


def _sigint_at(point):
    def hook(where, rows):
        if where == point:
            queue_protocol.HOOK = None
            os.kill(os.getpid(), signal.SIGINT)  # (a real Ctrl-C, raised inside the take)
    return hook


@pytest.mark.parametrize("end", ["sigkill", "sigint"])
@pytest.mark.parametrize("point", ["claimed", "copied"])
def test_a_lag_limited_taker_that_dies_or_is_interrupted_gives_back_no_stale_row(name, tmp_path, point, end):
    """A take with min_version=2 claims rows 1, 2 and 5 (passing over 0, 3, 4 and 6 as
    stale) and is SIGKILLed, or gets a real SIGINT, at ``point``: it gives back 1, 2
    and 5 only. A plain take then delivers exactly those, a state dict keeps exactly
    those, and the 4 stale rows are counted once."""
    with queue(name, 32, fields=QUEUE_FIELDS) as q, shmbuf.Buffer.attach(name) as other:
        interleaved(q, other)
        if end == "sigint":
            queue_protocol.HOOK = _sigint_at(point)
            try:
                with pytest.raises(KeyboardInterrupt):
                    q.take(3, min_version=2)
            finally:
                queue_protocol.HOOK = None
        else:
            flag = str(tmp_path / "flag")
            p = CTX.Process(target=lagged_taker, args=(name, str(tmp_path / "t.log"), str(tmp_path / "stop"), 3,
                                                       2, point, flag))
            p.start()
            wait_for_file(flag, p, f"the taker to stop at {point}")
            os.kill(p.pid, signal.SIGKILL)
            p.join(30)
        assert q.stats()["rows_stale"] == 4 and len(q) == 3
        state = q.state_dict()
        with queue(name + "-state", 32, fields=QUEUE_FIELDS) as restored:
            restored.load_state_dict(state)
            assert len(restored) == 3 and restored.take(7, partial=True)["i"].tolist() == [1, 2, 5]
        b = q.take(7, partial=True)
        assert b["i"].tolist() == [1, 2, 5] and b["version"].tolist() == [2, 2, 2]
        stats = q.stats()
        assert (stats["rows_stale"], stats["rows_given_back"], stats["rows_taken"], len(q)) == (4, 3, 3, 0)
        with pytest.raises(shmbuf.SampleTimeout):
            q.take(1, timeout=0.05)


def test_snapshots_after_a_lag_limit_hold_no_stale_row(name, tmp_path):
    with queue(name) as q:
        fill(q, [1, 2, 3])
        q.take(2, min_version=2)
        state = q.state_dict()
        q.save(tmp_path / "save")
        with shmbuf.Buffer.load(tmp_path / "save", name=name + "-back") as back:
            assert back.take(6, partial=True)["x"].tolist() == [22, 23, 30, 31, 32, 33]
        with queue(name + "-state") as other:
            other.load_state_dict(state)
            assert other.take(6, partial=True)["x"].tolist() == [22, 23, 30, 31, 32, 33]


def test_bad_lag_limits_are_clear_errors_that_change_nothing(name):
    with queue(name) as q:
        fill(q, [1, 2])
        before = (len(q), q.stats()["rows_stale"], q.stats()["rows_taken"])
        for kw, msg in (({"max_staleness": -1}, "max_staleness must be an int >= 0, got -1"),
                        ({"max_staleness": 1.5}, "max_staleness must be an int >= 0"),
                        ({"min_version": 1, "max_staleness": 1}, "pass min_version= alone"),
                        ({"min_version": "2"}, "min_version must be an int >= 0")):
            with pytest.raises(ValueError, match=msg):
                q.take(1, **kw)
        assert (len(q), q.stats()["rows_stale"], q.stats()["rows_taken"]) == before
    with shmbuf.Buffer.create(X, 8, name=name + "-plain", mode="queue") as plain:
        plain.add({"x": 1})
        with pytest.raises(ValueError, match="are for a buffer created with versions=True"):
            plain.take(1, max_staleness=1)
        assert len(plain) == 1


def test_storm_takers_with_a_lag_limit_deliver_each_fresh_row_once(name, tmp_path):
    """Two writers write 400 rows each into a small queue (they wait for room): writer 1
    versions 100 and up, writer 0 versions 0 to 19; three takers take with
    min_version=100. Exactly writer 1's rows are delivered, each once, in its order,
    never torn; writer 0's 400 are counted stale: rows_taken == rows_stale == 400."""
    stop = str(tmp_path / "stop")
    logs = [str(tmp_path / f"t{i}.log") for i in range(3)]
    with queue(name, 64, lanes=2, fields=QUEUE_FIELDS) as q:
        writers = [CTX.Process(target=versioned_writer, args=(name, w, 400, 7, 20, 100 * w)) for w in range(2)]
        takers = [CTX.Process(target=lagged_taker, args=(name, log, stop, 16, 100)) for log in logs]
        for p in writers + takers:
            p.start()
        try:
            for p in writers:
                p.join(120)
                assert p.exitcode == 0
        finally:
            stop_and_join(takers, stop)
        assert all(p.exitcode == 0 for p in takers)
        stats = q.stats()
    entries = [(tag, v) for log in logs for tag, v in read_log(log)]
    delivered = np.concatenate([v for tag, v in entries if tag == "D"])
    assert sum(int(v.sum()) for tag, v in entries if tag == "X") == 0
    assert sorted(delivered.tolist()) == [1_000_000_000 + i for i in range(400)]
    assert all((v >= 100).all() for tag, v in entries if tag == "V")
    assert (stats["rows_taken"], stats["rows_stale"]) == (400, 400)


def test_rows_kept_after_a_sigint_that_are_stale_by_the_next_take_are_passed_over(name, monkeypatch):
    """Rows delivered to a take that a Ctrl-C interrupted are kept for this handle's next
    take; if that take has a lag limit they have fallen behind, they are passed over
    (counted stale, no longer taken), never returned. (The ragged queue storm found a
    bounded take returning such rows.)"""
    def sigint_after_delivery(where, rows):
        if where == "delivered":
            os.kill(os.getpid(), signal.SIGINT)

    with queue(name) as q:
        fill(q, [0, 0, 5])  # 4 rows each of versions 0, 0, 5
        monkeypatch.setattr(queue_protocol, "HOOK", sigint_after_delivery)
        with pytest.raises(KeyboardInterrupt):
            q.take(6)  # (versions 0: delivered, then interrupted: kept)
        monkeypatch.setattr(queue_protocol, "HOOK", None)
        assert q.stats()["rows_taken"] == 6
        b = q.take(64, partial=True, max_staleness=2)
        assert b["version"].tolist() == [5] * 4  # the 6 kept rows of version 0 passed over
        s = q.stats()
        assert (s["rows_taken"], s["rows_stale"]) == (4, 8)  # every row counted once: 4 + 8 of 12
